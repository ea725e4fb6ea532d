"""Structural checks on collected trajectories: what a well-formed spine episode looks like in the EventLog."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agenttune_lib.events import EventKind, EventLog
from agenttune_lib.spine.record import check_token_record

__all__ = ["episode_problems"]


def episode_problems(logs: Iterable[EventLog], require_full: bool = True) -> list[dict[str, Any]]:
    """Problems per log: tier, opening observation, one episode reward, closing TURN_COMPLETE, every call answered, a faithful token record."""
    problems: list[dict[str, Any]] = []
    for log in logs:
        def bad(msg: str) -> None:
            problems.append({"trajectory_id": log.id, "problem": msg})

        if require_full and log.tier != "full":
            bad(f"tier is {log.tier!r}, expected 'full'")
        if not len(log) or log[0].kind is not EventKind.OBSERVATION:
            bad("does not open with the task OBSERVATION")
        if not len(log) or log[-1].kind is not EventKind.TURN_COMPLETE:
            bad("does not close with TURN_COMPLETE")
        if len(log.rewards("episode")) > 1:
            bad(f"{len(log.rewards('episode'))} episode rewards")
        calls = [e.payload.get("id") for e in log if e.kind is EventKind.TOOL_CALL]
        answered = {e.payload.get("id") for e in log if e.kind is EventKind.TOOL_RESULT}
        missing = [c for c in calls if c not in answered]
        if missing:
            bad(f"tool calls without a result: {missing}")
        if require_full and log.tier == "full":
            agent = [e for e in log if e.kind in (EventKind.TEXT, EventKind.TOOL_CALL) and e.token_span is not None]
            if not agent:
                bad("full tier but no agent event carries a token span")
        for problem in check_token_record(log):
            bad(f"token record: {problem}")
    return problems
