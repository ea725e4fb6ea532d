"""The EventLog, the one trajectory contract every stage reads and writes: standard library only.

Six projections (paper Table 2) move a trajectory in and out, copying out and never rewriting their source; the SFT
loss mask is defined here alone. Columnar paths live in ``agenttune_lib.warehouse``, tokens in ``models.chat_tokens``,
the readers of foreign shapes (rollouts, DECIDE state, evaluator dicts) in ``agenttune_lib.trajectory_formats``.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from agenttune_lib import trajectory_formats

__all__ = ["EventKind", "Event", "EventLog", "EventLogError", "REWARD_SCOPES", "TIERS", "SEGMENT_WEIGHTS",
           "SEGMENT_ROLES", "AGENT_KINDS", "fold_tool_stage", "render_tool_call"]


class EventKind(str, enum.Enum):
    """The eight event kinds of paper Table 13."""

    TEXT = "text"
    REASONING = "reasoning"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    OBSERVATION = "observation"
    TURN_COMPLETE = "turn_complete"
    REWARD = "reward"
    MEMORY_OP = "memory_op"

    @classmethod
    def parse(cls, value: Any) -> "EventKind":
        """Accept an EventKind, its value ("tool_call") or its name ("TOOL_CALL")."""
        for kind in cls:
            if value is kind or isinstance(value, str) and (value == kind.value or value == kind.name):
                return kind
        raise ValueError(f"unknown event kind {value!r}; expected one of {[k.value for k in cls]}")


REWARD_SCOPES: tuple[str, ...] = ("step", "turn", "episode")
TIERS: tuple[str, ...] = ("light", "full")
#: Events the agent itself generates: the only spans a trainer computes loss on.
AGENT_KINDS: frozenset[EventKind] = frozenset({EventKind.TEXT, EventKind.REASONING, EventKind.TOOL_CALL})
#: Segment weight (paper Table 3) and chat role per kind for the SFT projection; MEMORY_OP is weight-0 context, not dropped.
SEGMENT_WEIGHTS: dict[EventKind, float] = {
    EventKind.REASONING: 1.0, EventKind.TEXT: 1.0, EventKind.TOOL_CALL: 2.0,
    EventKind.TOOL_RESULT: 0.0, EventKind.OBSERVATION: 0.0, EventKind.MEMORY_OP: 0.0}
SEGMENT_ROLES: dict[EventKind, str] = {
    EventKind.REASONING: "assistant", EventKind.TEXT: "assistant", EventKind.TOOL_CALL: "assistant",
    EventKind.TOOL_RESULT: "tool", EventKind.OBSERVATION: "user", EventKind.MEMORY_OP: "user"}
_KIND_VALUE = {k: k.value for k in EventKind}  # ``kind.value`` is an enum property lookup, paid per event
_SORTED_JSON = json.JSONEncoder(sort_keys=True).encode
_STAGE_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
#: Payload keys whose first present one is the message text (else ""); other kinds: text, content, observation, else all.
_CONTENT_KEYS = {EventKind.TOOL_RESULT: ("content", "output", "result"), EventKind.MEMORY_OP: ("content", "items")}


class EventLogError(ValueError):
    """Invalid event or log; the message names the event's index where there is one."""


