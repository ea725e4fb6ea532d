"""The EventLog: the one trajectory contract every stage of AgentTune reads and writes.

Standard library only. An EventLog is an ordered list of Events plus a tier; six
projections (paper Table 2) move a trajectory in and out of the schema. The loss
mask for supervised training is defined here and nowhere else.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import json
import math
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson

__all__ = [
    "EventKind",
    "Event",
    "EventLog",
    "EventLogError",
    "REWARD_SCOPES",
    "TIERS",
    "SEGMENT_WEIGHTS",
    "SEGMENT_ROLES",
    "AGENT_KINDS",
    "fold_tool_stage",
    "render_tool_call",
]


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
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for kind in cls:
                if value == kind.value or value == kind.name:
                    return kind
        raise ValueError(
            f"unknown event kind {value!r}; expected one of {[k.value for k in cls]}"
        )


REWARD_SCOPES: tuple[str, ...] = ("step", "turn", "episode")
TIERS: tuple[str, ...] = ("light", "full")

#: Events the agent itself generates: the only spans a trainer computes loss on.
AGENT_KINDS: frozenset[EventKind] = frozenset(
    {EventKind.TEXT, EventKind.REASONING, EventKind.TOOL_CALL}
)

#: Segment weight per kind for the SFT projection (paper Table 3). MEMORY_OP enters
#: as weight-0 context instead of being dropped, so memory operations reach training.
SEGMENT_WEIGHTS: dict[EventKind, float] = {
    EventKind.REASONING: 1.0,
    EventKind.TEXT: 1.0,
    EventKind.TOOL_CALL: 2.0,
    EventKind.TOOL_RESULT: 0.0,
    EventKind.OBSERVATION: 0.0,
    EventKind.MEMORY_OP: 0.0,
}

#: Chat role per kind for the SFT projection.
SEGMENT_ROLES: dict[EventKind, str] = {
    EventKind.REASONING: "assistant",
    EventKind.TEXT: "assistant",
    EventKind.TOOL_CALL: "assistant",
    EventKind.TOOL_RESULT: "tool",
    EventKind.OBSERVATION: "user",
    EventKind.MEMORY_OP: "user",
}


class EventLogError(ValueError):
    """Invalid event or log; the message names the event's index where there is one."""


# orjson raises for what it would not serialize as plain JSON (str/int/dict/list subclasses, dataclasses,
# datetimes, non-str keys, integers beyond 64 bits, lone surrogates); the Python walker judges those.
_ORJSON_STRICT = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS
_dumps, _loads = orjson.dumps, orjson.loads


def _json_value(value: Any, where: str) -> Any:
    """A copy of ``value`` that round-trips through JSON unchanged, else an EventLogError naming where.

    ``json.dumps`` accepts more than it gives back (int keys come back as strings, tuples as lists),
    so a payload that passed it could differ after the warehouse round trip; this rejects those.

    Fast path in C: dump and reload with orjson; when the reloaded value equals the input (a tuple comes
    back a list, NaN and infinities come back None, so those differ) the reloaded value is the copy, and
    being the round trip's own output it is exactly what the warehouse will give back. Anything else goes
    to the walker, which accepts or rejects exactly as before and words the error.
    """
    try:
        out = _loads(_dumps(value, option=_ORJSON_STRICT))
        if out == value:
            return out
    except Exception:  # noqa: BLE001 - anything orjson or a custom __eq__ refuses is the walker's to judge
        pass
    return _json_walk(value, where)


