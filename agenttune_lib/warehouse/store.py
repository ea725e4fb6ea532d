"""The EventLog warehouse: EventLogs and lineage tables in one DuckDB file (or a DuckLake).

DuckDB lets one process hold a file read-write, and Dagster runs each step in its own
process, so every operation attaches the file for its own length only and retries with
backoff while another process holds the lock. The object holds only a path: it pickles to
rollout workers and run workers alike. A trajectory is one row of ``trajectories``, its
events stored in it (``columns``); ``events`` is a view with a row per event.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import itertools
import json
import os
import random
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse import columns as event_columns
from agenttune_lib.warehouse.lake import LAKE_ALIAS, LakeError, is_lake, open_lake
from agenttune_lib.warehouse.lake import retryable as lake_retryable
from agenttune_lib.warehouse.schema import (
    CORE_DDL,
    EVENT_SCHEMA,
    EVENTS_VIEW,
    STORED_TRAJECTORY_SCHEMA,
    TRAJECTORY_ID_INDEX,
    TRAJECTORY_SCHEMA,
)
from agenttune_lib.warehouse.turns import FileTurn, TurnTimeout

# One attached lake per (process, url, data path): attaching costs an extension load and a catalog round trip.
_LAKES: dict[tuple[int, str, str | None], duckdb.DuckDBPyConnection] = {}
_LAKES_LOCK = threading.Lock()
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KIND_VALUE = {k: k.value for k in EventKind}
_KIND_OF = {k.value: k for k in EventKind}
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


@contextlib.contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """BEGIN, then COMMIT when the block ends or ROLLBACK (best effort) and re-raise when it fails."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
        con.execute("COMMIT")
    except Exception:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while a bulk read builds tens of thousands of acyclic objects (Events, payload dicts).

    Each young-generation collection would otherwise traverse them again as they are promoted, which
    doubled the rebuild time of a 500-log read in a process that already holds many objects. The
    collector's previous state is restored on the way out.
    """
    global _GC_PAUSES, _GC_WAS_ENABLED
    with _GC_LOCK:  # reads in several threads: the first in pauses the collector, the last out restores it
        if _GC_PAUSES == 0:
            _GC_WAS_ENABLED = gc.isenabled()
            gc.disable()
        _GC_PAUSES += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_PAUSES -= 1
            if _GC_PAUSES == 0 and _GC_WAS_ENABLED:
                gc.enable()


_GC_LOCK = threading.Lock()
_GC_PAUSES = 0
_GC_WAS_ENABLED = True


_LOCK_MARKERS = ("Could not set lock", "Conflicting lock", "lock on file", "database is locked")


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where a trajectory came from: the Dagster run and asset, the model, and the data it used."""

    run_id: str | None = None
    asset_key: str | None = None
    partition: str | None = None
    model_version: str | None = None
    adapter_version: str | None = None
    qa_item_ids: tuple[str, ...] = ()
    chunk_ids: tuple[str, ...] = ()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    teacher_kind: str | None = None
    teacher_version: str | None = None


class WarehouseError(RuntimeError):
    """A warehouse operation failed; the message names the table, id or file."""


def _ident(name: str) -> str:
    if not _IDENT.match(name):
        raise WarehouseError(f"invalid table or column name {name!r}")
    return name


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


_BATCH_RULES = (
    ("events naming trajectories not in this batch",
     "SELECT DISTINCT trajectory_id FROM _new_events WHERE trajectory_id NOT IN (SELECT id FROM _new_traj)"),
    ("unknown event kinds", "SELECT DISTINCT kind FROM _new_events WHERE kind NOT IN ({kinds})"),
    ("REWARD events without a scope in (step, turn, episode), or a scope on another kind",
     "SELECT trajectory_id, seq, kind, scope FROM _new_events WHERE (kind = 'reward') <> coalesce(scope IN ('step', 'turn', 'episode'), false)"),
    ("event seq not 0..n_events-1 per trajectory",
     "SELECT t.id, t.n_events, count(e.seq), min(e.seq), max(e.seq), count(DISTINCT e.seq) FROM _new_traj t "
     "LEFT JOIN _new_events e ON e.trajectory_id = t.id GROUP BY ALL "
     "HAVING count(e.seq) <> coalesce(t.n_events, count(e.seq)) OR count(DISTINCT e.seq) <> count(e.seq) "
     "OR (count(e.seq) > 0 AND (min(e.seq) <> 0 OR max(e.seq) <> count(e.seq) - 1))"),
    ("token spans outside 0 <= start <= end <= len(token_ids)",
     "SELECT e.trajectory_id, e.seq, e.span_start, e.span_end, len(t.token_ids) FROM _new_events e JOIN _new_traj t ON t.id = e.trajectory_id "
     "WHERE (e.span_start IS NULL) <> (e.span_end IS NULL) OR e.span_start < 0 OR e.span_end < e.span_start "
     "OR (t.token_ids IS NOT NULL AND e.span_end > len(t.token_ids))"),
    ("overlapping or out-of-order token spans",
     "SELECT trajectory_id, seq, span_start, prev_end FROM (SELECT trajectory_id, seq, span_start, "
     "max(span_end) OVER (PARTITION BY trajectory_id ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end "
     "FROM _new_events WHERE span_start IS NOT NULL) WHERE span_start < prev_end"),
)


