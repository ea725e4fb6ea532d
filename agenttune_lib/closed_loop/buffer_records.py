"""The training buffer's records and tables: its DDL and Arrow schema, BufferStats, RetrainBatch, errors."""
from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pyarrow as pa

from agenttune_lib.closed_loop.types import TrainingExample

__all__ = ["BufferError", "RetrainRunning", "BufferStats", "RetrainBatch", "RETRAIN_ALGORITHMS", "retrain_rows"]

_DDL = [
    """CREATE TABLE IF NOT EXISTS training_buffer (
        buffer VARCHAR NOT NULL, seq BIGINT NOT NULL, example_id VARCHAR NOT NULL, failure_id VARCHAR,
        trajectory_id VARCHAR, root_cause VARCHAR NOT NULL, accepted BOOLEAN NOT NULL, source VARCHAR,
        trusted BOOLEAN, reward DOUBLE, example VARCHAR, added_at TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS training_buffer_state (
        buffer VARCHAR PRIMARY KEY, capacity BIGINT NOT NULL, version BIGINT NOT NULL, size BIGINT NOT NULL,
        accepted BIGINT NOT NULL, attempts BIGINT NOT NULL, dropped BIGINT NOT NULL, next_seq BIGINT NOT NULL,
        leader_cause VARCHAR, leader_n BIGINT NOT NULL,
        reward_window BIGINT NOT NULL, reward_n BIGINT NOT NULL, baseline_n BIGINT NOT NULL,
        baseline_sum DOUBLE NOT NULL, baseline_sumsq DOUBLE NOT NULL, window_n BIGINT NOT NULL, window_sum DOUBLE NOT NULL,
        created_at TIMESTAMPTZ NOT NULL, last_retrain_at TIMESTAMPTZ, retrain_batch VARCHAR,
        retrain_started_at TIMESTAMPTZ, updated_at TIMESTAMPTZ NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS training_buffer_counts (
        buffer VARCHAR NOT NULL, root_cause VARCHAR NOT NULL, n BIGINT NOT NULL, accepted BIGINT NOT NULL,
        trained BOOLEAN NOT NULL, PRIMARY KEY (buffer, root_cause))""",
    """CREATE TABLE IF NOT EXISTS training_buffer_rewards (
        buffer VARCHAR NOT NULL, slot BIGINT NOT NULL, reward DOUBLE NOT NULL, PRIMARY KEY (buffer, slot))""",
    """CREATE TABLE IF NOT EXISTS training_buffer_ledger (
        buffer VARCHAR NOT NULL, failure_id VARCHAR NOT NULL, outcome VARCHAR NOT NULL, reason VARCHAR,
        recorded_at TIMESTAMPTZ, PRIMARY KEY (buffer, failure_id))""",
    """CREATE TABLE IF NOT EXISTS training_buffer_batches (
        batch_id VARCHAR PRIMARY KEY, buffer VARCHAR NOT NULL, status VARCHAR NOT NULL, trigger VARCHAR,
        run_id VARCHAR, n_examples BIGINT, n_accepted BIGINT, causes VARCHAR, version BIGINT,
        created_at TIMESTAMPTZ, finished_at TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS training_buffer_batch_rows (
        batch_id VARCHAR NOT NULL, seq BIGINT NOT NULL, example_id VARCHAR NOT NULL, failure_id VARCHAR,
        trajectory_id VARCHAR, root_cause VARCHAR NOT NULL, accepted BOOLEAN NOT NULL, source VARCHAR,
        trusted BOOLEAN, reward DOUBLE, example VARCHAR, added_at TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS closed_loop_offsets (
        reader VARCHAR PRIMARY KEY, "offset" BIGINT NOT NULL, updated_at TIMESTAMPTZ)""",
    # Added later: the file identity an offset belongs to (a rotated log is followed, not misread),
    # and the drop-rate evidence a drained batch carries back when it is requeued.
    "ALTER TABLE closed_loop_offsets ADD COLUMN IF NOT EXISTS identity VARCHAR",
    "ALTER TABLE training_buffer_batches ADD COLUMN IF NOT EXISTS n_attempts BIGINT",
    "ALTER TABLE training_buffer_batches ADD COLUMN IF NOT EXISTS n_dropped BIGINT",
]

