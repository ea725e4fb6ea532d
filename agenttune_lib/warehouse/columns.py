"""A log's events as the trajectories table stores them: one JSON object of columns, in seq order.

``{"kind": [...], "payload": [...]}`` plus ``span`` ([start, end] or null), ``logprobs``, ``scope`` and
``author`` when some event of the log has one (a non-finite logprob as the string ``"-inf"``, ``"inf"`` or
``"nan"``: JSON has no such numbers), and ``"$exact": true`` (first) when some value is an integer
beyond 64 bits, which orjson would read back as a float: such a text is read with json. One text per log is what makes a read by id fetch one row per
log; encoding and decoding are a few C calls per log (``zip(*events)`` transposes the Events, orjson writes
and reads the columns) instead of Python work per event.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import operator
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from agenttune_lib.events import Event, EventKind, EventLog

_KIND_VALUE = {k: k.value for k in EventKind}
_KIND_OF = {k.value: k for k in EventKind}
_REWARD = EventKind.REWARD
_SORT_KEYS = orjson.OPT_SORT_KEYS
_LONG_DIGITS = re.compile(r"[0-9]{19}")  # the shortest run of digits that can spell an integer beyond 64 bits
_OPTIONAL = ("span", "logprobs", "scope", "author")
_DICT_ONLY = {dict}
_isfinite = math.isfinite


_FIELDS = tuple(f.name for f in dataclasses.fields(Event))
_fields_of = operator.attrgetter(*_FIELDS)
_new, _set = object.__new__, object.__setattr__


def event_fields(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    """The six fields of each Event as a tuple, in field order (one C call per event)."""
    return list(map(_fields_of, events))


def stored_event(fields: tuple[Any, ...]) -> Event:
    """An Event from stored fields that were validated on the way in: no second check or copy.

    The warehouse's read path rebuilds tens of thousands of Events per read; the frozen dataclass's own
    constructor validates and copies each payload again, which the stored rows do not need.
    """
    event = _new(Event)
    _set(event, "__dict__", dict(zip(_FIELDS, fields)))
    return event


def stored_log(events: list[Event], tier: str, id: str, metadata: dict[str, Any], token_ids: Sequence[int] | None) -> EventLog:
    """An EventLog from stored rows that were validated on the way in (the read path): no second pass."""
    log = _new(EventLog)
    log.tier, log.id, log.metadata, log._events = tier, id, metadata, events
    log.token_ids = tuple(token_ids) if token_ids is not None else None
    log._span_end = next((e.token_span[1] for e in reversed(events) if e.token_span is not None), 0)
    return log


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
    kinds, payloads, spans, logprobs, scopes, authors = zip(*event_fields(events))
    n = len(kinds)
    out: dict[str, Any] = {"kind": list(map(_KIND_VALUE.__getitem__, kinds)), "payload": payloads}
    for key, column in (("span", spans), ("logprobs", logprobs), ("scope", scopes), ("author", authors)):
        if column.count(None) != n:
            out[key] = column
    if "logprobs" in out:
        out["logprobs"] = _finite_or_text(logprobs)
    total = episode = None
    if _REWARD in kinds:  # as log.rewards() and log.rewards("episode")
        for kind, payload, scope in zip(kinds, payloads, scopes):
            if kind is _REWARD:
                value = float(payload["value"])
                total = (0 if total is None else total) + value  # sum()'s order and start
                if scope == "episode":
                    episode = value
    return _dumps(out), total, episode


def texts_from_rows(rows: pa.Table) -> tuple[list[str], list[str]]:
    """(trajectory ids, stored texts) from event rows (EVENT_SCHEMA columns), each trajectory's rows in seq order.

    Rows that do not arrive grouped by trajectory in seq order are sorted first. Payload texts are spliced in
    unparsed, so what a caller stored (an integer beyond 64 bits included, which marks the text exact) is kept
    exactly. Column by column in Arrow, then a few string operations per trajectory.
    """
    n = rows.num_rows
    if n == 0:
        return [], []
    starts = _runs_in_seq_order(rows)
    if starts is None:
        rows = rows.sort_by([("trajectory_id", "ascending"), ("seq", "ascending")])
        starts = _runs_in_seq_order(rows)
        assert starts is not None
    bounds = [*starts.tolist(), n]
    ids = pc.take(rows.column("trajectory_id"), pa.array(starts)).to_pylist()
    payload_col = rows.column("payload")
    payload_col = pc.if_else(pc.equal(pc.fill_null(payload_col, ""), ""), "{}", payload_col)
    exact = np.add.reduceat(pc.match_substring_regex(payload_col, "[0-9]{19}").to_numpy(zero_copy_only=False).astype(np.int64), starts) > 0
    kinds, payloads = rows.column("kind").to_pylist(), payload_col.to_pylist()
    columns = {c: rows.column(c) for c in ("author", "logprobs", "scope", "span_start", "span_end")}
    present = {c for c, col in columns.items() if col.null_count < n}
    authors = columns["author"].to_pylist() if "author" in present else None
    logprobs = columns["logprobs"].to_pylist() if "logprobs" in present else None
    scopes = columns["scope"].to_pylist() if "scope" in present else None
    span_a = columns["span_start"].to_pylist() if "span_start" in present else None
    span_b = columns["span_end"].to_pylist() if span_a is not None else None
    out = []
    for a, b, ex in zip(bounds, bounds[1:], exact.tolist()):
        parts = []
        if authors is not None and authors[a:b].count(None) != b - a:
            parts.append('"author":' + _value(authors[a:b]))
        parts.append('"kind":' + _value(kinds[a:b]))
        if logprobs is not None and logprobs[a:b].count(None) != b - a:
            parts.append('"logprobs":' + _value(_finite_or_text(logprobs[a:b])))
        parts.append('"payload":[' + ",".join(payloads[a:b]) + "]")
        if scopes is not None and scopes[a:b].count(None) != b - a:
            parts.append('"scope":' + _value(scopes[a:b]))
        if span_a is not None and span_a[a:b].count(None) != b - a:
            parts.append('"span":' + _value([[x, y] if x is not None else None for x, y in zip(span_a[a:b], span_b[a:b])]))
        out.append(("{" if not ex else _EXACT) + ",".join(parts) + "}")
    return ids, out


def _runs_in_seq_order(rows: pa.Table) -> np.ndarray | None:
    """Where each trajectory's rows start, when they arrive grouped (each id in one run) in seq order 0..n-1."""
    n = rows.num_rows
    tid = rows.column("trajectory_id")
    changed = pc.not_equal(tid.slice(1), tid.slice(0, n - 1)).to_numpy(zero_copy_only=False) if n > 1 else np.zeros(0, bool)
    starts = np.concatenate(([0], np.flatnonzero(changed) + 1)).astype(np.int64)
    seq = rows.column("seq").to_numpy(zero_copy_only=False)
    if not np.array_equal(seq, np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))):
        return None
    if len(set(pc.take(tid, pa.array(starts)).to_pylist())) != len(starts):
        return None
    return starts


def _finite_or_text(logprobs: list[Any]) -> list[Any]:
    """Each log's logprobs with a non-finite value as its repr (``"-inf"``): JSON has no such numbers."""
    if all(lp is None or all(map(_isfinite, lp)) for lp in logprobs):
        return logprobs
    return [lp if lp is None else [v if _isfinite(v) else repr(v) for v in lp] for lp in logprobs]


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
            if i == 2:  # span: a tuple
                column = [tuple(x) if x is not None else None for x in column]
            elif i == 3:  # logprobs: a tuple of floats ("-inf", "nan" stored as strings)
                column = [tuple(map(float, x)) if x is not None else None for x in column]
            columns[i] = column
    return list(map(stored_event, zip(*columns)))


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