def _json_walk(value: Any, where: str) -> Any:
    """The reference walker behind :func:`_json_value`: a copy, or an EventLogError naming the first bad path."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise EventLogError(f"{where} is an integer beyond 64 bits ({value}); JSON readers return it as a float, so store it as a string")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EventLogError(f"{where} is {value!r}, which JSON cannot hold")
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise EventLogError(
                    f"{where} has a {type(key).__name__} key {key!r}: JSON turns keys into strings, so it would not round-trip"
                )
            out[key] = _json_walk(item, f"{where}.{key}")
        return out
    if isinstance(value, list):
        return [_json_walk(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, tuple):
        raise EventLogError(f"{where} is a tuple: JSON gives back a list, so it would not round-trip (pass a list)")
    raise EventLogError(f"{where} holds a {type(value).__name__}, which is not JSON")


def _check_json(payload: Any, where: str) -> None:
    """Raise an EventLogError unless ``payload`` round-trips through JSON unchanged."""
    _json_value(payload, where)


def _copy_json(value: Any) -> Any:
    """A deep copy of an already validated JSON value (only dicts and lists are copied; scalars are immutable)."""
    if type(value) is dict:
        return {k: (_copy_json(v) if type(v) in _CONTAINERS else v) for k, v in value.items()}
    if type(value) is list:
        return [(_copy_json(v) if type(v) in _CONTAINERS else v) for v in value]
    if isinstance(value, (dict, list)):
        return _copy_json(dict(value) if isinstance(value, dict) else list(value))
    return value


_CONTAINERS = (dict, list)


def _copy_out(value: Any) -> Any:
    """A private deep copy of ``value`` (a list of what a projection hands out), made in one C call.

    orjson dumps and reloads it: one call per log instead of a Python deep copy per payload. A value orjson
    would not give back unchanged (something a caller put into a payload after validation, a lone surrogate)
    takes the Python copy instead.
    """
    try:
        return _loads(_dumps(value, option=_ORJSON_STRICT))
    except Exception:  # noqa: BLE001 - anything orjson refuses is copied the slow way
        return _copy_json(value)


def _own(value: Any) -> Any:
    """``value`` itself when immutable (the usual str, number or None), else a private deep copy."""
    return _copy_json(value) if isinstance(value, (dict, list)) else value


def _json_encoder(**options: Any) -> Any:
    """``json.dumps(x, **options)`` as one C call: the same C encoder json builds, built once instead of per call.

    ``json.dumps`` with any option constructs a JSONEncoder and then a C encoder on every call, which cost
    more than the encoding in the projections (a stage name per tool call). Output is identical: it is
    json's own encoder; anything it raises on (a cycle someone put into a payload) goes to json.dumps.
    """
    enc = json.JSONEncoder(**options)
    slow = enc.encode
    try:
        from json.encoder import c_make_encoder, encode_basestring_ascii

        fast = c_make_encoder(None, enc.default, encode_basestring_ascii, None, enc.key_separator, enc.item_separator,
                              enc.sort_keys, enc.skipkeys, enc.allow_nan)
    except (ImportError, TypeError):  # no C accelerator: the ordinary encoder
        return slow

    def encode(value: Any) -> str:
        if type(value) is str:
            return encode_basestring_ascii(value)
        try:
            return "".join(fast(value, 0))
        except Exception:  # noqa: BLE001 - json.dumps words the error (or copes, e.g. with a cycle check)
            return slow(value)

    return encode


_SORTED_JSON = _json_encoder(sort_keys=True)
_SORTED_JSON_STR = _json_encoder(sort_keys=True, default=str)
_STAGE_JSON = _json_encoder(sort_keys=True, separators=(",", ":"))
_PLAIN_JSON = _json_encoder()
_KIND_VALUE = {k: k.value for k in EventKind}
_LONG_DIGITS = re.compile(r"[0-9]{19}")  # the shortest run of digits that can spell an integer beyond 64 bits


# Module-level kinds: ``EventKind.X`` is a lookup through the enum's metaclass, paid per event in a projection.
_TOOL_CALL, _TOOL_RESULT, _MEMORY_OP = EventKind.TOOL_CALL, EventKind.TOOL_RESULT, EventKind.MEMORY_OP


def _tool_name_args(payload: Mapping[str, Any]) -> tuple[str, Any]:
    # payload.get("name", payload.get("tool", "")) without evaluating the fallback every time
    name = payload["name"] if "name" in payload else payload.get("tool", "")
    args = payload["arguments"] if "arguments" in payload else payload.get("args", {})
    return (name if type(name) is str else str(name)), args


def fold_tool_stage(name: str, arguments: Any) -> str:
    """One stage name for a tool call: its name and its sorted-JSON arguments."""
    return f"{name}({_STAGE_JSON(arguments)})"


def render_tool_call(payload: Mapping[str, Any]) -> str:
    """The assistant text of a TOOL_CALL: ``<tool_call>{json}</tool_call>``."""
    name, args = _tool_name_args(payload)
    body = '{"name": %s, "arguments": %s}' % (_PLAIN_JSON(name), _SORTED_JSON(args))
    return f"<tool_call>{body}</tool_call>"


def _event_content(kind: EventKind, payload: Mapping[str, Any]) -> str:
    """Message text of one event in the SFT projection."""
    if kind is _TOOL_CALL:
        return render_tool_call(payload)
    if kind is _TOOL_RESULT:
        if "error" in payload and payload.get("error") not in (None, ""):
            return _SORTED_JSON_STR({"error": payload["error"]})
        content = payload.get("content", payload.get("output", payload.get("result", "")))
        return content if isinstance(content, str) else _SORTED_JSON(content)
    if kind is _MEMORY_OP:
        op = payload.get("op", "memory")
        content = payload.get("content", payload.get("items", ""))
        text = content if isinstance(content, str) else _SORTED_JSON(content)
        return f"<memory op=\"{op}\">{text}</memory>"
    if "text" in payload:
        value = payload["text"]
    elif "content" in payload:
        value = payload["content"]
    elif "observation" in payload:
        value = payload["observation"]
    else:
        return _SORTED_JSON(dict(payload))
    return value if isinstance(value, str) else _SORTED_JSON(value)


_NO_PAYLOAD: Any = object()
_EK = EventKind
_REWARD = EventKind.REWARD


_EventFields = collections.namedtuple("_EventFields", ("kind", "payload", "token_span", "logprobs", "scope", "author"))
_tuple_new = tuple.__new__


class Event(_EventFields):
    """One step of a trajectory: an immutable value.

    ``scope`` is meaningful for REWARD only (step, turn or episode) and must be None
    elsewhere; ``author`` names the agent that produced the event in multi-agent logs.
    ``token_span`` is ``(start, end)`` over the log's token sequence (full tier).
    The payload is the Event's own validated copy of the mapping it was given.

    A tuple underneath (fields read by C-level getters, built in one C call) rather than a frozen
    dataclass, whose per-field ``object.__setattr__`` cost more than the checks: the warehouse
    rebuilds tens of thousands of stored Events per read.
    """

    __slots__ = ()

    def __new__(
        cls,
        kind: EventKind | str,
        payload: Mapping[str, Any] = _NO_PAYLOAD,
        token_span: Sequence[int] | None = None,
        logprobs: Sequence[float] | None = None,
        scope: str | None = None,
        author: str | None = None,
    ) -> "Event":
        if type(kind) is not _EK:
            kind = _EK.parse(kind)
        if payload is _NO_PAYLOAD:
            payload = {}
        elif type(payload) is not dict:
            if not isinstance(payload, Mapping):
                raise EventLogError(f"payload must be a mapping, got {type(payload).__name__}")
            payload = dict(payload)
        try:  # _json_value's C fast path, inlined: one call less per event
            checked = _loads(_dumps(payload, option=_ORJSON_STRICT))
            payload = checked if checked == payload else _json_walk(payload, "payload")
        except EventLogError:
            raise
        except Exception:  # noqa: BLE001 - anything orjson refuses is the walker's to judge
            payload = _json_walk(payload, "payload")
        if kind is _REWARD:
            if scope not in REWARD_SCOPES:
                raise EventLogError(
                    f"REWARD needs scope in {REWARD_SCOPES}, got {scope!r}"
                )
            value = payload.get("value")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise EventLogError(f"REWARD payload needs a finite numeric 'value', got {value!r}")
        elif scope is not None:
            raise EventLogError(
                f"scope is meaningful for REWARD only; {kind.name} got scope={scope!r}"
            )
        if type(token_span) is tuple and len(token_span) == 2 and type(token_span[0]) is int and type(token_span[1]) is int \
                and 0 <= token_span[0] <= token_span[1]:
            pass  # the common case, checked without building a new tuple
        elif token_span is not None:
            span = tuple(token_span)
            if (
                len(span) != 2
                or not (type(span[0]) is int or (isinstance(span[0], int) and not isinstance(span[0], bool)))
                or not (type(span[1]) is int or (isinstance(span[1], int) and not isinstance(span[1], bool)))
                or span[0] < 0
                or span[1] < span[0]
            ):
                raise EventLogError(f"token_span must be (start, end) with 0 <= start <= end, got {token_span!r}")
            token_span = (int(span[0]), int(span[1]))
        if logprobs is not None:
            lps = tuple(float(x) for x in logprobs)
            if token_span is not None and len(lps) != token_span[1] - token_span[0]:
                raise EventLogError(
                    f"logprobs has {len(lps)} values for a token span of {token_span[1] - token_span[0]}"
                )
            logprobs = lps
        if author is not None and not isinstance(author, str):
            raise EventLogError(f"author must be a string, got {type(author).__name__}")
        return _tuple_new(cls, (kind, payload, token_span, logprobs, scope, author))

    @classmethod
    def _trusted(cls, kind: "EventKind", payload: dict[str, Any], token_span: tuple[int, int] | None,
                 logprobs: Sequence[float] | None, scope: str | None, author: str | None) -> "Event":
        """An Event from fields that already passed validation (rows the warehouse stored): no re-check, no copy."""
        return _tuple_new(cls, (kind, payload, token_span, tuple(logprobs) if logprobs is not None else None, scope, author))

    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> "Event":
        """An Event from its six fields in order, validated (namedtuple's own ``_make`` would skip the checks)."""
        return cls(*iterable)

    def _replace(self, **changes: Any) -> "Event":
        """A new Event with ``changes`` applied, validated like any other (``dataclasses.replace`` for an Event)."""
        fields = self._asdict()
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"Event has no field(s) {sorted(unknown)}")
        fields.update(changes)
        return Event(**fields)

    replace = _replace

    def __eq__(self, other: object) -> bool:  # an Event equals only an Event: not the plain tuple of its fields
        if not isinstance(other, Event):
            return False if isinstance(other, tuple) else NotImplemented
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return True if isinstance(other, tuple) else NotImplemented
        return tuple.__ne__(self, other)

    __hash__ = tuple.__hash__

    def __getnewargs__(self) -> tuple[Any, ...]:  # pickle and copy rebuild through __new__, validated
        return tuple(self)

    @property
    def is_error(self) -> bool:
        """A TOOL_RESULT whose payload carries a structured ``error``."""
        return self.kind is EventKind.TOOL_RESULT and self.payload.get("error") not in (None, "", False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": _KIND_VALUE[self.kind],
            "payload": _copy_json(self.payload),
            "token_span": list(self.token_span) if self.token_span is not None else None,
            "logprobs": list(self.logprobs) if self.logprobs is not None else None,
            "scope": self.scope,
            "author": self.author,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Event":
        return cls(
            kind=data["kind"],
            payload=data.get("payload") or {},
            token_span=tuple(data["token_span"]) if data.get("token_span") is not None else None,
            logprobs=data.get("logprobs"),
            scope=data.get("scope"),
            author=data.get("author"),
        )


@dataclasses.dataclass(frozen=True)
class _EventFieldsSpec:
    """The dataclass protocol of Event: ``dataclasses.fields``, ``replace`` and ``asdict`` keep working on Events."""

    kind: EventKind
    payload: dict[str, Any] = dataclasses.field(default_factory=dict)
    token_span: tuple[int, int] | None = None
    logprobs: tuple[float, ...] | None = None
    scope: str | None = None
    author: str | None = None


Event.__dataclass_fields__ = _EventFieldsSpec.__dataclass_fields__  # type: ignore[attr-defined]
Event.__dataclass_params__ = _EventFieldsSpec.__dataclass_params__  # type: ignore[attr-defined]


def _coerce_event(item: Any, index: int) -> Event:
    try:
        if isinstance(item, Event):
            return item
        if isinstance(item, Mapping):
            return Event.from_dict(item)
    except (EventLogError, ValueError, TypeError, KeyError) as exc:
        raise EventLogError(f"event {index}: {exc}") from None
    raise EventLogError(f"event {index}: expected an Event or a mapping, got {type(item).__name__}")


class EventLog:
    """An ordered, validated sequence of Events with a tier (light or full).

    A full-tier log comes from a rollout engine and carries token spans and logprobs
    over ``token_ids`` (the prompt plus completion token sequence).
    """

    def __init__(
        self,
        events: Iterable[Event | Mapping[str, Any]] = (),
        tier: str = "light",
        id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        token_ids: Sequence[int] | None = None,
    ) -> None:
        if tier not in TIERS:
            raise ValueError(f"tier must be one of {TIERS}, got {tier!r}")
        self.tier = tier
        self.id = id or uuid.uuid4().hex
        self.metadata: dict[str, Any] = _json_value(dict(metadata or {}), "metadata")
        self.token_ids: tuple[int, ...] | None = tuple(map(int, token_ids)) if token_ids is not None else None
        self._events: list[Event] = []
        self._span_end = 0  # end of the last token span: spans partition the sequence in order (paper §3.3.4)
        self.extend(events)

    @classmethod
    def _trusted(cls, events: list[Event], tier: str, id: str, metadata: dict[str, Any], token_ids: Sequence[int] | None) -> "EventLog":
        """A log from stored rows that were validated on the way in (the warehouse's read path): no second pass."""
        log = object.__new__(cls)
        log.tier, log.id, log.metadata = tier, id, metadata
        log.token_ids = tuple(token_ids) if token_ids is not None else None
        log._events = events
        log._span_end = 0
        for e in reversed(events):  # spans are in order and disjoint: the last one ends furthest
            if e.token_span is not None:
                log._span_end = e.token_span[1]
                break
        return log

    # -- container protocol ----------------------------------------------------
    def append(self, event: Event | Mapping[str, Any]) -> Event:
        """Validate and append one event; errors name the event's index."""
        index = len(self._events)
        ev = _coerce_event(event, index)
        if ev.token_span is not None and self.token_ids is not None and ev.token_span[1] > len(self.token_ids):
            raise EventLogError(
                f"event {index}: token_span {ev.token_span} is outside the sequence of {len(self.token_ids)} tokens"
            )
        if ev.token_span is not None:
            if ev.token_span[0] < self._span_end:
                raise EventLogError(
                    f"event {index}: token_span {ev.token_span} overlaps or precedes the previous span ending at {self._span_end}; "
                    "spans must be in order and disjoint (each token carries one weight)"
                )
            self._span_end = ev.token_span[1]
        self._events.append(ev)
        return ev

    def extend(self, events: Iterable[Event | Mapping[str, Any]]) -> None:
        """``append`` for each event; events without a token span (most of them) skip the call."""
        out, append = self._events, self.append
        n_tokens = len(self.token_ids) if self.token_ids is not None else None
        for event in events:
            if type(event) is Event:
                span = event.token_span
                if span is None:
                    out.append(event)
                    continue
                # append()'s span checks inlined for the common case; anything out of line goes to append to word the error
                if span[0] >= self._span_end and (n_tokens is None or span[1] <= n_tokens):
                    self._span_end = span[1]
                    out.append(event)
                    continue
            append(event)

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
        return (
            self.id == other.id
            and self.tier == other.tier
            and self._events == other._events
            and self.metadata == other.metadata
            and self.token_ids == other.token_ids
        )

    def __repr__(self) -> str:
        return f"EventLog(id={self.id!r}, tier={self.tier!r}, events={len(self)})"

    def filter(self, *kinds: EventKind | str) -> list[Event]:
        wanted = {EventKind.parse(k) for k in kinds}
        return [e for e in self._events if e.kind in wanted]

    # -- serialization ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tier": self.tier,
            "metadata": _copy_json(self.metadata),
            "token_ids": list(self.token_ids) if self.token_ids is not None else None,
            "events": [e.to_dict() for e in self._events],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EventLog":
        return cls(
            data.get("events", ()),
            tier=data.get("tier", "light"),
            id=data.get("id"),
            metadata=data.get("metadata"),
            token_ids=data.get("token_ids"),
        )

    def to_json(self) -> str:
        """``json.dumps(self.to_dict(), sort_keys=True)``, without the private copies ``to_dict`` makes for its caller."""
        kind_value = _KIND_VALUE
        return _SORTED_JSON({  # json writes a tuple as a list: the same text as to_dict's lists
            "id": self.id,
            "tier": self.tier,
            "metadata": self.metadata,
            "token_ids": self.token_ids,
            "events": [
                {"kind": kind_value[e.kind], "payload": e.payload, "token_span": e.token_span, "logprobs": e.logprobs,
                 "scope": e.scope, "author": e.author}
                for e in self._events
            ],
        })

    @classmethod
    def from_json(cls, text: str) -> "EventLog":
        # orjson unless a number might exceed 64 bits (19+ digits in a row): orjson would read it as a float
        # where json gives the integer that validation then rejects. NaN literals and the like also go to json.
        if _LONG_DIGITS.search(text) is None:
            try:
                return cls.from_dict(_loads(text))
            except ValueError as exc:
                if isinstance(exc, EventLogError):
                    raise
        return cls.from_dict(json.loads(text))

    # -- rewards and tokens ----------------------------------------------------
    def rewards(self, scope: str | None = None) -> list[float]:
        """Reward values in order; only those of ``scope`` when given."""
        if scope is not None and scope not in REWARD_SCOPES:
            raise ValueError(f"scope must be one of {REWARD_SCOPES}, got {scope!r}")
        return [
            float(e.payload["value"])
            for e in self._events
            if e.kind is EventKind.REWARD and (scope is None or e.scope == scope)
        ]

    def _require_full(self, op: str) -> None:
        if self.tier != "full":
            raise ValueError(f"{op} requires a full-tier EventLog; log {self.id!r} is {self.tier!r}")

    def masked_tokens(self) -> list[tuple[int, int]]:
        """Token spans the agent generated (TEXT, REASONING, TOOL_CALL): what loss is computed on."""
        self._require_full("masked_tokens()")
        return [e.token_span for e in self._events if e.kind in AGENT_KINDS and e.token_span is not None]

    # -- projections out -------------------------------------------------------
    def as_dataset_rows(self, fmt: str = "sft") -> list[dict[str, Any]]:
        """Project to training rows. ``sft``: one row with messages, segment_weights, loss_mask.

        ``loss_mask`` uses the polarity of paper Table 3: True means excluded from the loss.
        REWARD and TURN_COMPLETE carry no message; every other event gets exactly one weight.
        """
        if fmt != "sft":
            raise ValueError(f"unknown dataset format {fmt!r}; supported: 'sft'")
        self._require_full('as_dataset_rows("sft")')
        messages: list[dict[str, Any]] = []
        weights: list[float] = []
        system = self.metadata.get("system_prompt")
        if isinstance(system, str) and system:
            messages.append({"role": "system", "content": system})
            weights.append(0.0)
        task = self.metadata.get("task")
        if isinstance(task, str) and task and not any(e.kind is EventKind.OBSERVATION for e in self._events[:1]):
            messages.append({"role": "user", "content": task})
            weights.append(0.0)
        segment_weights, segment_roles = SEGMENT_WEIGHTS, SEGMENT_ROLES
        add_message, add_weight = messages.append, weights.append
        for event in self._events:
            kind = event.kind
            weight = segment_weights.get(kind)
            if weight is None:
                continue
            payload = event.payload
            message: dict[str, Any] = {"role": segment_roles[kind], "content": _event_content(kind, payload)}
            if kind is _TOOL_RESULT:
                name, _ = _tool_name_args(payload)
                if name:
                    message["name"] = name
            add_message(message)
            add_weight(weight)
        return [
            {
                "id": self.id,
                "messages": messages,
                "segment_weights": weights,
                "loss_mask": [w == 0.0 for w in weights],
            }
        ]

    def as_token_rows(self, tokenizer: Any, max_length: int | None = None) -> list[dict[str, Any]]:
        """The SFT projection in the token form a trainer consumes.

        Each row has ``input_ids``, ``completion_mask`` (1 = carries loss, TRL's polarity)
        and ``token_weights``, aligned to ``tokenizer``'s chat template. Role headers are
        context; only an assistant message's own tokens carry its segment weight.
        """
        out = []
        for row in self.as_dataset_rows("sft"):
            ids, weights = tokenize_messages(tokenizer, row["messages"], row["segment_weights"])
            if max_length is not None:
                ids, weights = ids[:max_length], weights[:max_length]
            out.append(
                {
                    "id": row["id"],
                    "input_ids": ids,
                    "completion_mask": [1 if w > 0.0 else 0 for w in weights],
                    "token_weights": weights,
                }
            )
        return out

    def to_eval_dict(self) -> dict[str, Any]:
        """The evaluator's view: ordered steps plus tool calls, outputs, errors and rewards.

        The caller owns the result: every payload, argument list and the metadata in it are private deep
        copies, made in one C call for the whole log (see ``_copy_out``), so neither side's later mutation
        reaches the other.
        """
        events = self._events
        steps: list[dict[str, Any]] = []
        tool_calls: list[dict[str, Any]] = []
        call_args: list[Any] = []
        tool_outputs: list[dict[str, Any]] = []
        reasoning: list[str] = []
        rewards: list[dict[str, Any]] = []
        final_answer: str | None = None
        kind_value = _KIND_VALUE
        TOOL_CALL, TOOL_RESULT, REASONING, TEXT, REWARD = (
            EventKind.TOOL_CALL, EventKind.TOOL_RESULT, EventKind.REASONING, EventKind.TEXT, EventKind.REWARD)
        for index, event in enumerate(events):
            kind, payload = event.kind, event.payload
            step = {"index": index, "kind": kind_value[kind], "payload": None}  # payload: its copy, below
            if event.scope is not None:
                step["scope"] = event.scope
            if event.author is not None:
                step["author"] = event.author
            steps.append(step)
            if kind is TOOL_CALL:
                name, args = _tool_name_args(payload)
                call_args.append(args)
                tool_calls.append({"index": index, "name": name, "arguments": None, "id": _own(payload.get("id"))})
            elif kind is TOOL_RESULT:
                name, _ = _tool_name_args(payload)
                error = payload.get("error")
                tool_outputs.append(
                    {
                        "index": index,
                        "name": name,
                        "output": _event_content(kind, payload),
                        "error": _own(error) if error not in (None, "", False) else None,
                        "id": _own(payload.get("id")),
                    }
                )
            elif kind is REASONING:
                reasoning.append(_event_content(kind, payload))
            elif kind is TEXT:
                final_answer = _event_content(kind, payload)
            elif kind is REWARD:
                rewards.append({"value": float(payload["value"]), "scope": event.scope})
        n = len(events)
        copies = _copy_out([e.payload for e in events] + call_args + [self.metadata, self.metadata.get("plan")])
        for step, payload in zip(steps, copies):
            step["payload"] = payload
        for call, args in zip(tool_calls, copies[n:]):
            call["arguments"] = args
        return {
            "trajectory_id": self.id,
            "tier": self.tier,
            "task": _own(self.metadata.get("task")),
            "plan": copies[-1],
            "metadata": copies[-2],
            "steps": steps,
            "tool_calls": tool_calls,
            "tool_outputs": tool_outputs,
            "reasoning": reasoning,
            "final_answer": final_answer,
            "rewards": rewards,
        }

    def to_audit_records(self) -> list[dict[str, Any]]:
        """The closed loop's view: one record per action with a stage name and a state snapshot.

        A TOOL_CALL's stage is its name folded with its sorted-JSON arguments, so loop
        collapse means an identical repeated action. The matching TOOL_RESULT folds into
        the call's record and marks it ``status="error"`` when it carries an error.
        REWARD and TURN_COMPLETE are bookkeeping, not actions, and make no record.
        """
        # Every payload is deep-copied once, in one C call for the whole log (see ``_copy_out``); a record's
        # ``state`` is its event's copy and ``result`` the result's copy, so the caller owns every record.
        events = self._events
        copies = _copy_out([e.payload for e in events])
        records: list[dict[str, Any]] = []
        open_calls: dict[Any, dict[str, Any]] = {}
        pending: list[dict[str, Any]] = []
        kind_value, stage_name, log_id = _KIND_VALUE, self._stage_name, self.id
        TOOL_CALL, TOOL_RESULT = EventKind.TOOL_CALL, EventKind.TOOL_RESULT
        skip = (EventKind.REWARD, EventKind.TURN_COMPLETE)
        for index, event in enumerate(events):
            kind = event.kind
            if kind in skip:
                continue
            payload = event.payload
            error = payload.get("error") if kind is TOOL_RESULT else None
            is_error = error not in (None, "", False)
            if kind is TOOL_RESULT:
                call_id = payload.get("id")
                record = open_calls.pop(call_id, None) if call_id is not None else None
                if record is None and pending:
                    record = pending.pop(0)
                    open_calls.pop(record["state"].get("id"), None)
                elif record is not None:
                    for i, waiting in enumerate(pending):  # by identity: records are distinct objects
                        if waiting is record:
                            del pending[i]
                            break
                if record is not None:
                    record["state"]["result"] = copies[index]
                    if is_error:
                        record["status"] = "error"
                        record["error"] = _own(error)
                    continue
            record = {
                "trajectory_id": log_id,
                "seq": index,
                "kind": kind_value[kind],
                "stage": stage_name(event),
                "status": "error" if is_error else "ok",
                "author": event.author,
                "state": copies[index],
            }
            if is_error:
                record["error"] = _own(error)
            if kind is TOOL_CALL:
                pending.append(record)
                if payload.get("id") is not None:
                    open_calls[payload["id"]] = record
            records.append(record)
        return records

    @staticmethod
    def _stage_name(event: Event) -> str:
        kind, payload = event.kind, event.payload
        if "stage_id" in payload and kind is not _TOOL_CALL:
            return str(payload["stage_id"])
        if kind is _TOOL_CALL or kind is _TOOL_RESULT:
            name, args = _tool_name_args(payload)
            return f"{name}({_STAGE_JSON(args)})"  # fold_tool_stage, inlined
        return _KIND_VALUE[kind]

    # -- projections in (read-only: copy out, never mutate the source) ----------
    @classmethod
    def from_trajectory(cls, trajectory: Mapping[str, Any], id: str | None = None) -> "EventLog":
        """RL rollout -> full-tier log.

        ``trajectory`` holds ``prompt_ids``, ``completion_ids``, optional ``logprobs``
        (aligned with completion_ids) and ``segments``: ordered ``{"kind", "payload",
        "span": [start, end] relative to completion_ids, "author"}``. ``reward`` (a float,
        an episode reward) or ``rewards`` (``[{"value", "scope"}]``) become REWARD events.
        """
        src = copy.deepcopy(_as_mapping(trajectory, "trajectory"))
        prompt_ids = list(src.get("prompt_ids") or [])
        completion_ids = list(src.get("completion_ids") or [])
        logprobs = src.get("logprobs")
        offset = len(prompt_ids)
        events: list[Event] = []
        if src.get("prompt") is not None or src.get("task") is not None:
            prompt = src.get("prompt", src.get("task"))
            events.append(Event(EventKind.OBSERVATION, {"content": prompt if isinstance(prompt, str) else json.dumps(prompt)}, token_span=(0, offset) if prompt_ids else None))
        for i, seg in enumerate(src.get("segments") or []):
            if not isinstance(seg, Mapping):
                raise EventLogError(f"event {len(events)}: trajectory segment {i} is not a mapping")
            span = seg.get("span")
            abs_span = None
            seg_lps = None
            if span is not None:
                if len(span) != 2 or span[0] < 0 or span[1] < span[0] or span[1] > len(completion_ids):
                    raise EventLogError(
                        f"event {len(events)}: span {list(span)} is outside the completion of {len(completion_ids)} tokens"
                    )
                abs_span = (offset + int(span[0]), offset + int(span[1]))
                if logprobs is not None and EventKind.parse(seg.get("kind")) in AGENT_KINDS:
                    seg_lps = logprobs[span[0]:span[1]]
            try:
                events.append(
                    Event(seg.get("kind"), seg.get("payload") or {}, token_span=abs_span, logprobs=seg_lps, author=seg.get("author"))
                )
            except ValueError as exc:
                raise EventLogError(f"event {len(events)}: {exc}") from None
        rewards = src.get("rewards")
        if rewards is None and src.get("reward") is not None:
            rewards = [{"value": src["reward"], "scope": "episode"}]
        for r in rewards or []:
            r = r if isinstance(r, Mapping) else {"value": r, "scope": "episode"}
            events.append(Event(EventKind.REWARD, {"value": r["value"], **({"source": r["source"]} if "source" in r else {})}, scope=r.get("scope", "episode"), author=r.get("author")))
        metadata = {k: src[k] for k in ("task", "system_prompt", "task_id", "model", "adapter") if k in src and src[k] is not None}
        metadata.update(src.get("metadata") or {})
        return cls(events, tier="full", id=id or src.get("id"), metadata=metadata, token_ids=prompt_ids + completion_ids)

    @classmethod
    def from_pipeline_state(cls, state: Any, id: str | None = None) -> "EventLog":
        """DECIDE pipeline state -> light-tier log.

        Reads ``input_text``, ``step_history`` (``{"stage_id", "stage_type", "output",
        "status", "error"}`` per visited stage) and ``verdict`` (label, confidence, reason).
        """
        src = copy.deepcopy(_as_mapping(state, "pipeline state"))
        events: list[Event] = []
        if src.get("input_text") is not None:
            events.append(Event(EventKind.OBSERVATION, {"content": str(src["input_text"]), "stage_id": "input"}))
        for step in src.get("step_history") or []:
            step = dict(step) if isinstance(step, Mapping) else _as_mapping(step, "step")
            stage_id = str(step.get("stage_id", step.get("stage", "")))
            stage_type = str(step.get("stage_type", step.get("type", "")))
            output = step.get("output")
            base = {"stage_id": stage_id, "stage_type": stage_type}
            if stage_type == "tool_call":
                tool = step.get("tool", stage_id)
                events.append(Event(EventKind.TOOL_CALL, {"name": tool, "arguments": step.get("args", step.get("arguments", {})), **base}))
                result = {"name": tool, "content": output, **base}
                if step.get("error") or step.get("status") == "error":
                    result["error"] = step.get("error") or "stage failed"
                events.append(Event(EventKind.TOOL_RESULT, result))
            elif stage_type == "human_review":
                events.append(Event(EventKind.OBSERVATION, {"content": output, **base}))
            elif stage_type in ("rules", "router"):
                events.append(Event(EventKind.REASONING, {"content": output, **base, **({"error": step["error"]} if step.get("error") else {})}))
            else:
                events.append(Event(EventKind.TEXT, {"content": output, **base, **({"error": step["error"]} if step.get("error") else {})}))
            if step.get("score") is not None:
                events.append(Event(EventKind.REWARD, {"value": float(step["score"]), "stage_id": stage_id}, scope="step"))
        verdict = src.get("verdict")
        if verdict:
            verdict = dict(verdict)
            events.append(Event(EventKind.TEXT, {"content": verdict.get("label"), "verdict": verdict, "stage_id": "verdict"}))
            if verdict.get("confidence") is not None:
                events.append(Event(EventKind.REWARD, {"value": float(verdict["confidence"]), "source": "verdict_confidence"}, scope="episode"))
        events.append(Event(EventKind.TURN_COMPLETE, {}))
        metadata = {k: src[k] for k in ("template_id", "run_id", "task") if src.get(k) is not None}
        return cls(events, tier="light", id=id or src.get("run_id"), metadata=metadata)

    @classmethod
    def from_eval_dict(cls, eval_dict: Mapping[str, Any], id: str | None = None) -> "EventLog":
        """Evaluator dict -> light-tier log; the inverse of ``to_eval_dict`` for its ``steps``.

        Without ``steps``, ``tool_calls`` and ``tool_outputs`` are interleaved in order and
        ``final_answer`` becomes the closing TEXT.
        """
        src = copy.deepcopy(_as_mapping(eval_dict, "eval dict"))
        events: list[Event] = []
        if src.get("steps") is not None:
            for i, step in enumerate(src["steps"]):
                try:
                    events.append(Event(step["kind"], step.get("payload") or {}, scope=step.get("scope"), author=step.get("author")))
                except (KeyError, ValueError, TypeError) as exc:
                    raise EventLogError(f"event {i}: {exc}") from None
        else:
            outputs = list(src.get("tool_outputs") or [])
            for i, call in enumerate(src.get("tool_calls") or []):
                events.append(Event(EventKind.TOOL_CALL, {"name": call.get("name"), "arguments": call.get("arguments", call.get("args", {}))}))
                if i < len(outputs):
                    out = outputs[i]
                    out = out if isinstance(out, Mapping) else {"output": out}
                    payload = {"name": out.get("name", call.get("name")), "content": out.get("output", out.get("content"))}
                    if out.get("error"):
                        payload["error"] = out["error"]
                    events.append(Event(EventKind.TOOL_RESULT, payload))
            if src.get("final_answer") is not None:
                events.append(Event(EventKind.TEXT, {"content": src["final_answer"]}))
            for r in src.get("rewards") or []:
                r = r if isinstance(r, Mapping) else {"value": r, "scope": "episode"}
                events.append(Event(EventKind.REWARD, {"value": r["value"]}, scope=r.get("scope", "episode")))
        metadata = dict(src.get("metadata") or {})
        if src.get("task") is not None:
            metadata.setdefault("task", src["task"])
        if src.get("plan") is not None:
            metadata.setdefault("plan", src["plan"])
        return cls(events, tier="light", id=id or src.get("trajectory_id"), metadata=metadata)


def _as_mapping(obj: Any, what: str) -> Mapping[str, Any]:
    if isinstance(obj, Mapping):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(obj, "__dict__"):
        return dict(vars(obj))
    raise EventLogError(f"{what} must be a mapping or an object with attributes, got {type(obj).__name__}")


def tokenize_messages(tokenizer: Any, messages: list[dict[str, Any]], weights: list[float]) -> tuple[list[int], list[float]]:
    """Token ids of ``messages`` under ``tokenizer``'s chat template, with a weight per token.

    Renders each prefix of the conversation and tokenizes the difference, so the weights
    follow message boundaries exactly; an assistant message's role header is context.
    """
    ids: list[int] = []
    token_weights: list[float] = []
    rendered = ""

    def render(msgs: list[dict[str, Any]], gen: bool = False) -> str:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    def encode(text: str) -> list[int]:
        if not text:
            return []
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    for i, (message, weight) in enumerate(zip(messages, weights)):
        body_weight = weight
        if message["role"] == "assistant" and weight > 0.0:
            with_header = render(messages[:i], gen=True) if i else render([], gen=True) if _renders_empty(tokenizer) else ""
            if with_header.startswith(rendered) and with_header:
                header = with_header[len(rendered):]
                head_ids = encode(header)
                ids += head_ids
                token_weights += [0.0] * len(head_ids)
                rendered = with_header
        full = render(messages[: i + 1])
        if not full.startswith(rendered):
            raise ValueError("chat template is not prefix-stable; cannot align the loss mask to message boundaries")
        chunk_ids = encode(full[len(rendered):])
        ids += chunk_ids
        token_weights += [body_weight] * len(chunk_ids)
        rendered = full
    return ids, token_weights


def _renders_empty(tokenizer: Any) -> bool:
    try:
        tokenizer.apply_chat_template([], tokenize=False, add_generation_prompt=True)
        return True
    except Exception:  # templates may reject an empty conversation
        return False
