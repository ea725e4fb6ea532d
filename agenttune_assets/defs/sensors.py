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

RETRAIN_SENSORS = [retrain_t1_sensor, retrain_t2_sensor, retrain_t3_sensor, retrain_t4_sensor, retrain_t5_sensor, retrain_t6_sensor]

FAILURE_BUFFER_JOB = "failure_buffer_job"


def new_traffic(warehouse: WarehouseResource, closed_loop: ClosedLoopResource) -> dict:
    """What ``failure_buffer`` has not read yet: feedback rows on served requests and audit-log bytes past each stored offset."""
    from agenttune_lib.closed_loop.detector import audit_reader_name
    from agenttune_lib.service.feedback import FEEDBACK_READER, pending_feedback

    wh = warehouse.get()
    buffer = TrainingBuffer(wh, name=closed_loop.buffer, capacity=closed_loop.capacity)
    out = {"feedback": pending_feedback(wh, buffer), "feedback_seq": buffer.position(FEEDBACK_READER)[0], "audit": {}}
    for path in closed_loop.audit_files():
        if path.exists():
            offset, _ = buffer.position(audit_reader_name(path))
            size = path.stat().st_size
            if size > offset:
                out["audit"][str(path)] = size
    return out


def evaluate_failure_buffer_sensor(instance: dg.DagsterInstance, cursor: str | None, warehouse: WarehouseResource,
                                   closed_loop: ClosedLoopResource) -> dg.SensorResult:
    """Request a ``failure_buffer`` run when served feedback or DECIDE audit lines arrived that it has not read, once per state."""
    seen = new_traffic(warehouse, closed_loop)
    if not seen["feedback"] and not seen["audit"]:
        return dg.SensorResult(skip_reason=dg.SkipReason("no new served feedback or audit lines"), cursor=cursor)
    busy = instance.get_run_records(filters=dg.RunsFilter(job_name=FAILURE_BUFFER_JOB, statuses=_IN_PROGRESS), limit=1)
    if busy:
        return dg.SensorResult(skip_reason=dg.SkipReason(f"failure_buffer run {busy[0].dagster_run.run_id} is still reading"), cursor=cursor)
    key = json.dumps({"feedback_after": seen["feedback_seq"], "pending": seen["feedback"], "audit": seen["audit"]}, sort_keys=True)
    if key == cursor:
        return dg.SensorResult(skip_reason=dg.SkipReason("the last failure_buffer run already saw this state"), cursor=cursor)
    from agenttune_lib.closed_loop.types import stable_id

    run_key = f"failure_buffer:{stable_id(key)}"
    return dg.SensorResult(run_requests=[dg.RunRequest(run_key=run_key, tags={
        "agenttune/served_feedback": str(seen["feedback"]), "agenttune/audit_logs": str(len(seen["audit"]))})], cursor=key)


@dg.sensor(
    name="failure_buffer_sensor",
    job_name=FAILURE_BUFFER_JOB,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Moves new failures into failure_buffer: served-traffic feedback and new DECIDE audit lines request a failure_buffer run, "
                "so T1-T6 see them without anyone materializing by hand.",
)
def failure_buffer_sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource, closed_loop: ClosedLoopResource):
    return evaluate_failure_buffer_sensor(context.instance, context.cursor, warehouse, closed_loop)


SENSORS = [*RETRAIN_SENSORS, failure_buffer_sensor]
