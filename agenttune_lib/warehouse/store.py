"""The EventLog warehouse: EventLogs and lineage tables in one DuckDB file (or a DuckLake).

DuckDB lets one process hold a file read-write, and Dagster runs each step in its own
process, so every operation attaches the file for its own length only and retries with
backoff while another process holds the lock. The object holds only a path: it pickles to
rollout workers and run workers alike. A trajectory is one row of ``trajectories``, its
events stored in it (``columns``); ``events`` is a view with a row per event. Conversion to
Arrow lives in ``arrow``, storage access in ``connection``, lineage queries in ``lineage_queries``.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from agenttune_lib.events import EventLog
from agenttune_lib.warehouse import columns as event_columns
from agenttune_lib.warehouse.arrow import _NO_EVENTS, _json_load, _stored_batch, logs_to_arrow
from agenttune_lib.warehouse.batch_check import _check_batch
from agenttune_lib.warehouse.connection import (
    _LAKES,
    _LAKES_LOCK,
    _FileAttachment,
    _ddl_lock,
    _gc_paused,
    _lake_retrying,
    _retry_conflicts,
    _transaction,
)
from agenttune_lib.warehouse.lake import LAKE_ALIAS, LakeError, is_lake, open_lake
from agenttune_lib.warehouse.lineage_queries import LineageQueries
from agenttune_lib.warehouse.schema import CORE_DDL, EVENTS_VIEW, TRAJECTORY_ID_INDEX
from agenttune_lib.warehouse.types import Provenance, WarehouseError, _ident

__all__ = ["Warehouse", "Provenance", "WarehouseError", "logs_to_arrow"]
# Also importable from here as before the split: _gc_paused (tests) and _stored_batch (bench/eventlog_ingest.py).


class Warehouse(LineageQueries):
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

    def create_tables(self, con: duckdb.DuckDBPyConnection, *ddl: str) -> None:
        """Run ``CREATE ... IF NOT EXISTS`` statements one thread of this process at a time, retrying a conflict
        with a writer elsewhere; every caller that creates a table on first use goes through here."""
        with _ddl_lock(self.path):
            for stmt in ddl:
                _retry_conflicts(lambda: con.execute(stmt), self.lock_timeout_s)

    def _ensure_schema(self, con: duckdb.DuckDBPyConnection) -> None:
        """The EventLog tables and the events view; a warehouse written with a separate events table has it moved
        into the ``events`` column first, in one transaction (nothing is dropped before it is copied)."""
        with _ddl_lock(self.path):
            self._ensure_schema_locked(con)
        self._schema_ready = True

    def _ensure_schema_locked(self, con: duckdb.DuckDBPyConnection) -> None:
        run = lambda stmt: _retry_conflicts(lambda: con.execute(stmt), self.lock_timeout_s)  # noqa: E731
        for stmt in CORE_DDL:
            run(stmt)
        if not self.is_lake:
            run(TRAJECTORY_ID_INDEX)
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

        The batch is checked against the EventLog contract first (see ``batch_check._BATCH_RULES``); each trajectory's
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
                self.create_tables(con, f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM _upsert LIMIT 0")
            return 0
        with self.connect() as con:
            con.register("_upsert", data)
            self.create_tables(con, f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM _upsert LIMIT 0")
            with _transaction(con):
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
