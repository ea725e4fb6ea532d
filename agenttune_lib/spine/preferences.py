"""Preference pairs from what a search or a retry rejected — only where chosen and rejected share one context.

A pair is a chosen and a rejected continuation generated from the same chat context: a
tree-of-thoughts branch point the kept path passed through. Each rejected branch is its own
EventLog (``spine.record.rejected_logs``); a pair is emitted only when the kept log and the
branch log rebuild the identical context at the branch point, and (when the turns recorded a
digest) that context is the one both completions were generated from.

Reflexion's successful attempt was generated with critiques in its prompt that its failed
attempts never saw, so it shares no context with them: ``preference_pairs`` emits no pair for
it. ``reflexion_hindsight_pairs`` builds the common hindsight-relabelled pairs explicitly,
marked ``same_context: False``.
"""
from __future__ import annotations

import json
from typing import Any

from agenttune_lib.events import EventKind, EventLog
from agenttune_lib.spine.prompts import messages_from_events
from agenttune_lib.spine.record import messages_digest, rejected_logs, turn_context

__all__ = ["preference_pairs", "reflexion_hindsight_pairs", "render_action"]


def render_action(action: dict[str, Any]) -> str:
    """The assistant text of an action summary (``Action.describe()``)."""
    from agenttune_lib.events import render_tool_call

    if action.get("kind") == "tool_call":
        return render_tool_call({"name": action.get("name"), "arguments": action.get("arguments") or {}})
    return str(action.get("text") or "")


def _turn_at(log: EventLog, prefix_len: int) -> dict[str, Any] | None:
    return next((t for t in log.metadata.get("turns") or [] if int(t["prefix_len"]) == prefix_len), None)


def _verified_context(log: EventLog, turn: dict[str, Any]) -> list[dict[str, str]] | None:
    """The context a turn was generated from, or None when the log cannot rebuild it exactly."""
    messages = turn_context(log, turn)
    recorded = turn.get("context_sha256")
    if recorded is not None and messages_digest(messages) != recorded:
        return None
    return messages


def preference_pairs(log: EventLog, conversational: bool = True) -> list[dict[str, Any]]:
    """Same-context chosen/rejected rows ``{prompt, chosen, rejected, source, trajectory_id, ...}`` (TRL DPO form).

    ``prompt`` is the chat both continuations were generated from; ``chosen``/``rejected``
    are each one assistant message holding the model's raw completion (plain strings with
    ``conversational=False``).
    """
    pairs: list[dict[str, Any]] = []
    for branch in rejected_logs(log):
        info = branch.metadata.get("branch") or {}
        if info.get("kind") == "reflexion":
            continue
        prefix = int(info.get("prefix_len", -1))
        chosen_turn, rejected_turn = _turn_at(log, prefix), _turn_at(branch, prefix)
        if chosen_turn is None or rejected_turn is None:
            continue
        chosen_ctx, rejected_ctx = _verified_context(log, chosen_turn), _verified_context(branch, rejected_turn)
        if chosen_ctx is None or rejected_ctx is None or chosen_ctx != rejected_ctx:
            continue  # the kept path never passed through this branch point
        chosen, rejected = chosen_turn.get("text", ""), rejected_turn.get("text", "")
        if not chosen or not rejected or chosen == rejected:
            continue
        pairs.append(
            {
                "prompt": chosen_ctx,
                "chosen": [{"role": "assistant", "content": chosen}] if conversational else chosen,
                "rejected": [{"role": "assistant", "content": rejected}] if conversational else rejected,
                "source": str(info.get("kind", "tree_of_thoughts")),
                "reason": info.get("reason"),
                "same_context": True,
                "context_sha256": messages_digest(chosen_ctx),
                "trajectory_id": log.id,
                "rejected_trajectory_id": branch.id,
            }
        )
    return pairs


def _continuation(log: EventLog, start: int) -> list[dict[str, str]]:
    """The agent's turns and the tool results from ``start`` on, as chat messages."""
    events = [e for e in log.events[start:] if e.kind is not EventKind.OBSERVATION]
    return messages_from_events(None, events, log.metadata.get("max_tool_chars"))


def reflexion_hindsight_pairs(log: EventLog) -> list[dict[str, Any]]:
    """Hindsight pairs for a successful Reflexion run: each failed attempt against the success, both multi-turn.

    The prompt is the failed attempt's own context (its system prompt and the task); the
    chosen continuation was generated with later critiques in its prompt, so these rows are
    marked ``same_context: False`` and are not returned by ``preference_pairs``.
    """
    info = log.metadata.get("reflexion") or {}
    if not info.get("succeeded"):
        return []
    chosen = _continuation(log, 1)
    out = []
    for attempt in rejected_logs(log):
        if (attempt.metadata.get("branch") or {}).get("kind") != "reflexion":
            continue
        prompt = messages_from_events(attempt.metadata.get("system_prompt"), attempt.events[:1])
        rejected = _continuation(attempt, 1)
        if json.dumps(rejected, sort_keys=True) == json.dumps(chosen, sort_keys=True):
            continue
        out.append(
            {
                "prompt": prompt,
                "chosen": chosen,
                "rejected": rejected,
                "source": "reflexion_hindsight",
                "same_context": False,
                "trajectory_id": log.id,
                "rejected_trajectory_id": attempt.id,
            }
        )
    return out
