"""RetrainingTrigger: the six conditions of paper Table 6 and the two safety gates."""
from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from agenttune_lib.closed_loop.buffer import BufferStats

__all__ = ["TriggerConfig", "TriggerFiring", "TriggerDecision", "RetrainingTrigger", "TRIGGERS"]

#: Trigger id -> Table 6 name (T2 and T5 carry the root cause after a colon when they fire).
TRIGGERS: dict[str, str] = {
    "T1": "total_failures_exceeded",
    "T2": "dominance",
    "T3": "enough_examples",
    "T4": "reward_drift",
    "T5": "novel_failure",
    "T6": "staleness",
}


@dataclasses.dataclass(frozen=True)
class TriggerConfig:
    """Thresholds with the paper's defaults; ``dominance_min_buffer`` keeps T2 off a near-empty buffer."""

    min_buffer: int = 50
    dominance_ratio: float = 0.70
    dominance_min_buffer: int = 10
    min_accepted: int = 30
    drift_sigma: float = 1.5
    novel_min_count: int = 3
    staleness: dt.timedelta = dt.timedelta(hours=6)
    staleness_min_buffer: int = 10
    max_drop_rate: float = 0.60
    drop_rate_min_attempts: int = 10

    def __post_init__(self) -> None:
        if not 0.0 < self.dominance_ratio <= 1.0:
            raise ValueError(f"dominance_ratio must be in (0, 1], got {self.dominance_ratio}")
        if not 0.0 <= self.max_drop_rate <= 1.0:
            raise ValueError(f"max_drop_rate must be in [0, 1], got {self.max_drop_rate}")
        for name in ("min_buffer", "dominance_min_buffer", "min_accepted", "novel_min_count", "staleness_min_buffer", "drop_rate_min_attempts"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class TriggerFiring:
    """One condition that holds, with the figures that made it hold."""

    trigger: str
    name: str
    figures: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class TriggerDecision:
    """The conditions that hold, and the safety gate that blocks them (None when retraining may start)."""

    version: int
    firings: tuple[TriggerFiring, ...]
    blocked_by: str | None
    block_reason: str | None

    @property
    def should_retrain(self) -> bool:
        return bool(self.firings) and self.blocked_by is None

    def firing(self, trigger: str) -> TriggerFiring | None:
        return next((f for f in self.firings if f.trigger == trigger), None)


class RetrainingTrigger:
    """Evaluates the six conditions over BufferStats; cost is independent of buffer size."""

    def __init__(self, config: TriggerConfig | None = None) -> None:
        self.config = config or TriggerConfig()

    def conditions(self, stats: BufferStats, now: dt.datetime | None = None) -> list[TriggerFiring]:
        """Every condition of Table 6 that holds now."""
        c = self.config
        now = now or dt.datetime.now(dt.timezone.utc)
        out: list[TriggerFiring] = []
        if stats.size >= c.min_buffer:
            out.append(TriggerFiring("T1", TRIGGERS["T1"], {"size": stats.size, "threshold": c.min_buffer}))
        if stats.leader_cause and stats.size >= c.dominance_min_buffer and stats.leader_n >= c.dominance_ratio * stats.size:
            out.append(TriggerFiring(
                "T2", f"dominance:{stats.leader_cause}",
                {"root_cause": stats.leader_cause, "count": stats.leader_n, "size": stats.size,
                 "share": stats.leader_n / stats.size, "ratio": c.dominance_ratio},
            ))
        # Accepted examples currently in the buffer (a drain resets it), not a lifetime count.
        if stats.accepted >= c.min_accepted:
            out.append(TriggerFiring("T3", TRIGGERS["T3"], {"accepted": stats.accepted, "threshold": c.min_accepted}))
        if (
            stats.baseline_mean is not None
            and stats.baseline_n >= stats.reward_window
            and stats.window_n >= stats.reward_window
            and stats.window_mean is not None
        ):
            floor = stats.baseline_mean - c.drift_sigma * (stats.baseline_std or 0.0)
            if stats.window_mean < floor:
                out.append(TriggerFiring(
                    "T4", TRIGGERS["T4"],
                    {"window_mean": stats.window_mean, "baseline_mean": stats.baseline_mean,
                     "baseline_std": stats.baseline_std, "floor": floor, "window": stats.reward_window},
                ))
        if stats.novel_cause and stats.novel_n >= c.novel_min_count:
            out.append(TriggerFiring(
                "T5", f"novel_failure:{stats.novel_cause}",
                {"root_cause": stats.novel_cause, "count": stats.novel_n, "threshold": c.novel_min_count},
            ))
        since = stats.last_retrain_at or stats.created_at
        age = now - since
        if age >= c.staleness and stats.size >= c.staleness_min_buffer:
            out.append(TriggerFiring(
                "T6", TRIGGERS["T6"],
                {"hours_since_retrain": age.total_seconds() / 3600.0, "size": stats.size,
                 "window_hours": c.staleness.total_seconds() / 3600.0, "min_buffer": c.staleness_min_buffer},
            ))
        return out

    def gate(self, stats: BufferStats, retrain_running: bool = False) -> tuple[str | None, str | None]:
        """The two safety gates: (gate name, reason) of the first that blocks, or (None, None)."""
        c = self.config
        if retrain_running or stats.retrain_batch is not None:
            return "retrain_running", f"retrain batch {stats.retrain_batch or '(orchestrator run)'} is still running"
        if stats.attempts >= c.drop_rate_min_attempts and stats.drop_rate > c.max_drop_rate:
            return "drop_rate", (
                f"drop rate {stats.drop_rate:.0%} over {stats.attempts} attempts exceeds {c.max_drop_rate:.0%}"
            )
        return None, None

    def evaluate(self, stats: BufferStats, now: dt.datetime | None = None, retrain_running: bool = False) -> TriggerDecision:
        """Gates first, then the six conditions; any condition fires a retrain unless a gate blocks."""
        blocked_by, reason = self.gate(stats, retrain_running)
        return TriggerDecision(stats.version, tuple(self.conditions(stats, now)), blocked_by, reason)
