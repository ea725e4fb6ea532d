"""TrainingBuffer: a durable FIFO-capped buffer of training examples in the warehouse.

Sensors and runs are separate processes, so the buffer lives in DuckDB. Every figure the
six trigger conditions read (size, per-root-cause counts, accepted count, the dominant
cause, drop counters, reward windows, the detector's read offsets) is updated in the same
transaction that adds to or drains the buffer, so ``stats()`` is a point lookup whose cost
does not grow with the number of buffered examples.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from agenttune_lib.closed_loop.buffer_reads import BufferReads
from agenttune_lib.closed_loop.buffer_records import (
    _ARROW_SCHEMA,
    _DDL,
    _ROW_COLS,
    RETRAIN_ALGORITHMS,
    BufferError,
    BufferStats,
    RetrainBatch,
    RetrainRunning,
    _now,
    _rollback,
    retrain_rows,
)
from agenttune_lib.closed_loop.types import TrainingExample

__all__ = ["TrainingBuffer", "BufferError", "RetrainRunning", "BufferStats", "RetrainBatch", "RETRAIN_ALGORITHMS", "retrain_rows"]


class TrainingBuffer(BufferReads):
    """A named, FIFO-capped, durable buffer of TrainingExamples in a Warehouse.

    Adding, draining, reward observation and detector offsets commit together or not at all.
    """

    def __init__(self, warehouse: Any, name: str = "default", capacity: int = 10_000, reward_window: int = 50) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        if reward_window < 2:
            raise ValueError(f"reward_window must be >= 2, got {reward_window}")
        self.warehouse = warehouse
        self.name = name
        self.capacity = int(capacity)
        self.reward_window = int(reward_window)
        self._ready = False

    def __repr__(self) -> str:
        return f"TrainingBuffer({self.warehouse!r}, name={self.name!r}, capacity={self.capacity})"

    # -- transactions ------------------------------------------------------------
    def _tx(self, fn: Callable[[Any], Any], publish: bool = False) -> Any:
        """Run ``fn(con)`` in one write transaction, retried on an in-process write-write conflict.

        ``publish``: the transaction changed the state, so the stats it committed are written to
        the state file the sensors read (see ``cached_stats``).
        """
        import duckdb

        attempt = 0
        while True:
            with self.warehouse.connect() as con:
                self._ensure(con)
                con.execute("BEGIN TRANSACTION")
                try:
                    out = fn(con)
                    snapshot = self._stats_in(con) if publish else None
                    con.execute("COMMIT")
                    if snapshot is not None:
                        self._publish(snapshot)
                    return out
                except duckdb.TransactionException as exc:
                    _rollback(con)
                    attempt += 1
                    if attempt > 20 or "conflict" not in str(exc).lower():
                        raise
                except BaseException:
                    _rollback(con)
                    raise
            time.sleep(0.01 * attempt * (0.5 + random.random()))

    def _ensure(self, con: Any) -> None:
        if not self._ready:
            self.warehouse.create_tables(con, *_DDL)
            self._ready = True
        con.execute(
            "INSERT INTO training_buffer_state VALUES (?, ?, 0, 0, 0, 0, 0, 0, NULL, 0, ?, 0, 0, 0, 0, 0, 0, ?, NULL, NULL, NULL, ?) "
            "ON CONFLICT DO NOTHING",
            [self.name, self.capacity, self.reward_window, _now(), _now()],
        )

    def _state(self, con: Any) -> dict[str, Any]:
        cur = con.execute("SELECT * FROM training_buffer_state WHERE buffer = ?", [self.name])
        cols = [d[0] for d in cur.description]
        rows = cur.fetchall()
        row = rows[0] if rows else None
        if row is None:
            raise BufferError(f"buffer {self.name!r} has no state row in {self.warehouse!r}")
        return dict(zip(cols, row))

    # -- writes --------------------------------------------------------------------
    def add(
        self,
        examples: Sequence[TrainingExample] = (),
        dropped: Sequence[tuple[str, str]] = (),
        rewards: Sequence[float] = (),
        offsets: Mapping[str, int | tuple[int, str | None]] | None = None,
        now: dt.datetime | None = None,
        reward_keys: Sequence[str] | None = None,
    ) -> int:
        """Buffer examples, record dropped attempts (failure_id, reason), observe episode rewards
        and move detector read offsets (an int, or (offset, file identity)), all in one transaction.
        Returns how many examples were new.

        A failure id already in the ledger is skipped, so re-reading a source never double counts;
        a reward whose ``reward_keys`` entry (its episode id) was observed before is skipped too.
        """
        if reward_keys is not None and len(reward_keys) != len(rewards):
            raise ValueError(f"buffer {self.name!r}: {len(reward_keys)} reward_keys for {len(rewards)} rewards")
        now = now or _now()
        for r in rewards:
            if not isinstance(r, (int, float)) or isinstance(r, bool) or not math.isfinite(r):
                raise ValueError(f"buffer {self.name!r}: reward {r!r} is not a finite number")
        for ex in examples:
            if not isinstance(ex, TrainingExample):
                raise TypeError(f"buffer {self.name!r}: expected TrainingExample, got {type(ex).__name__}")
            if not ex.root_cause:
                raise ValueError(f"buffer {self.name!r}: example {ex.example_id!r} has no root_cause")
        def _body(con):
            fresh_rewards = self._new_rewards(con, list(rewards), list(reward_keys) if reward_keys is not None else None, now)
            return self._add_in(con, list(examples), list(dropped), fresh_rewards, dict(offsets or {}), now)
        return self._tx(_body, publish=True)

    def _new_rewards(self, con, rewards: list[float], keys: list[str] | None, now: dt.datetime) -> list[float]:
        """Rewards not observed before, by key (ledger rows ``reward:<key>``); unkeyed rewards all count."""
        if keys is None or not rewards:
            return rewards
        ids = [f"reward:{k}" for k in keys]
        known = {r[0] for r in con.execute(
            "SELECT failure_id FROM training_buffer_ledger WHERE buffer = ? AND failure_id IN (SELECT unnest(?))", [self.name, ids]
        ).fetchall()}
        out, seen = [], set()
        for rid, r in zip(ids, rewards):
            if rid not in known and rid not in seen:
                seen.add(rid)
                out.append(r)
        if seen:
            con.executemany("INSERT INTO training_buffer_ledger VALUES (?, ?, 'reward', NULL, ?)", [(self.name, rid, now) for rid in sorted(seen)])
        return out

    def _add_in(self, con, examples, dropped, rewards, offsets, now, from_ledger: bool = True, evidence: tuple[int, int] = (0, 0)) -> int:
        st = self._state(con)
        fresh: list[TrainingExample] = []
        seen: set[str] = set()
        if from_ledger:
            ids = [e.failure_id for e in examples] + [f for f, _ in dropped]
            known = set()
            if ids:
                known = {
                    r[0]
                    for r in con.execute(
                        "SELECT failure_id FROM training_buffer_ledger WHERE buffer = ? AND failure_id IN (SELECT unnest(?))",
                        [self.name, ids],
                    ).fetchall()
                }
            for e in examples:
                if e.failure_id not in known and e.failure_id not in seen:
                    fresh.append(e)
                    seen.add(e.failure_id)
            new_drops = []
            for fid, reason in dropped:
                if fid not in known and fid not in seen:
                    new_drops.append((fid, reason))
                    seen.add(fid)
            ledger = [(self.name, e.failure_id, "buffered" if e.accepted else "rejected", e.validation or None, now) for e in fresh]
            ledger += [(self.name, fid, "dropped", reason, now) for fid, reason in new_drops]
            if ledger:
                cols = list(zip(*ledger))
                con.register("_tb_ledger", pa.table({
                    "buffer": pa.array(cols[0], pa.string()), "failure_id": pa.array(cols[1], pa.string()),
                    "outcome": pa.array(cols[2], pa.string()), "reason": pa.array(cols[3], pa.string()),
                    "recorded_at": pa.array(cols[4], pa.timestamp("us", tz="UTC")),
                }))
                try:
                    con.execute("INSERT INTO training_buffer_ledger SELECT * FROM _tb_ledger").fetchall()
                finally:
                    con.unregister("_tb_ledger")
            attempts = st["attempts"] + len(fresh) + len(new_drops)
            n_dropped = st["dropped"] + len(new_drops) + sum(1 for e in fresh if not e.accepted)
        else:
            # A requeued batch brings back the attempts and drops it was drained with (the drop-rate gate's evidence).
            fresh = list(examples)
            attempts, n_dropped = st["attempts"] + evidence[0], st["dropped"] + evidence[1]
        seq = st["next_seq"]
        size, accepted = st["size"], st["accepted"]
        delta: dict[str, list[int]] = {}
        if fresh:
            rows = {c: [] for c in ("buffer", "seq", "example_id", "failure_id", "trajectory_id", "root_cause", "accepted", "source", "trusted", "reward", "example", "added_at")}
            for e in fresh:
                rows["buffer"].append(self.name)
                rows["seq"].append(seq)
                seq += 1
                rows["example_id"].append(e.example_id)
                rows["failure_id"].append(e.failure_id)
                rows["trajectory_id"].append(e.trajectory_id)
                rows["root_cause"].append(e.root_cause)
                rows["accepted"].append(bool(e.accepted))
                rows["source"].append(e.source)
                rows["trusted"].append(bool(e.trusted))
                rows["reward"].append(e.reward)
                rows["example"].append(json.dumps(e.to_dict(), sort_keys=True, default=str))
                rows["added_at"].append(now)
                d = delta.setdefault(e.root_cause, [0, 0])
                d[0] += 1
                d[1] += int(bool(e.accepted))
            table = pa.table(rows, schema=_ARROW_SCHEMA)
            con.register("_tb_new", table)
            try:
                con.execute("INSERT INTO training_buffer SELECT * FROM _tb_new")
            finally:
                con.unregister("_tb_new")
            size += len(fresh)
            accepted += sum(1 for e in fresh if e.accepted)
            overflow = size - self.capacity
            if overflow > 0:
                cutoff = seq - self.capacity
                for cause, n, acc in con.execute(
                    "SELECT root_cause, count(*), count(*) FILTER (WHERE accepted) FROM training_buffer "
                    "WHERE buffer = ? AND seq < ? GROUP BY root_cause",
                    [self.name, cutoff],
                ).fetchall():
                    d = delta.setdefault(cause, [0, 0])
                    d[0] -= n
                    d[1] -= acc
                    size -= n
                    accepted -= acc
                con.execute("DELETE FROM training_buffer WHERE buffer = ? AND seq < ?", [self.name, cutoff])
        leader, leader_n = st["leader_cause"], st["leader_n"]
        if delta:
            con.executemany(
                "INSERT INTO training_buffer_counts VALUES (?, ?, ?, ?, false) ON CONFLICT (buffer, root_cause) "
                "DO UPDATE SET n = training_buffer_counts.n + excluded.n, accepted = training_buffer_counts.accepted + excluded.accepted",
                [(self.name, c, d[0], d[1]) for c, d in delta.items()],
            )
            # The most frequent cause (not only a majority one), so T2 honours any ratio in (0, 1];
            # the rows are one per distinct root cause, so this stays cheap.
            current = dict(con.execute("SELECT root_cause, n FROM training_buffer_counts WHERE buffer = ? AND n > 0", [self.name]).fetchall())
            best = max(current.items(), key=lambda kv: (kv[1], kv[0]), default=(None, 0))
            leader, leader_n = (best[0], best[1]) if best[1] > 0 else (None, 0)
        rw = self._observe_rewards(con, st, rewards)
        for reader, offset in offsets.items():
            offset, identity = offset if isinstance(offset, tuple) else (offset, None)
            con.execute(
                'INSERT INTO closed_loop_offsets (reader, "offset", updated_at, identity) VALUES (?, ?, ?, ?) ON CONFLICT (reader) '
                'DO UPDATE SET "offset" = excluded."offset", updated_at = excluded.updated_at, identity = excluded.identity',
                [reader, int(offset), now, identity],
            )
        con.execute(
            "UPDATE training_buffer_state SET version = version + 1, size = ?, accepted = ?, attempts = ?, dropped = ?, "
            "next_seq = ?, leader_cause = ?, leader_n = ?, reward_n = ?, baseline_n = ?, baseline_sum = ?, baseline_sumsq = ?, "
            "window_n = ?, window_sum = ?, updated_at = ? WHERE buffer = ?",
            [size, accepted, attempts, n_dropped, seq, leader, leader_n, *rw, now, self.name],
        )
        return len(fresh)

    def _observe_rewards(self, con, st, rewards) -> tuple:
        """The first ``reward_window`` rewards since a reset form the baseline; later ones fill a ring."""
        n, bn, bs, bss, wn, ws = st["reward_n"], st["baseline_n"], st["baseline_sum"], st["baseline_sumsq"], st["window_n"], st["window_sum"]
        window = st["reward_window"]
        ring: dict[int, float] = {}
        for r in rewards:
            r = float(r)
            if bn < window:
                bn += 1
                bs += r
                bss += r * r
            else:
                slot = (n - bn) % window
                if wn == window:
                    old = ring.get(slot)
                    if old is None:
                        got = con.execute(
                            "SELECT reward FROM training_buffer_rewards WHERE buffer = ? AND slot = ?", [self.name, slot]
                        ).fetchall()
                        old = got[0][0] if got else 0.0
                    ws -= old
                else:
                    wn += 1
                ws += r
                ring[slot] = r
            n += 1
        if ring:
            con.executemany(
                "INSERT INTO training_buffer_rewards VALUES (?, ?, ?) ON CONFLICT (buffer, slot) DO UPDATE SET reward = excluded.reward",
                [(self.name, s, v) for s, v in ring.items()],
            )
        return (n, bn, bs, bss, wn, ws)

    def reset_reward_baseline(self) -> None:
        """Start a new baseline (after a deployment changes what serves)."""
        def _body(con):
            con.execute("DELETE FROM training_buffer_rewards WHERE buffer = ?", [self.name])
            con.execute(
                "UPDATE training_buffer_state SET version = version + 1, reward_n = 0, baseline_n = 0, baseline_sum = 0, "
                "baseline_sumsq = 0, window_n = 0, window_sum = 0, updated_at = ? WHERE buffer = ?",
                [_now(), self.name],
            )
        self._tx(_body, publish=True)

    def drain(self, trigger: str | None = None, run_id: str | None = None, batch_id: str | None = None, now: dt.datetime | None = None) -> RetrainBatch:
        """Atomically move every buffered example into a new retrain batch and mark a retrain running.

        Raises RetrainRunning when a batch is already out (safety gate 1), so two processes
        racing to drain get one batch between them, never two or a split.
        """
        now = now or _now()
        batch_id = batch_id or uuid.uuid4().hex
        def _body(con):
            st = self._state(con)
            if st["retrain_batch"] is not None:
                raise RetrainRunning(f"buffer {self.name!r}: retrain batch {st['retrain_batch']!r} is still running")
            if st["size"] == 0:
                raise BufferError(f"buffer {self.name!r} is empty; nothing to drain")
            causes = {c: n for c, n in con.execute(
                "SELECT root_cause, n FROM training_buffer_counts WHERE buffer = ? AND n > 0", [self.name]
            ).fetchall()}
            con.execute(
                f"INSERT INTO training_buffer_batch_rows SELECT ?, {_ROW_COLS} FROM training_buffer WHERE buffer = ?",
                [batch_id, self.name],
            )
            con.execute("DELETE FROM training_buffer WHERE buffer = ?", [self.name])
            # Causes count as trained (T5 "novel" no more) when the retrain finishes, not here: a run that dies requeues them novel.
            con.execute("UPDATE training_buffer_counts SET n = 0, accepted = 0 WHERE buffer = ?", [self.name])
            version = st["version"] + 1
            con.execute(
                "INSERT INTO training_buffer_batches (batch_id, buffer, status, trigger, run_id, n_examples, n_accepted, causes, version, "
                "created_at, finished_at, n_attempts, n_dropped) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                [batch_id, self.name, trigger, run_id, st["size"], st["accepted"], json.dumps(causes, sort_keys=True), version, now,
                 st["attempts"], st["dropped"]],
            )
            con.execute(
                "UPDATE training_buffer_state SET version = ?, size = 0, accepted = 0, attempts = 0, dropped = 0, "
                "leader_cause = NULL, leader_n = 0, retrain_batch = ?, retrain_started_at = ?, updated_at = ? WHERE buffer = ?",
                [version, batch_id, now, now, self.name],
            )
        self._tx(_body, publish=True)
        return self.read_batch(batch_id)

    def finish_retrain(
        self, batch_id: str, succeeded: bool, requeue: bool = False, now: dt.datetime | None = None, refused: bool = False
    ) -> None:
        """Close a retrain batch. A success stamps the last-retrain time; a failure may requeue its examples
        (with their drop-rate evidence); a candidate the gate refused closes the batch as ``refused``."""
        now = now or _now()
        if refused and (succeeded or requeue):
            raise ValueError(f"retrain batch {batch_id!r}: a refused batch is neither succeeded nor requeued")
        def _body(con):
            st = self._state(con)
            rows = con.execute("SELECT status, n_attempts, n_dropped FROM training_buffer_batches WHERE batch_id = ? AND buffer = ?", [batch_id, self.name]).fetchall()
            row = rows[0] if rows else None
            if row is None:
                raise BufferError(f"buffer {self.name!r} has no retrain batch {batch_id!r}")
            if row[0] != "running":
                raise BufferError(f"retrain batch {batch_id!r} is already {row[0]}")
            status = "succeeded" if succeeded else ("refused" if refused else ("requeued" if requeue else "failed"))
            con.execute("UPDATE training_buffer_batches SET status = ?, finished_at = ? WHERE batch_id = ?", [status, now, batch_id]).fetchall()
            if succeeded or refused:  # a candidate was trained on these causes (a refused one too: T5 must not re-fire on it for ever)
                causes = [c for (c,) in con.execute("SELECT DISTINCT root_cause FROM training_buffer_batch_rows WHERE batch_id = ?", [batch_id]).fetchall()]
                if causes:
                    con.execute(f"UPDATE training_buffer_counts SET trained = true WHERE buffer = ? AND root_cause IN ({', '.join('?' * len(causes))})",
                                [self.name, *causes]).fetchall()
            if st["retrain_batch"] == batch_id:
                con.execute(
                    "UPDATE training_buffer_state SET retrain_batch = NULL, retrain_started_at = NULL, version = version + 1, "
                    "last_retrain_at = CASE WHEN ? THEN ? ELSE last_retrain_at END, updated_at = ? WHERE buffer = ?",
                    [succeeded, now, now, self.name],
                ).fetchall()
            if requeue and not succeeded:
                back = [
                    TrainingExample.from_dict(json.loads(r[0]))
                    for r in con.execute("SELECT example FROM training_buffer_batch_rows WHERE batch_id = ? ORDER BY seq", [batch_id]).fetchall()
                ]
                self._add_in(con, back, [], [], {}, now, from_ledger=False, evidence=(int(row[1] or 0), int(row[2] or 0)))
        self._tx(_body, publish=True)
