"""A log's events as the trajectories table stores them: one JSON object of columns, in seq order.

``{"kind": [...], "payload": [...]}`` plus ``span`` ([start, end] or null), ``logprobs``, ``scope`` and
``author`` when some event of the log has one, and ``"$exact": true`` (first) when some value is an integer
beyond 64 bits, which orjson would read back as a float: such a text is read with json. One text per log is what makes a read by id fetch one row per
log; encoding and decoding are a few C calls per log (``zip(*events)`` transposes the Events, orjson writes
and reads the columns) instead of Python work per event.
"""
from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from typing import Any

import orjson

from agenttune_lib.events import Event, EventKind

_KIND_VALUE = {k: k.value for k in EventKind}
_KIND_OF = {k.value: k for k in EventKind}
_REWARD = EventKind.REWARD
_SORT_KEYS = orjson.OPT_SORT_KEYS
_tuple_new = tuple.__new__
_LONG_DIGITS = re.compile(r"[0-9]{19}")  # the shortest run of digits that can spell an integer beyond 64 bits
_OPTIONAL = ("span", "logprobs", "scope", "author")
_DICT_ONLY = {dict}


class EventColumnsError(ValueError):
    """Stored event columns that do not describe a log (lengths differ, a kind unknown, a payload not an object)."""


_EXACT = '{"$exact":true,'


def _dumps(obj: dict[str, Any]) -> str:
    """Sorted-key compact JSON; json where orjson refuses (an integer beyond 64 bits, a lone surrogate), marked exact."""
    try:
        return orjson.dumps(obj, option=_SORT_KEYS).decode()
    except TypeError:
        return _EXACT + json.dumps(obj, sort_keys=True, separators=(",", ":"))[1:]


def _value(value: Any) -> str:
    """Compact JSON of one column (a list); json where orjson refuses."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"))


def encode(events: Sequence[Event]) -> tuple[str, float | None, float | None]:
    """(the stored text, the sum of its rewards, its last episode reward) for one log's Events."""
    if not events:
        return '{"kind":[],"payload":[]}', None, None
    kinds, payloads, spans, logprobs, scopes, authors = zip(*events)  # Events are tuples of their six fields
    n = len(kinds)
    out: dict[str, Any] = {"kind": list(map(_KIND_VALUE.__getitem__, kinds)), "payload": payloads}
    for key, column in (("span", spans), ("logprobs", logprobs), ("scope", scopes), ("author", authors)):
        if column.count(None) != n:
            out[key] = column
    total = episode = None
    if _REWARD in kinds:  # as log.rewards() and log.rewards("episode")
        for kind, payload, scope in zip(kinds, payloads, scopes):
            if kind is _REWARD:
                value = float(payload["value"])
                total = (0 if total is None else total) + value  # sum()'s order and start
                if scope == "episode":
                    episode = value
    return _dumps(out), total, episode


def encode_rows(kinds: list[str], payloads: list[str | None], starts: list[int | None], ends: list[int | None],
                logprobs: list[Any], scopes: list[str | None], authors: list[str | None]) -> str:
    """The stored text from one log's event rows (EVENT_SCHEMA columns, in seq order), payloads as their JSON text.

    The payload texts are spliced in unparsed, so what a caller stored (an integer beyond 64 bits included) is
    kept exactly.
    """
    n = len(kinds)
    parts = ['"kind":' + _value(kinds), '"payload":[' + ",".join(p if p else "{}" for p in payloads) + "]"]
    if starts.count(None) != n:
        parts.append('"span":' + _value([[a, b] if a is not None else None for a, b in zip(starts, ends)]))
    for key, column in (("logprobs", logprobs), ("scope", scopes), ("author", authors)):
        if column.count(None) != n:
            parts.append(f'"{key}":' + _value(column))
    parts.sort()  # the keys in sorted order, as encode() writes them
    text = "{" + ",".join(parts) + "}"
    return _EXACT + text[1:] if _LONG_DIGITS.search(text) is not None else text


def decode(text: str | None, where: str) -> list[Event]:
    """The Events of one stored text; ``where`` names the trajectory in an error."""
    if not text:
        return []
    try:
        data = json.loads(text) if text.startswith(_EXACT) else orjson.loads(text)
    except ValueError as exc:
        raise EventColumnsError(f"{where}: stored events are not JSON ({exc})") from None
    return decode_columns(data, where)


def decode_columns(data: Any, where: str) -> list[Event]:
    """The Events of one parsed stored object, checked to describe a log: equal lengths, known kinds, object payloads."""
    try:
        kinds = list(map(_KIND_OF.__getitem__, data["kind"]))
        payloads = data["payload"]
    except (KeyError, TypeError, IndexError):
        if not isinstance(data, dict) or not isinstance(data.get("kind"), list) or not isinstance(data.get("payload"), list):
            raise EventColumnsError(f"{where}: stored events need 'kind' and 'payload' lists") from None
        bad = next(k for k in data["kind"] if not isinstance(k, str) or k not in _KIND_OF)
        raise EventColumnsError(f"{where}: an event of unknown kind {bad!r}") from None
    n = len(kinds)
    if type(payloads) is not list or len(payloads) != n:
        raise EventColumnsError(f"{where}: stored events have {n} kinds and "
                                f"{len(payloads) if isinstance(payloads, list) else repr(payloads)} payloads")
    if n and not set(map(type, payloads)) <= _DICT_ONLY:
        raise EventColumnsError(f"{where}: a stored payload is not a JSON object")
    columns: list[Any] = [kinds, payloads, *(itertools.repeat(None, n) for _ in _OPTIONAL)]  # one iterator each: zip pulls from all
    if len(data) > 2 and not (len(data) == 3 and "$exact" in data):
        for i, key in enumerate(_OPTIONAL, 2):
            column = data.get(key)
            if column is None:
                continue
            if type(column) is not list or len(column) != n:
                raise EventColumnsError(f"{where}: stored '{key}' holds {len(column) if isinstance(column, list) else column!r} "
                                        f"values for {n} events")
            if i < 4:  # span, logprobs: tuples
                column = [tuple(x) if x is not None else None for x in column]
            columns[i] = column
    return list(map(_tuple_new, itertools.repeat(Event, n), zip(*columns)))


def decode_column(values: Sequence[str | None], ids: Sequence[str], where: str) -> list[list[Event]]:
    """The Events of every stored text of a read: one JSON parse for the whole column where it can."""
    parsed: list[Any] | None = None
    # orjson reads an integer beyond 64 bits as a float: texts marked exact are parsed by json, one by one.
    if not any(t is not None and t.startswith(_EXACT) for t in values):
        try:
            parsed = orjson.loads("[" + ",".join([t or "null" for t in values]) + "]")
        except orjson.JSONDecodeError:
            parsed = None
        if parsed is not None and len(parsed) != len(values):  # a text that is not one JSON value: parse each
            parsed = None
    if parsed is None:
        return [decode(t, f"{where}: trajectory {tid!r}") for t, tid in zip(values, ids)]
    return [decode_columns(d, f"{where}: trajectory {tid!r}") if d is not None else [] for d, tid in zip(parsed, ids)]
