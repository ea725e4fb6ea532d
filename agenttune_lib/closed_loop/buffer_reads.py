"""Reading a training buffer: its stats (the state file a sensor tick reads, or the warehouse), offsets, examples, batches."""
from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import Any


from agenttune_lib.closed_loop.types import TrainingExample

from agenttune_lib.closed_loop.buffer_records import BufferStats, RetrainBatch


class BufferReads:
    """Mixed into TrainingBuffer: needs its ``warehouse``, ``name`` and ``_tx``."""

    # -- the state file: what a sensor tick reads without opening the warehouse ------------------
    @property
    def state_path(self) -> Path | None:
        """``<warehouse file>.buffer-<name>.json`` beside a file warehouse; None for a warehouse without a path."""
        path = getattr(self.warehouse, "path", None)
        if not path or str(path).startswith(("ducklake:", "md:")):
            return None
        return Path(f"{path}.buffer-{self.name}.json")

    def _publish(self, stats: BufferStats) -> None:
        """Write committed stats atomically; a newer version already on disk is never overwritten by an older one."""
        target = self.state_path
        if target is None:
            return
        import fcntl

        with open(f"{target}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                try:
                    on_disk = json.loads(target.read_text(encoding="utf-8")).get("version", -1)
                except (OSError, ValueError):
                    on_disk = -1
                if on_disk > stats.version:
                    return
                tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
                tmp.write_text(json.dumps(stats.to_dict(), sort_keys=True), encoding="utf-8")
                os.replace(tmp, target)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def cached_stats(self) -> BufferStats:
        """The last committed stats from the state file (no warehouse connection); the warehouse when there is no file yet.

        Every write to the buffer publishes the file after its commit, so it is at most as old as
        the last transaction; the tick re-reads the warehouse before it drains.
        """
        target = self.state_path
        if target is not None:
            try:
                return BufferStats.from_dict(json.loads(target.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError, KeyError):
                pass
        stats = self.stats()
        self._publish(stats)
        return stats

    # -- reads -----------------------------------------------------------------------
    def stats(self, con: Any | None = None) -> BufferStats:
        """The figures the trigger reads: one state-row lookup plus a lookup over distinct causes."""
        return self._tx(self._stats_in) if con is None else self._stats_in(con)

    def _stats_in(self, con: Any) -> BufferStats:
        st = self._state(con)
        rows = con.execute(
            "SELECT root_cause, n, trained FROM training_buffer_counts WHERE buffer = ? AND n > 0", [self.name]
        ).fetchall()
        counts = {c: n for c, n, _ in rows}
        untrained = sorted(((-n, c) for c, n, t in rows if not t))
        novel = (untrained[0][1], -untrained[0][0]) if untrained else None
        bn = st["baseline_n"]
        mean = st["baseline_sum"] / bn if bn else None
        std = math.sqrt(max(st["baseline_sumsq"] / bn - mean * mean, 0.0)) if bn else None
        return BufferStats(
            buffer=self.name,
            version=st["version"],
            capacity=st["capacity"],
            size=st["size"],
            accepted=st["accepted"],
            attempts=st["attempts"],
            dropped=st["dropped"],
            counts=counts,
            leader_cause=st["leader_cause"],
            leader_n=st["leader_n"],
            novel_cause=novel[0] if novel else None,
            novel_n=novel[1] if novel else 0,
            reward_window=st["reward_window"],
            baseline_n=bn,
            baseline_mean=mean,
            baseline_std=std,
            window_n=st["window_n"],
            window_mean=st["window_sum"] / st["window_n"] if st["window_n"] else None,
            created_at=st["created_at"],
            last_retrain_at=st["last_retrain_at"],
            retrain_batch=st["retrain_batch"],
            retrain_started_at=st["retrain_started_at"],
        )

    def offset(self, reader: str) -> int:
        """A detector's durable read offset (0 before its first commit)."""
        return self.position(reader)[0]

    def position(self, reader: str) -> tuple[int, str | None]:
        """(offset, identity of the file it was read from): (0, None) before the first commit."""
        def _body(con):
            return con.execute('SELECT "offset", identity FROM closed_loop_offsets WHERE reader = ?', [reader]).fetchall()
        rows = self._tx(_body)
        return (int(rows[0][0]), rows[0][1]) if rows else (0, None)

    def examples(self, limit: int | None = None) -> list[TrainingExample]:
        """Buffered examples, oldest first."""
        sql = "SELECT example FROM training_buffer WHERE buffer = ? ORDER BY seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        def _body(con):
            return [TrainingExample.from_dict(json.loads(r[0])) for r in con.execute(sql, [self.name]).fetchall()]
        return self._tx(_body)

    def read_batch(self, batch_id: str) -> RetrainBatch:
        """A drained batch, from the warehouse, by id."""
        def _body(con):
            meta = con.execute(
                "SELECT buffer, trigger, run_id, version FROM training_buffer_batches WHERE batch_id = ?", [batch_id]
            ).fetchall()
            meta = meta[0] if meta else None
            if meta is None:
                raise KeyError(f"no retrain batch {batch_id!r} in {self.warehouse!r}")
            rows = con.execute("SELECT example FROM training_buffer_batch_rows WHERE batch_id = ? ORDER BY seq", [batch_id]).fetchall()
            return meta, rows
        meta, rows = self._tx(_body)
        return RetrainBatch(
            batch_id=batch_id, buffer=meta[0], trigger=meta[1], run_id=meta[2], version=meta[3],
            examples=[TrainingExample.from_dict(json.loads(r[0])) for r in rows],
        )

    def batches(self) -> list[dict[str, Any]]:
        """Every retrain batch of this buffer, newest first."""
        def _body(con):
            cur = con.execute("SELECT * FROM training_buffer_batches WHERE buffer = ? ORDER BY created_at DESC", [self.name])
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r)) for r in cur.fetchall()]
        return self._tx(_body)
