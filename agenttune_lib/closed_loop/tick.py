"""One trigger tick as a sensor runs it: evaluate, gate, and on a firing drain the buffer atomically."""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable

from agenttune_lib.closed_loop.buffer import RetrainBatch, RetrainRunning, TrainingBuffer
from agenttune_lib.closed_loop.trigger import RetrainingTrigger, TriggerFiring

__all__ = ["TickOutcome", "trigger_tick", "run_key"]


def run_key(trigger_id: str, buffer: str, version: int) -> str:
    """Run key from the trigger and the buffer version: a cursor reset cannot launch the same retrain twice."""
    return f"retrain:{trigger_id}:{buffer}:v{version}"


@dataclasses.dataclass(frozen=True)
class TickOutcome:
    """``fired`` with the drained batch and the firing's figures, or a skip reason; ``version`` is the new cursor."""

    fired: bool
    version: int
    reason: str
    firing: TriggerFiring | None = None
    batch: RetrainBatch | None = None
    run_key: str | None = None

    def tags(self) -> dict[str, str]:
        """Run tags naming the trigger and its figures."""
        if not self.fired or self.firing is None or self.batch is None:
            return {}
        tags = {
            "agenttune/trigger": self.firing.trigger,
            "agenttune/trigger_name": self.firing.name,
            "agenttune/retrain_batch": self.batch.batch_id,
            "agenttune/buffer": self.batch.buffer,
            "agenttune/buffer_version": str(self.version),
            "agenttune/examples": str(len(self.batch.examples)),
        }
        for k, v in self.firing.figures.items():
            tags[f"agenttune/fig.{k}"] = f"{v:.4g}" if isinstance(v, float) else str(v)
        return tags


def trigger_tick(
    buffer: TrainingBuffer,
    trigger: RetrainingTrigger,
    trigger_id: str,
    last_version: int | None,
    retrain_running: bool | Callable[[], bool] = False,
    now: dt.datetime | None = None,
) -> TickOutcome:
    """Evaluate ``trigger_id`` once; nothing new since ``last_version`` skips (staleness still ages with time).

    The tick reads the buffer's state file (no warehouse connection); only when the condition
    holds and the gates pass does it re-read the warehouse, re-evaluate, and drain.
    ``retrain_running`` may be a callable (the orchestrator query): it is called only when the
    condition holds, so the common tick touches neither the warehouse nor the run storage.
    """
    stats = buffer.cached_stats()
    if last_version is not None and stats.version == last_version and trigger_id != "T6":
        return TickOutcome(False, stats.version, f"nothing new since buffer version {stats.version}")
    if trigger.evaluate(stats, now=now).firing(trigger_id) is None:
        return TickOutcome(False, stats.version, f"{trigger_id} does not hold at buffer version {stats.version} (size {stats.size})")
    running = retrain_running() if callable(retrain_running) else bool(retrain_running)
    decision = trigger.evaluate(stats, now=now, retrain_running=running)
    if decision.firing(trigger_id) is not None and decision.blocked_by is None:
        stats = buffer.stats()
        decision = trigger.evaluate(stats, now=now, retrain_running=running)
    firing = decision.firing(trigger_id)
    if firing is None:
        return TickOutcome(False, stats.version, f"{trigger_id} does not hold at buffer version {stats.version} (size {stats.size})")
    if decision.blocked_by is not None:
        return TickOutcome(False, stats.version, f"{firing.name} holds but safety gate {decision.blocked_by}: {decision.block_reason}", firing)
    if stats.accepted == 0:
        # T4 fires on rewards alone and T5 may count only rejected corrections: a batch with nothing to train is no retrain.
        return TickOutcome(False, stats.version, f"{firing.name} holds but there is nothing to train: 0 accepted examples "
                                                 f"in buffer {buffer.name!r} (size {stats.size})", firing)
    try:
        batch = buffer.drain(trigger=firing.name, now=now)
    except RetrainRunning as exc:
        return TickOutcome(False, stats.version, f"{firing.name} holds but {exc}", firing)
    # The run key and the tags name the same (post-drain) buffer version, the one the cursor moves to.
    return TickOutcome(True, batch.version, f"{firing.name} fired", firing, batch, run_key(trigger_id, buffer.name, batch.version))