def _retry_conflicts(fn, timeout_s: float):
    """Run ``fn``; on a DuckLake commit conflict or a busy catalog, back off and run it again."""
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        try:
            return fn()
        except duckdb.Error as exc:
            if not lake_retryable(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)


def _lake_retrying(method):
    """On a lake, run the whole call again when the catalog was busy or another writer committed first.

    Every statement on a DuckLake connection reads the catalog (a SQLite catalog answers "database is
    locked" while another process commits), so reads retry too; writes are transactions or idempotent upserts.
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if not self.is_lake:
            return method(self, *args, **kwargs)
        return _retry_conflicts(lambda: method(self, *args, **kwargs), self.lock_timeout_s)

    return wrapper


def _check_batch(con: duckdb.DuckDBPyConnection) -> None:
    """The EventLog contract on an Arrow batch (registered as _new_traj/_new_events): a WarehouseError naming the rows."""
    kinds = ", ".join(f"'{v}'" for v in _KIND_VALUE.values())
    for problem, sql in _BATCH_RULES:
        bad = con.execute(sql.format(kinds=kinds) + " LIMIT 5").fetchall()
        if bad:
            raise WarehouseError(f"append_arrow rejected the batch: {problem}: {bad}")


class _FileAttachment:
    """A DuckDB file attached to this process's in-memory host DuckDB while calls use it (reference counted).

    Attached on the first call, detached (which checkpoints and releases the file lock) when the last one
    ends; calls in several threads share one attachment, each on its own cursor. While attached, the process
    holds the file's turn (:mod:`agenttune_lib.warehouse.turns`), so processes sharing the file wait in line
    instead of polling DuckDB's lock; one thread per process waits for the turn, the others then join it.
    """

    _lock = threading.Lock()
    _host: tuple[int, duckdb.DuckDBPyConnection] | None = None
    _open: dict[str, "_FileAttachment"] = {}
    _turn_locks: dict[str, threading.Lock] = {}

    def __init__(self, path: str, alias: str, read_only: bool, host: duckdb.DuckDBPyConnection, turn: FileTurn) -> None:
        self.path, self.alias, self.read_only, self.host, self.users, self.turn = path, alias, read_only, host, 0, turn

    @classmethod
    def _join(cls, key: str, read_only: bool) -> "_FileAttachment | None":
        """The attachment in use, with one more user, when it serves this call (call with ``_lock`` held)."""
        if cls._host is None or cls._host[0] != os.getpid():  # a forked child makes its own host
            cls._host, cls._open, cls._turn_locks = (os.getpid(), duckdb.connect(":memory:")), {}, {}
        att = cls._open.get(key)
        if att is not None and (read_only or not att.read_only):
            att.users += 1
            return att
        return None

    @classmethod
    def acquire(cls, path: str, read_only: bool, timeout_s: float) -> "_FileAttachment":
        key = os.path.abspath(path)
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            with cls._lock:
                att = cls._join(key, read_only)
                if att is not None:
                    return att
                busy = key in cls._open  # attached read-only by another call and this one writes
                turn_lock = cls._turn_locks.setdefault(key, threading.Lock())
            if not busy:
                # one thread of this process waits for the file's turn; the rest join its attachment
                if not turn_lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
                    raise WarehouseError(f"cannot open warehouse {path}: waited {timeout_s:.0f} s for the file's turn "
                                         "(another call in this process is waiting for it)")
                try:
                    with cls._lock:
                        att = cls._join(key, read_only)
                        if att is not None:
                            return att
                    turn = FileTurn(key)
                    try:
                        turn.take(max(deadline - time.monotonic(), 0.0))
                    except TurnTimeout as exc:
                        raise WarehouseError(f"cannot open warehouse {path}: {exc}") from exc
                    att = cls._attach(path, key, read_only, turn, deadline)
                    if att is not None:
                        return att
                finally:
                    turn_lock.release()
            elif time.monotonic() > deadline:
                raise WarehouseError(f"cannot open warehouse {path} for writing: still attached read-only in this process")
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)

    @classmethod
    def _attach(cls, path: str, key: str, read_only: bool, turn: FileTurn, deadline: float) -> "_FileAttachment | None":
        """ATTACH with the turn held; None (turn given back) while a process outside the turns holds DuckDB's lock."""
        with cls._lock:
            host = cls._host[1]  # type: ignore[index]
            alias = "wh_" + hashlib.sha1(key.encode()).hexdigest()[:16]
            try:
                host.execute(f"ATTACH '{key.replace(chr(39), chr(39) * 2)}' AS {alias}" + (" (READ_ONLY)" if read_only else ""))
            except (duckdb.IOException, duckdb.ConnectionException, duckdb.BinderException) as exc:
                turn.give()
                if not any(m in str(exc) for m in _LOCK_MARKERS) or time.monotonic() > deadline:
                    raise WarehouseError(f"cannot open warehouse {path}: {exc}") from exc
                return None
            except BaseException:
                turn.give()
                raise
            att = cls._open[key] = cls(path, alias, read_only, host, turn)
            att.users = 1
            return att

    def cursor(self) -> duckdb.DuckDBPyConnection:
        cur = self.host.cursor()
        cur.execute(f"USE {self.alias}")
        return cur

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users == 0 and self._open.get(os.path.abspath(self.path)) is self:
                del self._open[os.path.abspath(self.path)]
                try:
                    self.host.execute(f"DETACH {self.alias}")
                finally:
                    self.turn.give()


