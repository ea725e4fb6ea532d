"""EventLogs to Arrow and to the stored rows: the warehouse's columnar boundary (the EventLog module stays stdlib-only).

``logs_to_arrow`` gives the (trajectories, events) tables ``append_arrow`` takes; ``_stored_batch`` gives the
trajectories rows as stored, each log's events as one text in its row (``columns``).
"""
from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from agenttune_lib.events import EventKind, EventLog
from agenttune_lib.warehouse import columns as event_columns
from agenttune_lib.warehouse.schema import EVENT_SCHEMA, STORED_TRAJECTORY_SCHEMA, TRAJECTORY_SCHEMA
from agenttune_lib.warehouse.types import Provenance, WarehouseError

__all__ = ["logs_to_arrow"]

_SORT_KEYS = orjson.OPT_SORT_KEYS
_LONG_DIGITS = re.compile(r"[0-9]{19}")  # the shortest run of digits that can spell an integer beyond 64 bits


def _json_load(text: str) -> Any:
    """Parse stored JSON exactly: orjson, but json where a number may be beyond 64 bits (orjson reads those as
    floats) or orjson refuses the text."""
    if _LONG_DIGITS.search(text) is not None:
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _json_text(value: Any) -> str:
    """Sorted-key JSON of an already validated payload (orjson; json for ints beyond 64 bits)."""
    try:
        return orjson.dumps(value, option=_SORT_KEYS).decode()
    except TypeError:
        return json.dumps(value, sort_keys=True)


def _pylist(col: pa.ChunkedArray) -> Any:
    """One Arrow column as a Python list; a column NULL throughout as a repeat of None (nothing converted)."""
    n = len(col)
    return itertools.repeat(None, n) if col.null_count == n else col.to_pylist()


def logs_to_arrow(
    logs: Sequence[EventLog],
    provenance: Provenance | Sequence[Provenance | None] | None = None,
    source: str | None = None,
    created_at: datetime | None = None,
) -> tuple[pa.Table, pa.Table]:
    """Column-wise (trajectories, events) Arrow tables for a batch of EventLogs: what ``append_arrow`` takes."""
    provs = _provenances(logs, provenance)
    # Events column by column: one pass reads each Event's six fields (zip(*events) over a million events made a
    # million iterators; a pass per column was memory-bound).
    kinds: list[EventKind] = []
    payloads: list[Any] = []
    spans: list[Any] = []
    logprobs: list[Any] = []
    scopes: list[Any] = []
    authors: list[Any] = []
    add_k, add_p, add_s, add_l, add_sc, add_a = kinds.append, payloads.append, spans.append, logprobs.append, scopes.append, authors.append
    for log in logs:
        for kind, payload, span, lps, scope, author in event_columns.event_fields(log._events):
            add_k(kind)
            add_p(payload)
            add_s(span)
            add_l(lps)
            add_sc(scope)
            add_a(author)
    n = len(kinds)
    lengths = np.fromiter((len(log._events) for log in logs), dtype=np.int64, count=len(logs))
    owner = np.repeat(np.arange(len(logs), dtype=np.int64), lengths)
    reward_total: list[float | None] = [None] * len(logs)
    reward_episode: list[float | None] = [None] * len(logs)
    REWARD = EventKind.REWARD
    for i in [i for i, kind in enumerate(kinds) if kind is REWARD]:  # as log.rewards() and log.rewards("episode")
        k = int(owner[i])
        value = float(payloads[i]["value"])
        reward_total[k] = (0 if reward_total[k] is None else reward_total[k]) + value  # sum()'s order and start
        if scopes[i] == "episode":
            reward_episode[k] = value
    t_cols = _trajectory_columns(logs, provs, source, created_at, reward_total, reward_episode)
    starts = np.cumsum(lengths) - lengths
    e_arrays = {
        "trajectory_id": pa.array(t_cols["id"], pa.string()).take(pa.array(owner)),
        "seq": pa.array((np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)).astype(np.int32)),
        "kind": _KIND_ARRAY.take(pa.array(np.fromiter(map(_KIND_CODE.__getitem__, kinds), dtype=np.int8, count=n))),
        "payload": _payload_column(payloads),
        "span_start": _column(spans, pa.int32(), lambda: [sp[0] if sp is not None else None for sp in spans]),
        "span_end": _column(spans, pa.int32(), lambda: [sp[1] if sp is not None else None for sp in spans]),
        "logprobs": _column(logprobs, pa.list_(pa.float64())),
        "scope": _column(scopes, pa.string()),
        "author": _column(authors, pa.string()),
    }
    columns = [e_arrays[f.name] if f.name in e_arrays else pa.nulls(n, f.type) for f in EVENT_SCHEMA]  # additive columns: NULL here
    return pa.Table.from_pydict(t_cols, schema=TRAJECTORY_SCHEMA), pa.Table.from_arrays(columns, schema=EVENT_SCHEMA)