_ROW_COLS = "seq, example_id, failure_id, trajectory_id, root_cause, accepted, source, trusted, reward, example, added_at"


class BufferError(RuntimeError):
    """A buffer operation that cannot proceed; the message names the buffer and the reason."""


class RetrainRunning(BufferError):
    """Safety gate 1: a retrain batch is already out, so the buffer refuses to drain again."""


@dataclasses.dataclass(frozen=True)
class BufferStats:
    """Every figure the trigger conditions read, as of one buffer version."""

    buffer: str
    version: int
    capacity: int
    size: int
    accepted: int
    attempts: int
    dropped: int
    counts: dict[str, int]
    leader_cause: str | None
    leader_n: int
    novel_cause: str | None
    novel_n: int
    reward_window: int
    baseline_n: int
    baseline_mean: float | None
    baseline_std: float | None
    window_n: int
    window_mean: float | None
    created_at: dt.datetime
    last_retrain_at: dt.datetime | None
    retrain_batch: str | None
    retrain_started_at: dt.datetime | None

    @property
    def drop_rate(self) -> float:
        return self.dropped / self.attempts if self.attempts else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("created_at", "last_retrain_at", "retrain_started_at"):
            out[key] = out[key].isoformat() if out[key] is not None else None
        out["drop_rate"] = self.drop_rate
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BufferStats":
        """Inverse of ``to_dict`` (the state file)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        for key in ("created_at", "last_retrain_at", "retrain_started_at"):
            kw[key] = dt.datetime.fromisoformat(kw[key]) if kw.get(key) else None
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class RetrainBatch:
    """A drained set of examples handed to one retrain."""

    batch_id: str
    buffer: str
    trigger: str | None
    run_id: str | None
    version: int
    examples: list[TrainingExample]

    @property
    def accepted(self) -> list[TrainingExample]:
        return [e for e in self.examples if e.accepted]

    def dpo_rows(self) -> list[dict[str, Any]]:
        return [e.as_dpo_row() for e in self.accepted]

    def bco_rows(self) -> list[dict[str, Any]]:
        return [row for e in self.accepted for row in e.as_bco_rows()]

    def grpo_rows(self) -> list[dict[str, Any]]:
        return [e.as_grpo_row() for e in self.accepted]


#: What each retrain algorithm reads from a batch: DPO preference pairs, BCO labelled rows, GRPO multi-completion rows.
RETRAIN_ALGORITHMS = {"dpo": "dpo_rows", "bco": "bco_rows", "grpo": "grpo_rows"}


def retrain_rows(batch: RetrainBatch, algorithm: str) -> list[dict[str, Any]]:
    """The rows ``algorithm`` trains on from ``batch``; an algorithm that cannot consume a batch is a clear error."""
    if algorithm not in RETRAIN_ALGORITHMS:
        raise ValueError(f"retrain algorithm {algorithm!r} cannot consume closed-loop batch {batch.batch_id!r}: "
                         f"it reads one of {sorted(RETRAIN_ALGORITHMS)} (preference, labelled or multi-completion rows)")
    rows = getattr(batch, RETRAIN_ALGORITHMS[algorithm])()
    if not rows:
        raise ValueError(f"retrain batch {batch.batch_id!r} has no accepted examples, so no {algorithm} rows")
    return rows


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _rollback(con: Any) -> None:
    try:
        con.execute("ROLLBACK")
    except Exception:  # noqa: BLE001 - the transaction may already be aborted
        pass


_ARROW_SCHEMA = pa.schema([
    ("buffer", pa.string()), ("seq", pa.int64()), ("example_id", pa.string()), ("failure_id", pa.string()),
    ("trajectory_id", pa.string()), ("root_cause", pa.string()), ("accepted", pa.bool_()), ("source", pa.string()),
    ("trusted", pa.bool_()), ("reward", pa.float64()), ("example", pa.string()), ("added_at", pa.timestamp("us", tz="UTC")),
])
