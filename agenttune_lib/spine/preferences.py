"""Preference pairs from what a search or a retry rejected: ToT's abandoned branches and Reflexion's failed attempts."""
from __future__ import annotations

import json
from typing import Any

from agenttune_lib.events import Event, EventKind, EventLog, render_tool_call
from agenttune_lib.spine.prompts import messages_from_events

__all__ = ["preference_pairs", "render_action"]


def render_action(action: dict[str, Any]) -> str:
    """The assistant text of an action summary (``Action.describe()``)."""
    if action.get("kind") == "tool_call":
        return render_tool_call({"name": action.get("name"), "arguments": action.get("arguments") or {}})
    return str(action.get("text") or "")


def _assistant_text(events: Any) -> str:
    parts = []
    for e in events:
        if e.kind is EventKind.TOOL_CALL:
            parts.append(render_tool_call(e.payload))
        elif e.kind in (EventKind.TEXT, EventKind.REASONING):
            content = e.payload.get("content", "")
            parts.append(content if isinstance(content, str) else json.dumps(content))
    return "\n".join(parts)


def _prompt(log: EventLog, prefix_len: int) -> list[dict[str, str]]:
    return messages_from_events(log.metadata.get("system_prompt"), log.events[:prefix_len])


def preference_pairs(log: EventLog, conversational: bool = True) -> list[dict[str, Any]]:
    """Chosen/rejected rows ``{prompt, chosen, rejected, source, trajectory_id}`` in TRL DPO's conversational form.

    ``prompt`` is the chat up to the branch point; ``chosen``/``rejected`` are one assistant
    message each (plain strings with ``conversational=False``).
    ToT: at each branch point, the chosen action against each rejected or backtracked one.
    Reflexion: when the final attempt succeeded, its actions against each failed attempt's.
    """
    pairs = _pairs(log)
    if conversational:
        for pair in pairs:
            pair["chosen"] = [{"role": "assistant", "content": pair["chosen"]}]
            pair["rejected"] = [{"role": "assistant", "content": pair["rejected"]}]
    return pairs


def _pairs(log: EventLog) -> list[dict[str, Any]]:
    pairs: list[dict[str, Any]] = []
    chosen_at: dict[int, str] = {}
    for branch in log.metadata.get("rejected_branches") or []:
        prefix = int(branch.get("prefix_len", 0))
        chosen = branch.get("chosen")
        if chosen is None:
            # A backtracked branch: the action the kept path took at this point is the chosen one.
            if prefix not in chosen_at:
                nxt = next((e for e in log.events[prefix:] if e.kind in (EventKind.TOOL_CALL, EventKind.TEXT)), None)
                chosen_at[prefix] = _assistant_text([nxt]) if nxt is not None else ""
            chosen_text = chosen_at[prefix]
        else:
            chosen_text = render_action(chosen)
        rejected_text = render_action(branch.get("rejected") or {})
        if chosen_text and rejected_text and chosen_text != rejected_text:
            pairs.append(
                {"prompt": _prompt(log, prefix), "chosen": chosen_text, "rejected": rejected_text, "source": "tree_of_thoughts", "trajectory_id": log.id}
            )
    info = log.metadata.get("reflexion") or {}
    attempts = log.metadata.get("rejected_attempts") or []
    if attempts and info.get("succeeded"):
        first_agent = next((i for i, e in enumerate(log.events) if e.kind in (EventKind.TOOL_CALL, EventKind.TEXT, EventKind.REASONING)), len(log))
        prompt = _prompt(log, first_agent)
        chosen_text = _assistant_text(log.events)
        for attempt in attempts:
            failed = EventLog.from_dict(attempt)
            rejected_text = _assistant_text(failed.events)
            if rejected_text != chosen_text:
                pairs.append({"prompt": prompt, "chosen": chosen_text, "rejected": rejected_text, "source": "reflexion", "trajectory_id": log.id})
    return pairs