def _stored_batch(
    logs: Sequence[EventLog],
    provenance: Provenance | Sequence[Provenance | None] | None = None,
    source: str | None = None,
) -> pa.Table:
    """The trajectories rows as stored (STORED_TRAJECTORY_SCHEMA): each log's events as one text in its row."""
    provs = _provenances(logs, provenance)
    encoded = [event_columns.encode(log._events) for log in logs]
    texts, totals, episodes = (list(c) for c in zip(*encoded)) if encoded else ([], [], [])
    t_cols = _trajectory_columns(logs, provs, source, None, totals, episodes)
    t_cols["events"] = texts
    return pa.Table.from_pydict(t_cols, schema=STORED_TRAJECTORY_SCHEMA)


def _provenances(logs: Sequence[EventLog], provenance: Provenance | Sequence[Provenance | None] | None) -> list[Provenance | None]:
    """One provenance per log, and every log an EventLog, or a WarehouseError naming the item."""
    if provenance is None or isinstance(provenance, Provenance):
        provs: list[Provenance | None] = [provenance] * len(logs)
    else:
        provs = list(provenance)
        if len(provs) != len(logs):
            raise WarehouseError(f"got {len(provs)} provenance records for {len(logs)} logs")
    for i, log in enumerate(logs):
        if not isinstance(log, EventLog):
            raise WarehouseError(f"item {i} of the logs is a {type(log).__name__} ({log!r:.60}), not an EventLog")
    return provs


def _trajectory_columns(logs: Sequence[EventLog], provs: list[Provenance | None], source: str | None,
                        created_at: datetime | None, reward_total: list[float | None],
                        reward_episode: list[float | None]) -> dict[str, list[Any]]:
    """The trajectories columns of TRAJECTORY_SCHEMA, as Python lists."""
    now = created_at or datetime.now(timezone.utc)
    t_cols: dict[str, list[Any]] = {f.name: [] for f in TRAJECTORY_SCHEMA}
    dumps = json.dumps
    for log, prov in zip(logs, provs):
        prov = prov or Provenance()
        task = log.metadata.get("task")
        t_cols["id"].append(log.id)
        t_cols["tier"].append(log.tier)
        t_cols["source"].append(source or log.metadata.get("source"))
        t_cols["task"].append(task if isinstance(task, str) or task is None else dumps(task, sort_keys=True))
        t_cols["created_at"].append(now)
        t_cols["n_events"].append(len(log))
        t_cols["run_id"].append(prov.run_id)
        t_cols["asset_key"].append(prov.asset_key)
        t_cols["partition"].append(prov.partition)
        t_cols["model_version"].append(prov.model_version)
        t_cols["adapter_version"].append(prov.adapter_version)
        t_cols["qa_item_ids"].append(list(prov.qa_item_ids))
        t_cols["chunk_ids"].append(list(prov.chunk_ids))
        t_cols["token_ids"].append(list(log.token_ids) if log.token_ids is not None else None)
        t_cols["metadata"].append(_json_text(log.metadata))
        t_cols["provenance_extra"].append(dumps(prov.extra, sort_keys=True, default=str))
        t_cols["teacher_kind"].append(prov.teacher_kind or log.metadata.get("teacher_kind"))
        t_cols["teacher_version"].append(prov.teacher_version or log.metadata.get("teacher_version"))
    t_cols["reward_total"] = reward_total
    t_cols["reward_episode"] = reward_episode
    return t_cols


_orjson_dumps = orjson.dumps


_KIND_CODE = {kind: code for code, kind in enumerate(EventKind)}
_KIND_ARRAY = pa.array([kind.value for kind in EventKind], pa.string())
_NO_EVENTS = '{"kind":[],"payload":[]}'


def _payload_column(payloads: list) -> pa.Array:
    """The payload column: ``_json_text`` of each payload, inlined (str, not bytes: pyarrow converts a list of
    str to a string column many times faster than a list of bytes)."""
    try:
        return pa.array([_orjson_dumps(p, option=_SORT_KEYS).decode() for p in payloads], pa.string())
    except TypeError:  # a value orjson refuses (a lone surrogate the walker let through): json for the batch
        return pa.array([_json_text(p) for p in payloads], pa.string())


def _column(source: list, type_: pa.DataType, values: Any = None) -> pa.Array:
    """An Arrow column of ``source`` (or of ``values()``, derived from it); all NULL without a conversion.

    Most events carry no logprobs, scope or author, and light-tier logs no token spans.
    """
    if source.count(None) == len(source):
        return pa.nulls(len(source), type_)
    return pa.array(source if values is None else values(), type_)
