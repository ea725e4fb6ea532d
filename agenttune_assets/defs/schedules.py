"""Staleness (T6) also runs on a schedule, so an idle sensor daemon cannot leave a stale adapter serving."""

import dagster as dg

from agenttune_assets.defs.resources import ClosedLoopResource, WarehouseResource
from agenttune_assets.defs.sensors import RETRAIN_JOB, retrain_in_progress
from agenttune_lib.closed_loop import RetrainingTrigger, TrainingBuffer
from agenttune_lib.closed_loop.tick import trigger_tick


@dg.schedule(
    name="retrain_staleness_schedule",
    cron_schedule="0 * * * *",
    job_name=RETRAIN_JOB,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Hourly T6 staleness check: retrain when the last retrain is older than the window and enough failures are buffered.",
)
def retrain_staleness_schedule(context: dg.ScheduleEvaluationContext, warehouse: WarehouseResource, closed_loop: ClosedLoopResource):
    buffer = TrainingBuffer(warehouse.get(), name=closed_loop.buffer, capacity=closed_loop.capacity)
    out = trigger_tick(buffer, RetrainingTrigger(closed_loop.trigger_config()), "T6", None, retrain_running=lambda: retrain_in_progress(context.instance))
    if not out.fired:
        return dg.SkipReason(out.reason)
    return dg.RunRequest(run_key=out.run_key, tags={**out.tags(), "agenttune/scheduled": "true"})


SCHEDULES = [retrain_staleness_schedule]