def _json_value(value: Any, where: str) -> Any:
    """A copy of ``value`` that comes back unchanged from JSON (json.dumps alone accepts int keys and tuples)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, dict):  # first: the usual payload value
        return {key if isinstance(key, str) else _bad_key(key, where): _json_value(item, f"{where}.{key}")
                for key, item in value.items()}
    if isinstance(value, list):
        return [_json_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, int) and -(2**63) <= value < 2**64 or isinstance(value, float) and math.isfinite(value):
        return value
    raise EventLogError(where + (
        f" is an integer beyond 64 bits ({value}); JSON readers return it as a float, so store it as a string"
        if isinstance(value, int) else f" is {value!r}, which JSON cannot hold" if isinstance(value, float) else
        " is a tuple: JSON gives back a list, so it would not round-trip (pass a list)" if isinstance(value, tuple) else
        f" holds a {type(value).__name__}, which is not JSON"))


def _bad_key(key: Any, where: str) -> Any:
    raise EventLogError(f"{where} has a {type(key).__name__} key {key!r}: JSON turns keys into strings, so it would "
                        "not round-trip")


def _copy_out(value: Any) -> Any:
    """The caller's own deep copy of a JSON value (payload, argument, error): dicts and lists copied, scalars kept."""
    if isinstance(value, dict):
        return {k: (_copy_out(v) if type(v) in (dict, list) else v) for k, v in value.items()}
    if isinstance(value, list):
        return [(_copy_out(v) if type(v) in (dict, list) else v) for v in value]
    return value


def _tool_name_args(payload: Mapping[str, Any]) -> tuple[str, Any]:
    name = payload["name"] if "name" in payload else payload.get("tool", "")
    return str(name), (payload["arguments"] if "arguments" in payload else payload.get("args", {}))


def _error_of(payload: Mapping[str, Any]) -> Any:
    """A TOOL_RESULT's structured ``error``, or None where it has none (missing, None, "" or False)."""
    error = payload.get("error")
    return None if error in (None, "", False) else error


def fold_tool_stage(name: str, arguments: Any) -> str:
    """One stage name for a tool call: its name and its sorted-JSON arguments."""
    return f"{name}({_STAGE_JSON(arguments)})"


def render_tool_call(payload: Mapping[str, Any]) -> str:
    """The assistant text of a TOOL_CALL: ``<tool_call>{json}</tool_call>``."""
    name, args = _tool_name_args(payload)
    return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {_SORTED_JSON(args)}}}</tool_call>'


def _event_content(kind: EventKind, payload: Mapping[str, Any]) -> str:
    """Message text of one event in the SFT projection."""
    if kind is EventKind.TOOL_CALL:
        return render_tool_call(payload)
    if kind is EventKind.TOOL_RESULT and payload.get("error") not in (None, ""):
        return json.dumps({"error": payload["error"]}, sort_keys=True, default=str)
    key = next((k for k in _CONTENT_KEYS.get(kind, ("text", "content", "observation")) if k in payload), None)
    content = payload[key] if key is not None else ("" if kind in _CONTENT_KEYS else dict(payload))
    text = content if isinstance(content, str) else _SORTED_JSON(content)
    return f"<memory op=\"{payload.get('op', 'memory')}\">{text}</memory>" if kind is EventKind.MEMORY_OP else text


