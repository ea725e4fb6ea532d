"""The faithful per-turn record of a full-tier episode: exactly the token ids a model consumed and produced.

Every model turn is stored as a ``turn`` in the log's metadata: the index of the agent event
it produced, how many events of the log were its context (``prefix_len``), a digest of the
chat messages it was generated from, its raw completion text, and — when the model reported
tokens — ``prompt_span`` / ``completion_span`` over ``EventLog.token_ids``. The ids are taken
from the ``Generation`` the model returned, never re-rendered: a turn whose prompt extends the
previous turn's prompt+completion shares that prefix; any other prompt opens a new segment.
"""
from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from agenttune_lib.spine.state import Generation

__all__ = ["TokenRecord", "messages_digest", "turn_context", "check_token_record", "rejected_logs", "link_branches"]


def messages_digest(messages: Sequence[dict[str, Any]] | None) -> str | None:
    """Canonical SHA-256 of chat messages (what a turn was generated from)."""
    if messages is None:
        return None
    return hashlib.sha256(json.dumps(list(messages), sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class TokenRecord:
    """The growing token sequence of one episode and its per-turn spans."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.turns: list[dict[str, Any]] = []
        self._segment_start = 0

    def copy(self) -> "TokenRecord":
        out = TokenRecord()
        out.ids, out.turns, out._segment_start = list(self.ids), copy.deepcopy(self.turns), self._segment_start
        return out

    def state(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "turns": copy.deepcopy(self.turns), "segment_start": self._segment_start}

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> "TokenRecord":
        out = cls()
        out.ids, out.turns, out._segment_start = list(data["ids"]), copy.deepcopy(data["turns"]), int(data["segment_start"])
        return out

    def add(self, gen: Generation, prefix_len: int) -> tuple[dict[str, Any], tuple[int, int] | None, list[float] | None]:
        """Record one model turn; returns the turn, the completion span and its logprobs (None without tokens)."""
        turn: dict[str, Any] = {"prefix_len": int(prefix_len), "text": gen.text, "context_sha256": messages_digest(gen.messages)}
        if gen.messages and gen.messages[0].get("role") == "system":
            turn["system"] = gen.messages[0].get("content")
        if not gen.completion_ids and gen.prompt_ids is None:
            self.turns.append(turn)
            return turn, None, None
        if gen.prompt_ids is None:
            # Completion ids without the prompt they followed: record them, prompt unknown.
            self._segment_start = len(self.ids)
            turn["prompt_span"] = None
        else:
            prompt = [int(t) for t in gen.prompt_ids]
            segment = self.ids[self._segment_start :]
            if not (segment and prompt[: len(segment)] == segment):
                self._segment_start = len(self.ids)
                segment = []
            self.ids.extend(prompt[len(segment) :])
            turn["prompt_span"] = [self._segment_start, len(self.ids)]
        start = len(self.ids)
        self.ids.extend(int(t) for t in gen.completion_ids or ())
        turn["completion_span"] = [start, len(self.ids)]
        self.turns.append(turn)
        lps = [float(x) for x in gen.logprobs] if gen.logprobs is not None else None
        return turn, (start, len(self.ids)), lps


def turn_context(log: Any, turn: dict[str, Any]) -> list[dict[str, str]]:
    """The chat messages a recorded turn was generated from, rebuilt from the log's own events."""
    from agenttune_lib.spine.prompts import messages_from_events

    system = turn.get("system", log.metadata.get("system_prompt"))
    return messages_from_events(system, log.events[: int(turn["prefix_len"])], log.metadata.get("max_tool_chars"))


def check_token_record(log: Any, tokenizer: Any = None) -> list[str]:
    """Problems with a log's per-turn record (empty when faithful).

    Checks every turn's context rebuilds from the log (digest match), spans lie inside
    ``token_ids`` and the agent event's span and logprobs are the turn's completion; with a
    ``tokenizer``, that re-tokenizing the rebuilt context with its chat template gives exactly
    the recorded prompt ids.
    """
    problems: list[str] = []
    ids = list(log.token_ids or ())
    for i, turn in enumerate(log.metadata.get("turns") or []):
        messages = turn_context(log, turn)
        if turn.get("context_sha256") is not None and messages_digest(messages) != turn["context_sha256"]:
            problems.append(f"turn {i}: the log's first {turn['prefix_len']} events do not rebuild the messages the model saw")
        span = turn.get("completion_span")
        if span is None:
            continue
        if span[1] > len(ids):
            problems.append(f"turn {i}: completion_span {span} outside {len(ids)} token ids")
            continue
        event = log.events[turn["event"]] if turn.get("event") is not None and turn["event"] < len(log) else None
        if event is None or event.token_span != tuple(span):
            problems.append(f"turn {i}: agent event does not carry the completion span {span}")
        pspan = turn.get("prompt_span")
        if tokenizer is not None and pspan is not None:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            expected = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            if ids[pspan[0] : pspan[1]] != expected:
                problems.append(f"turn {i}: recorded prompt ids differ from the re-tokenized context")
    return problems


def rejected_logs(log: Any) -> list[Any]:
    """The rejected branches of an episode (tree-of-thoughts dead ends, Reflexion failed attempts) as EventLogs."""
    from agenttune_lib.events import EventLog

    out = []
    for entry in log.metadata.get("rejected_branches") or []:
        if entry.get("log"):
            out.append(EventLog.from_dict(entry["log"]))
    for attempt in log.metadata.get("rejected_attempts") or []:
        out.append(EventLog.from_dict(attempt))
    return out


def link_branches(log: Any) -> Any:
    """Point every rejected branch stored on an episode log back at it (``branch_of``); returns the log."""
    for entry in log.metadata.get("rejected_branches") or []:
        if entry.get("log"):
            entry["log"].setdefault("metadata", {})["branch_of"] = log.id
    for attempt in log.metadata.get("rejected_attempts") or []:
        attempt.setdefault("metadata", {})["branch_of"] = log.id
    return log
