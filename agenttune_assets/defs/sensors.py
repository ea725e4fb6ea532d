"""Six retraining sensors, one per RetrainingTrigger condition (paper Table 6); each requests ``retrain_job``."""

import json

import dagster as dg

from agenttune_assets.defs.resources import ClosedLoopResource, WarehouseResource
from agenttune_lib.closed_loop import TRIGGERS, RetrainingTrigger, TrainingBuffer
from agenttune_lib.closed_loop.tick import TickOutcome, trigger_tick

RETRAIN_JOB = "retrain_job"
_IN_PROGRESS = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
                dg.DagsterRunStatus.CANCELING]


def retrain_in_progress(instance: dg.DagsterInstance) -> bool:
    """Safety gate 1 on the orchestrator's side: a retrain run is queued or running."""
    return bool(instance.get_run_records(filters=dg.RunsFilter(job_name=RETRAIN_JOB, statuses=_IN_PROGRESS), limit=1))


def release_orphaned_batch(instance: dg.DagsterInstance, buffer: TrainingBuffer) -> str | None:
    """A drained batch whose retrain run failed, was canceled or was never launched goes back to the buffer.

    Costs nothing while no batch is out (the buffer's state file says so); otherwise one run-storage
    query for the batch's run. A run that died is failed by run monitoring (dagster.yaml), then released here.
    """
    stats = buffer.cached_stats()
    batch = stats.retrain_batch
    if batch is None:
        return None
    runs = instance.get_run_records(filters=dg.RunsFilter(tags={"agenttune/retrain_batch": batch}), limit=1)
    status = runs[0].dagster_run.status if runs else None
    if status in _IN_PROGRESS:
        return None
    stats = buffer.stats()  # the state file may lag a concurrent close: confirm against the warehouse
    if stats.retrain_batch != batch:
        return None
    if status == dg.DagsterRunStatus.SUCCESS:
        buffer.finish_retrain(batch, succeeded=True)
        return f"batch {batch} finished with run {runs[0].dagster_run.run_id}"
    if runs or stats.retrain_started_at is None or (dg.get_current_datetime() - stats.retrain_started_at).total_seconds() > 600:
        buffer.finish_retrain(batch, succeeded=False, requeue=True)
        return f"batch {batch} requeued (its run {status.value.lower() if status else 'was never launched'})"
    return None


def evaluate_trigger_sensor(
    trigger_id: str, instance: dg.DagsterInstance, cursor: str | None, warehouse: WarehouseResource, closed_loop: ClosedLoopResource
) -> dg.SensorResult | dg.SkipReason:
    """One tick of one trigger: skip with a reason, or a RunRequest keyed by trigger and buffer version.

    The common tick reads only the buffer's state file; the run storage is queried only while a
    batch is out or when the condition holds.
    """
    buffer = TrainingBuffer(warehouse.get(), name=closed_loop.buffer, capacity=closed_loop.capacity)
    released = release_orphaned_batch(instance, buffer)
    last = json.loads(cursor)["version"] if cursor else None
    out: TickOutcome = trigger_tick(
        buffer, RetrainingTrigger(closed_loop.trigger_config()), trigger_id, last, retrain_running=lambda: retrain_in_progress(instance)
    )
    new_cursor = json.dumps({"version": out.version})
    if not out.fired:
        reason = out.reason + (f"; {released}" if released else "")
        return dg.SensorResult(skip_reason=dg.SkipReason(reason), cursor=new_cursor)
    return dg.SensorResult(run_requests=[dg.RunRequest(run_key=out.run_key, tags=out.tags())], cursor=new_cursor)


def _make_sensor(trigger_id: str) -> dg.SensorDefinition:
    name = f"retrain_{trigger_id.lower()}_{TRIGGERS[trigger_id]}_sensor"

    @dg.sensor(
        name=name,
        job_name=RETRAIN_JOB,
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"{trigger_id} {TRIGGERS[trigger_id]}: request a retrain when this RetrainingTrigger condition holds and both safety gates pass.",
    )
    def _sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource, closed_loop: ClosedLoopResource):
        return evaluate_trigger_sensor(trigger_id, context.instance, context.cursor, warehouse, closed_loop)

    return _sensor


retrain_t1_sensor = _make_sensor("T1")
retrain_t2_sensor = _make_sensor("T2")
retrain_t3_sensor = _make_sensor("T3")
retrain_t4_sensor = _make_sensor("T4")
retrain_t5_sensor = _make_sensor("T5")
retrain_t6_sensor = _make_sensor("T6")

SENSORS = [retrain_t1_sensor, retrain_t2_sensor, retrain_t3_sensor, retrain_t4_sensor, retrain_t5_sensor, retrain_t6_sensor]
