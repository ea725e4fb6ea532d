"""Access to a warehouse's storage: a DuckDB file attached per call (taking turns between processes) or a lake.

Transactions, retries on lake commit conflicts, and a pause of the cyclic GC during bulk reads.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import os
import random
import threading
import time
from collections.abc import Iterator

import duckdb

from agenttune_lib.warehouse.lake import retryable as lake_retryable
from agenttune_lib.warehouse.turns import FileTurn, TurnTimeout
from agenttune_lib.warehouse.types import WarehouseError

# One attached lake per (process, url, data path): attaching costs an extension load and a catalog round trip.
_LAKES: dict[tuple[int, str, str | None], duckdb.DuckDBPyConnection] = {}
_LAKES_LOCK = threading.Lock()


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


_DDL_LOCKS: dict[str, threading.Lock] = {}
_DDL_LOCKS_LOCK = threading.Lock()


def _ddl_lock(path: str) -> threading.Lock:
    """One lock per warehouse in this process: threads sharing an attachment create tables in turn (DuckDB
    refuses two concurrent ``CREATE ... IF NOT EXISTS`` of one table with a write-write conflict)."""
    key = path if "://" in path or path.startswith("ducklake:") else os.path.abspath(path)
    with _DDL_LOCKS_LOCK:
        return _DDL_LOCKS.setdefault(key, threading.Lock())


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