class Warehouse:
    """EventLog tables and lineage tables in a DuckDB file or a DuckLake (path only; pickle-safe).

    ``path`` is a DuckDB file, or a DuckLake URL (``ducklake:sqlite:<catalog file>`` or
    ``ducklake:postgres:<dsn>``, see :mod:`agenttune_lib.warehouse.lake`) with its Parquet files under
    ``data_path``. On a lake, writers in several processes append at once (commit conflicts are
    retried), readers never wait, and :meth:`snapshot_id` / ``read_logs(snapshot=)`` give exact
    time travel.
    """

    def __init__(self, path: str | Path, lock_timeout_s: float = 120.0, data_path: str | Path | None = None) -> None:
        self.path = str(path)
        self.lock_timeout_s = lock_timeout_s
        self.data_path = str(data_path) if data_path is not None else None
        self._schema_ready = False

    @property
    def is_lake(self) -> bool:
        return is_lake(self.path)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "lock_timeout_s": self.lock_timeout_s, "data_path": self.data_path, "_schema_ready": False}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"data_path": None, **state})

    def __repr__(self) -> str:
        return f"Warehouse({self.path!r})"

    # -- connections -----------------------------------------------------------
    @contextlib.contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection; waits with jittered backoff while another process holds the file.

        A DuckDB file is attached, for the length of the call, to one in-memory DuckDB kept per process
        (creating a DuckDB instance costs about 7 ms, an ATTACH a third of one); the file's lock is held
        only while some call in this process is using it, as with a connection per call. On a lake it is a
        cursor on the process's DuckDB with the lake attached: no file lock to wait for.
        """
        if self.is_lake:
            con = self._lake_cursor()
            try:
                if not self._schema_ready:
                    self._ensure_schema(con)
                yield con
            finally:
                con.close()
            return
        if read_only and not Path(self.path).exists():
            raise WarehouseError(f"warehouse file {self.path} does not exist yet")
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        attachment = _FileAttachment.acquire(self.path, read_only, self.lock_timeout_s)
        try:
            con = attachment.cursor()
            try:
                if not attachment.read_only and not self._schema_ready:
                    self._ensure_schema(con)
                yield con
            finally:
                con.close()
        finally:
            attachment.release()

    def _ensure_schema(self, con: duckdb.DuckDBPyConnection) -> None:
        """The EventLog tables and the events view; a warehouse written with a separate events table has it moved
        into the ``events`` column first, in one transaction (nothing is dropped before it is copied)."""
        run = (lambda stmt: _retry_conflicts(lambda: con.execute(stmt), self.lock_timeout_s)) if self.is_lake else con.execute
        for stmt in CORE_DDL:
            run(stmt)
        if not self.is_lake:
            con.execute(TRAJECTORY_ID_INDEX)
        kind = con.execute("SELECT table_type FROM information_schema.tables WHERE table_catalog = current_database() "
                           "AND table_schema = 'main' AND table_name = 'events'").fetchone()
        if kind is not None and kind[0] == "BASE TABLE":
            def migrate() -> None:
                with _transaction(con):
                    ids, texts = event_columns.texts_from_rows(con.execute("SELECT * FROM events").fetch_arrow_table())
                    con.register("_migrated", pa.table({"id": pa.array(ids, pa.string()), "events": pa.array(texts, pa.string())}))
                    con.execute("UPDATE trajectories SET events = m.events FROM _migrated m WHERE trajectories.id = m.id")
                    con.unregister("_migrated")
                    con.execute("UPDATE trajectories SET events = '{\"kind\":[],\"payload\":[]}' WHERE events IS NULL")
                    con.execute("DROP TABLE events")
                    con.execute(EVENTS_VIEW)
            _retry_conflicts(migrate, self.lock_timeout_s) if self.is_lake else migrate()
        elif kind is None:
            run(EVENTS_VIEW)
        self._schema_ready = True

    @_lake_retrying
    def _lake_cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor on this process's DuckDB with the lake attached: extensions load and the catalog attaches once per process.

        Each cursor is its own connection (own transaction, own registered views) on the shared database, and
        DuckLake reads the catalog's latest snapshot at the start of every transaction, so other writers'
        commits are seen as with a fresh connection.
        """
        key = (os.getpid(), self.path, self.data_path)
        with _LAKES_LOCK:
            parent = _LAKES.get(key)
            if parent is None:
                try:
                    parent = open_lake(self.path, self.data_path, read_only=False, timeout_s=self.lock_timeout_s)
                except LakeError as exc:
                    raise WarehouseError(str(exc)) from exc
                _LAKES[key] = parent
            cur = parent.cursor()
        cur.execute(f"USE {LAKE_ALIAS}")
        return cur

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        with self.connect() as con:
            return con.execute(sql, params or []).fetchall()

    @_lake_retrying
    def query_arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        with self.connect() as con:
            return con.sql(sql, params=list(params) if params else None).to_arrow_table()

    @_lake_retrying
    def tables(self) -> list[str]:
        with self.connect() as con:
            return [r[0] for r in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema='main' AND table_catalog = current_database() ORDER BY 1"
            ).fetchall()]

    def has_table(self, name: str) -> bool:
        return name in self.tables()

    # -- EventLogs -------------------------------------------------------------
    @_lake_retrying
    def append_arrow(self, trajectories: pa.Table, events: pa.Table, _validated: bool = False) -> int:
        """Bulk append pre-built Arrow tables (as ``logs_to_arrow`` makes); replaces any trajectory whose id is
        already stored.

        The batch is checked against the EventLog contract first (see ``_BATCH_RULES``); each trajectory's
        events are then stored in its row, in seq order, their payload texts exactly as given.
        """
        if trajectories.num_rows == 0:
            return 0
        ids = trajectories.column("id").to_pylist()
        if len(set(ids)) != len(ids):
            raise WarehouseError("duplicate trajectory ids within one append batch")
        if "events" in trajectories.column_names:  # the events table is what this call stores
            trajectories = trajectories.drop_columns(["events"])
        with self.connect() as con:
            con.register("_new_traj", trajectories)
            con.register("_new_events", events)
            try:
                if not _validated:
                    _check_batch(con)
                event_ids, texts = event_columns.texts_from_rows(events)
                con.register("_new_texts", pa.table({"id": pa.array(event_ids, pa.string()), "events": pa.array(texts, pa.string())}))
                cols = ", ".join(f'"{c}"' for c in trajectories.column_names)
                self._write(con, "_new_traj", cols + ", events",
                            f"SELECT {', '.join(f't.{c}' for c in trajectories.column_names)}, "
                            f"coalesce(x.events, '{_NO_EVENTS}') FROM _new_traj t LEFT JOIN _new_texts x ON x.id = t.id")
            finally:
                for name in ("_new_traj", "_new_events", "_new_texts"):
                    with contextlib.suppress(duckdb.Error):
                        con.unregister(name)
        return trajectories.num_rows

    def _write(self, con: duckdb.DuckDBPyConnection, new: str, cols: str, select: str) -> None:
        """Replace the trajectories whose ids the registered ``new`` holds with ``select``'s rows, in one transaction."""
        with _transaction(con):
            # Probe first: a fresh batch (the usual case) then deletes nothing.
            replaced = con.execute(f"SELECT count(*) FROM trajectories WHERE id IN (SELECT id FROM {new})").fetchone()[0]
            if replaced:
                con.execute(f"DELETE FROM trajectories WHERE id IN (SELECT id FROM {new})")
            con.execute(f"INSERT INTO trajectories ({cols}) {select}")

    @_lake_retrying
    def _append_stored(self, batch: pa.Table) -> int:
        """Append rows already in the stored form (``_stored_batch``: from EventLogs, which enforced the contract)."""
        with self.connect() as con:
            con.register("_new_traj", batch)
            try:
                cols = ", ".join(f'"{c}"' for c in batch.column_names)
                self._write(con, "_new_traj", cols, f"SELECT {cols} FROM _new_traj")
            finally:
                con.unregister("_new_traj")
        return batch.num_rows

    def append_logs(
        self,
        logs: Sequence[EventLog],
        provenance: Provenance | Sequence[Provenance | None] | None = None,
        source: str | None = None,
    ) -> int:
        """Append EventLogs with their provenance; idempotent on log id (last write wins)."""
        if isinstance(logs, (str, bytes, EventLog)) or not isinstance(logs, Sequence | Iterable):
            raise WarehouseError(f"append_logs takes a list of EventLogs, got a {type(logs).__name__} ({logs!r:.60})")
        logs = list(logs)
        for i, log in enumerate(logs):
            if not isinstance(log, EventLog):
                raise WarehouseError(f"append_logs: item {i} is a {type(log).__name__} ({log!r:.60}), not an EventLog")
        by_id: dict[str, int] = {}
        for i, log in enumerate(logs):
            by_id[log.id] = i
        if len(by_id) != len(logs):
            keep = sorted(by_id.values())
            provs = provenance if provenance is None or isinstance(provenance, Provenance) else [list(provenance)[i] for i in keep]
            logs = [logs[i] for i in keep]
            provenance = provs
        return self._append_stored(_stored_batch(logs, provenance, source))

    @_lake_retrying
    def read_logs(
        self,
        ids: Sequence[str] | None = None,
        source: str | None = None,
        run_id: str | None = None,
        where: str | None = None,
        params: Sequence[Any] | None = None,
        snapshot: int | None = None,
    ) -> list[EventLog]:
        """EventLogs back from the warehouse, losslessly, in insertion order of their ids.

        ``snapshot`` (a lake only) reads the tables as they were at that DuckLake snapshot.
        """
        at = ""
        if snapshot is not None:
            if not self.is_lake:
                raise WarehouseError(f"read_logs(snapshot={snapshot}) needs a DuckLake warehouse; {self.path} is a DuckDB file")
            at = f" AT (VERSION => {int(snapshot)})"
        clauses, args = [], []
        if ids is not None:
            ids = list(ids)
            if len(ids) == 1:  # an equality filter: a DuckDB file's index finds the row
                clauses.append("t.id = ?")
                args.append(ids[0])
            else:
                clauses.append("t.id IN (SELECT unnest(?))")
                args.append(ids)
        if source is not None:
            clauses.append("t.source = ?")
            args.append(source)
        if run_id is not None:
            clauses.append("t.run_id = ?")
            args.append(run_id)
        if where:
            clauses.append(f"({where})")
            args.extend(params or [])
        cond = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        # One row per log, its events stored in it: a read by id touches the rows of the logs it asks for only.
        # Arrow, not fetchall(): DuckDB fills C arrays and each column becomes one Python list.
        with self.connect() as con:
            traj = con.execute(
                f"SELECT t.id, t.tier, t.metadata, t.token_ids, {'t.events' if self._rows_hold_events(con, at) else 'NULL AS events'}, "
                f"t.created_at, t._row FROM (SELECT *, rowid AS _row FROM trajectories{at}) t{cond}", args
            ).fetch_arrow_table()
            if traj.num_rows and traj.column("events").null_count == traj.num_rows and at:
                traj = self._events_from_table(con, traj, at)
        if traj.num_rows == 0:
            return []
        # Insertion order, sorted here (an order of row numbers): DuckDB's ORDER BY would move every stored text.
        order = pc.sort_indices(traj, sort_keys=[("created_at", "ascending"), ("_row", "ascending")]).to_pylist()
        with _gc_paused():
            return self._rebuild(*([col[i] for i in order] for col in
                                   (traj.column(c).to_pylist() for c in ("id", "tier", "metadata", "token_ids", "events"))))

    @staticmethod
    def _rows_hold_events(con: duckdb.DuckDBPyConnection, at: str) -> bool:
        """Whether ``trajectories`` (at the snapshot ``at``) has the events column: a snapshot taken before the
        events moved into their rows has a separate events table instead."""
        if not at:
            return True
        return "events" in {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM trajectories{at}").fetchall()}

    @staticmethod
    def _events_from_table(con: duckdb.DuckDBPyConnection, traj: pa.Table, at: str) -> pa.Table:
        """``traj`` with its events column filled from the separate events table of an older snapshot ``at``."""
        con.register("_want", traj.select(["id"]))
        try:
            by_id = dict(zip(*event_columns.texts_from_rows(
                con.execute(f"SELECT * FROM events{at} WHERE trajectory_id IN (SELECT id FROM _want)").fetch_arrow_table())))
        finally:
            con.unregister("_want")
        filled = pa.array([by_id.get(i, _NO_EVENTS) for i in traj.column("id").to_pylist()], pa.string())
        return traj.set_column(traj.schema.get_field_index("events"), "events", filled)

    def _rebuild(self, ids: list[str], tiers: list[str], metas: list[str | None], tokens: list[Any],
                 texts: list[str | None]) -> list[EventLog]:
        """EventLogs from trajectories rows (their columns as lists) with their stored events.

        Rows were validated on the way in (EventLog construction or append_arrow's batch check) and the GX
        suites re-check the stored tables, so logs are rebuilt without a second validation pass; stored text
        that does not describe a log (edited by hand) is a WarehouseError naming the trajectory.
        """
        try:
            events = event_columns.decode_column(texts, ids, f"warehouse {self.path}")
        except event_columns.EventColumnsError as exc:
            raise WarehouseError(str(exc)) from None
        return [
            event_columns.stored_log(evs, tier, tid, _json_load(meta) if meta else {}, tok)
            for tid, tier, meta, tok, evs in zip(ids, tiers, metas, tokens, events)
        ]

    @_lake_retrying
    def snapshot_id(self) -> int | None:
        """The lake's current snapshot (what an adapter records as the rows it trained on); None for a DuckDB file."""
        if not self.is_lake:
            return None
        with self.connect() as con:
            return con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0]

    def get_log(self, trajectory_id: str) -> EventLog:
        logs = self.read_logs(ids=[trajectory_id])
        if not logs:
            raise KeyError(f"no trajectory {trajectory_id!r} in warehouse {self.path}")
        return logs[0]

    @_lake_retrying
    def count(self, table: str) -> int:
        with self.connect() as con:
            return con.execute(f"SELECT count(*) FROM {_ident(table)}").fetchone()[0]

    # -- other tables ------------------------------------------------------------
    @_lake_retrying
    def upsert_arrow(self, table: str, data: pa.Table, key: str | Sequence[str] = "id", add_columns: Sequence[str] = ()) -> int:
        """Create ``table`` from ``data``'s schema if missing, then replace rows with matching key(s).

        A column the stored table lacks is an error (a misspelt column must not become a new one), except
        the ``add_columns`` a newer writer names: those are added, and older rows read them as NULL.
        """
        _ident(table)
        keys = [key] if isinstance(key, str) else list(key)
        for k in keys:
            _ident(k)
            if k not in data.column_names:
                raise WarehouseError(f"upsert into {table}: key column {k!r} is not in the data")
        if data.num_rows == 0:
            with self.connect() as con:
                con.register("_upsert", data)
                con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM _upsert LIMIT 0")
            return 0
        with self.connect() as con:
            con.register("_upsert", data)
            with _transaction(con):
                con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM _upsert LIMIT 0")
                existing = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
                missing = [c for c in data.column_names if c not in existing]
                unknown = [c for c in missing if c not in add_columns]
                if unknown:
                    raise WarehouseError(f"upsert into {table}: columns {unknown} are not in the stored table {existing}")
                if missing:
                    for name, sql_type in con.execute("SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM _upsert)").fetchall():
                        if name in missing:
                            _ident(name)
                            con.execute(f'ALTER TABLE {table} ADD COLUMN "{name}" {sql_type}')
                match = " AND ".join(f't."{k}" IS NOT DISTINCT FROM u."{k}"' for k in keys)
                con.execute(f"DELETE FROM {table} t WHERE EXISTS (SELECT 1 FROM _upsert u WHERE {match})")
                cols = ", ".join(f'"{c}"' for c in data.column_names)
                con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _upsert")
        return data.num_rows

    # -- lineage -----------------------------------------------------------------
    @_lake_retrying
    def trajectory_lineage(self, trajectory_id: str) -> dict[str, Any]:
        """The rows a trajectory came from: its provenance, QA items, chunks and documents."""
        with self.connect() as con:
            row = con.execute(
                "SELECT id, source, task, run_id, asset_key, partition, model_version, adapter_version, qa_item_ids, chunk_ids, created_at "
                "FROM trajectories WHERE id = ?",
                [trajectory_id],
            ).fetchone()
            if row is None:
                raise KeyError(f"no trajectory {trajectory_id!r} in warehouse {self.path}")
            cols = ["id", "source", "task", "run_id", "asset_key", "partition", "model_version", "adapter_version", "qa_item_ids", "chunk_ids", "created_at"]
            out: dict[str, Any] = {"trajectory": dict(zip(cols, row))}
            out["trajectory"]["created_at"] = str(out["trajectory"]["created_at"])
            tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database()").fetchall()}
            qa_ids = list(row[8] or [])
            chunk_ids = set(row[9] or [])
            out["qa_items"] = []
            if qa_ids and "qa_items" in tables:
                qa = con.sql("SELECT * FROM qa_items WHERE qa_id IN (SELECT unnest(?))", params=[qa_ids]).to_arrow_table().to_pylist()
                out["qa_items"] = qa
                for item in qa:
                    chunk_ids.update(item.get("gold_chunk_ids") or [])
            out["chunks"] = []
            doc_ids: set[str] = set()
            if chunk_ids and "chunks" in tables:
                chunks = con.execute(
                    "SELECT chunk_id, doc_id FROM chunks WHERE chunk_id IN (SELECT unnest(?))", [sorted(chunk_ids)]
                ).fetchall()
                out["chunks"] = [{"chunk_id": c, "doc_id": d} for c, d in chunks]
                doc_ids = {d for _, d in chunks}
            out["documents"] = []
            if doc_ids and "documents" in tables:
                out["documents"] = [
                    {"doc_id": d, "source": s, "path": p, "title": t}
                    for d, s, p, t in con.execute(
                        "SELECT doc_id, source, path, title FROM documents WHERE doc_id IN (SELECT unnest(?))", [sorted(doc_ids)]
                    ).fetchall()
                ]
        return out

    @_lake_retrying
    def written_by_run(self, run_id: str) -> dict[str, list[Any]]:
        """Every row a Dagster run wrote, per table with a ``run_id`` column (keyed by the table's first column)."""
        out: dict[str, list[Any]] = {}
        with self.connect() as con:
            tables = con.execute(
                "SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id' AND table_schema = 'main' AND table_catalog = current_database() ORDER BY 1"
            ).fetchall()
            for (table,) in tables:
                first = con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = ? AND table_catalog = current_database() ORDER BY ordinal_position LIMIT 1", [table]
                ).fetchone()[0]
                keys = [r[0] for r in con.execute(f'SELECT "{first}" FROM {_ident(table)} WHERE run_id = ? ORDER BY 1', [run_id]).fetchall()]
                if keys:
                    out[table] = keys
        return out