@dataclasses.dataclass(frozen=True)
class Event:
    """One immutable trajectory step, payload a validated copy; ``scope`` on REWARD only, spans and logprobs: full tier."""

    kind: EventKind
    payload: dict[str, Any] = dataclasses.field(default_factory=dict)
    token_span: tuple[int, int] | None = None
    logprobs: tuple[float, ...] | None = None
    scope: str | None = None
    author: str | None = None

    def __post_init__(self) -> None:
        kind, payload, span, logprobs = EventKind.parse(self.kind), self.payload, self.token_span, self.logprobs
        if not isinstance(payload, Mapping):
            raise EventLogError(f"payload must be a mapping, got {type(payload).__name__}")
        payload = _json_value(dict(payload), "payload")
        if kind is EventKind.REWARD:
            if self.scope not in REWARD_SCOPES:
                raise EventLogError(f"REWARD needs scope in {REWARD_SCOPES}, got {self.scope!r}")
            value = payload.get("value")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise EventLogError(f"REWARD payload needs a finite numeric 'value', got {value!r}")
        elif self.scope is not None:
            raise EventLogError(f"scope is meaningful for REWARD only; {kind.name} got scope={self.scope!r}")
        if span is not None:
            span = tuple(span)
            if not (len(span) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in span)
                    and 0 <= span[0] <= span[1]):
                raise EventLogError(f"token_span must be (start, end) with 0 <= start <= end, got {self.token_span!r}")
            span = (int(span[0]), int(span[1]))
        if logprobs is not None:
            logprobs = tuple(float(x) for x in logprobs)
            if span is not None and len(logprobs) != span[1] - span[0]:
                raise EventLogError(f"logprobs has {len(logprobs)} values for a token span of {span[1] - span[0]}")
        if self.author is not None and not isinstance(self.author, str):
            raise EventLogError(f"author must be a string, got {type(self.author).__name__}")
        for name, value in (("kind", kind), ("payload", payload), ("token_span", span), ("logprobs", logprobs)):
            object.__setattr__(self, name, value)

    def replace(self, **changes: Any) -> "Event":
        """A new Event with ``changes`` applied, validated like any other (``dataclasses.replace``)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"Event has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)
    _replace = replace  # the namedtuple spelling, kept for callers that use it

    @property
    def is_error(self) -> bool:
        """A TOOL_RESULT whose payload carries a structured ``error``."""
        return self.kind is EventKind.TOOL_RESULT and _error_of(self.payload) is not None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "payload": _copy_out(self.payload),
                "token_span": list(self.token_span) if self.token_span is not None else None,
                "logprobs": list(self.logprobs) if self.logprobs is not None else None,
                "scope": self.scope, "author": self.author}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Event":
        span = data.get("token_span")
        return cls(kind=data["kind"], payload=data.get("payload") or {}, token_span=None if span is None else tuple(span),
                   logprobs=data.get("logprobs"), scope=data.get("scope"), author=data.get("author"))


class EventLog:
    """An ordered, validated sequence of Events with a tier; a full-tier log has spans over ``token_ids``."""

    def __init__(self, events: Iterable[Event | Mapping[str, Any]] = (), tier: str = "light", id: str | None = None,
                 metadata: Mapping[str, Any] | None = None, token_ids: Sequence[int] | None = None) -> None:
        if tier not in TIERS:
            raise ValueError(f"tier must be one of {TIERS}, got {tier!r}")
        self.tier, self.id = tier, id or uuid.uuid4().hex
        self.metadata: dict[str, Any] = _json_value(dict(metadata or {}), "metadata")
        self.token_ids: tuple[int, ...] | None = tuple(map(int, token_ids)) if token_ids is not None else None
        self._events: list[Event] = []
        self._span_end = 0  # end of the last token span: spans partition the sequence in order (paper §3.3.4)
        self.extend(events)

    def append(self, event: Event | Mapping[str, Any]) -> Event:
        """Validate and append one event; errors name the event's index."""
        index = len(self._events)
        if not isinstance(event, (Event, Mapping)):
            raise EventLogError(f"event {index}: expected an Event or a mapping, got {type(event).__name__}")
        try:
            event = event if isinstance(event, Event) else Event.from_dict(event)
        except (ValueError, TypeError, KeyError) as exc:
            raise EventLogError(f"event {index}: {exc}") from None
        span, ids = event.token_span, self.token_ids
        if span is not None and ids is not None and span[1] > len(ids):
            raise EventLogError(f"event {index}: token_span {span} is outside the sequence of {len(ids)} tokens")
        if span is not None and span[0] < self._span_end:
            raise EventLogError(f"event {index}: token_span {span} overlaps or precedes the previous span ending at "
                                f"{self._span_end}; spans must be in order and disjoint (each token carries one weight)")
        self._span_end = self._span_end if span is None else span[1]
        self._events.append(event)
        return event

    def extend(self, events: Iterable[Event | Mapping[str, Any]]) -> None:
        for event in events:
            self.append(event)

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(tuple(self._events))

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, index: int) -> Event:
        return self._events[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EventLog):
            return NotImplemented
        return (self.id, self.tier, self._events, self.metadata, self.token_ids) == (
            other.id, other.tier, other._events, other.metadata, other.token_ids)

    def __repr__(self) -> str:
        return f"EventLog(id={self.id!r}, tier={self.tier!r}, events={len(self)})"

    def filter(self, *kinds: EventKind | str) -> list[Event]:
        wanted = {EventKind.parse(k) for k in kinds}
        return [e for e in self._events if e.kind in wanted]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tier": self.tier, "metadata": _copy_out(self.metadata),
                "token_ids": list(self.token_ids) if self.token_ids is not None else None,
                "events": [e.to_dict() for e in self._events]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EventLog":
        return cls(data.get("events", ()), tier=data.get("tier", "light"), id=data.get("id"), metadata=data.get("metadata"),
                   token_ids=data.get("token_ids"))

    def to_json(self) -> str:
        return _SORTED_JSON(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "EventLog":
        return cls.from_dict(json.loads(text))

    def rewards(self, scope: str | None = None) -> list[float]:
        """Reward values in order; only those of ``scope`` when given."""
        if scope is not None and scope not in REWARD_SCOPES:
            raise ValueError(f"scope must be one of {REWARD_SCOPES}, got {scope!r}")
        return [float(e.payload["value"]) for e in self._events
                if e.kind is EventKind.REWARD and (scope is None or e.scope == scope)]

    def _require_full(self, op: str) -> None:
        if self.tier != "full":
            raise ValueError(f"{op} requires a full-tier EventLog; log {self.id!r} is {self.tier!r}")

    def masked_tokens(self) -> list[tuple[int, int]]:
        """Token spans the agent generated (TEXT, REASONING, TOOL_CALL): what loss is computed on."""
        self._require_full("masked_tokens()")
        return [e.token_span for e in self._events if e.kind in AGENT_KINDS and e.token_span is not None]

    def as_dataset_rows(self, fmt: str = "sft") -> list[dict[str, Any]]:
        """SFT rows: messages, segment_weights and ``loss_mask`` (True = excluded, paper Table 3), one weight per message."""
        if fmt != "sft":
            raise ValueError(f"unknown dataset format {fmt!r}; supported: 'sft'")
        self._require_full('as_dataset_rows("sft")')
        system, task = self.metadata.get("system_prompt"), self.metadata.get("task")
        messages = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
        if isinstance(task, str) and task and not (self._events and self._events[0].kind is EventKind.OBSERVATION):
            messages.append({"role": "user", "content": task})
        weights = [0.0] * len(messages)
        for kind, payload in ((e.kind, e.payload) for e in self._events if e.kind in SEGMENT_WEIGHTS):
            message = {"role": SEGMENT_ROLES[kind], "content": _event_content(kind, payload)}
            name = _tool_name_args(payload)[0] if kind is EventKind.TOOL_RESULT else ""
            messages.append({**message, "name": name} if name else message)
            weights.append(SEGMENT_WEIGHTS[kind])
        return [{"id": self.id, "messages": messages, "segment_weights": weights, "loss_mask": [w == 0.0 for w in weights]}]

    def to_eval_dict(self) -> dict[str, Any]:
        """The evaluator's view: ordered steps plus tool calls, outputs, errors and rewards (the caller's own copies)."""
        steps, tool_calls, tool_outputs, reasoning, rewards, final_answer = [], [], [], [], [], None
        for index, event in enumerate(self._events):
            kind, payload, (name, args) = event.kind, event.payload, _tool_name_args(event.payload)
            optional = {"scope": event.scope, "author": event.author}
            steps.append({"index": index, "kind": _KIND_VALUE[kind], "payload": _copy_out(payload),
                          **{k: v for k, v in optional.items() if v is not None}})
            if kind is EventKind.TOOL_CALL:
                tool_calls.append({"index": index, "name": name, "arguments": _copy_out(args),
                                   "id": _copy_out(payload.get("id"))})
            elif kind is EventKind.TOOL_RESULT:
                tool_outputs.append({"index": index, "name": name, "output": _event_content(kind, payload),
                                     "error": _copy_out(_error_of(payload)), "id": _copy_out(payload.get("id"))})
            elif kind is EventKind.REASONING:
                reasoning.append(_event_content(kind, payload))
            elif kind is EventKind.TEXT:
                final_answer = _event_content(kind, payload)
            elif kind is EventKind.REWARD:
                rewards.append({"value": float(payload["value"]), "scope": event.scope})
        meta = self.metadata
        return {"trajectory_id": self.id, "tier": self.tier, "task": _copy_out(meta.get("task")),
                "plan": _copy_out(meta.get("plan")), "metadata": _copy_out(meta), "steps": steps, "tool_calls": tool_calls,
                "tool_outputs": tool_outputs, "reasoning": reasoning, "final_answer": final_answer, "rewards": rewards}

    def to_audit_records(self) -> list[dict[str, Any]]:
        """The closed loop's view: a record per action (stage, state copies); results fold into their call's record."""
        records, by_id, pending = [], {}, []  # by_id: the latest open call per id; pending: every open call, oldest first
        for index, event in enumerate(self._events):
            kind, payload = event.kind, event.payload
            if kind in (EventKind.REWARD, EventKind.TURN_COMPLETE):
                continue
            record = kind is EventKind.TOOL_RESULT and (by_id.pop(payload.get("id"), None) or next(iter(pending), None))
            if record:  # a result folds into the open call with its id, else into the oldest open call
                pending.remove(record)  # records differ in ``seq``, so equality finds this very one
                by_id.pop(record["state"].get("id"), None)
                record["state"]["result"] = _copy_out(payload)
            else:
                record = {"trajectory_id": self.id, "seq": index, "kind": _KIND_VALUE[kind],
                          "stage": self._stage_name(event), "status": "ok", "author": event.author,
                          "state": _copy_out(payload)}
                records.append(record)
                if kind is EventKind.TOOL_CALL:
                    pending.append(record)
                    if payload.get("id") is not None:
                        by_id[payload["id"]] = record
            if kind is EventKind.TOOL_RESULT and _error_of(payload) is not None:
                record.update(status="error", error=_copy_out(_error_of(payload)))
        return records

    @staticmethod
    def _stage_name(event: Event) -> str:
        if "stage_id" in event.payload and event.kind is not EventKind.TOOL_CALL:
            return str(event.payload["stage_id"])
        if event.kind in (EventKind.TOOL_CALL, EventKind.TOOL_RESULT):
            return fold_tool_stage(*_tool_name_args(event.payload))
        return _KIND_VALUE[event.kind]

    @classmethod
    def from_trajectory(cls, trajectory: Mapping[str, Any], id: str | None = None) -> "EventLog":
        """RL rollout (prompt_ids, completion_ids, logprobs, segments with spans, reward or rewards) -> full-tier log."""
        events, kwargs = trajectory_formats.read_trajectory(sys.modules[__name__], trajectory, id)
        return cls(events, **kwargs)

    @classmethod
    def from_pipeline_state(cls, state: Any, id: str | None = None) -> "EventLog":
        """DECIDE pipeline state (``input_text``, ``step_history``, ``verdict``) -> light-tier log."""
        events, kwargs = trajectory_formats.read_pipeline_state(sys.modules[__name__], state, id)
        return cls(events, **kwargs)

    @classmethod
    def from_eval_dict(cls, eval_dict: Mapping[str, Any], id: str | None = None) -> "EventLog":
        """Evaluator dict -> light-tier log: its ``steps``, else tool calls and outputs interleaved, then the answer."""
        events, kwargs = trajectory_formats.read_eval_dict(sys.modules[__name__], eval_dict, id)
        return cls(events, **kwargs)
