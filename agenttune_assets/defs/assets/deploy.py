"""[deploy] failure_buffer -> gate_decision -> deployed_adapter: the self-healing loop's assets."""

import dagster as dg

from agenttune_assets.defs.resources import ClosedLoopResource, ServingResource, WarehouseResource
from agenttune_lib.closed_loop import AdapterDeployer, ClosedLoop, TrainingBuffer
from agenttune_lib.closed_loop.gate import load_gate_decision
from agenttune_lib.closed_loop.service import deploy_decision, gate_candidate
from agenttune_lib.service.feedback import ingest_served_feedback


def deploy_dir(closed_loop: ClosedLoopResource, serving: ServingResource):
    """Where the deploy step writes the pointer: the serving resource's root (what the next run resolves)."""
    if closed_loop.deploy_root and serving.deploy_root and closed_loop.deploy_root != serving.deploy_root:
        raise ValueError(f"closed_loop.deploy_root={closed_loop.deploy_root!r} and serving.deploy_root={serving.deploy_root!r} differ: "
                         "a deployment would not reach what serves")
    return closed_loop.deploy_dir() if closed_loop.deploy_root else serving.deploy_dir()


def _buffer(warehouse: WarehouseResource, closed_loop: ClosedLoopResource) -> TrainingBuffer:
    return TrainingBuffer(warehouse.get(), name=closed_loop.buffer, capacity=closed_loop.capacity)


@dg.asset(group_name="deploy", deps=["decide_runs"], pool="warehouse", kinds={"duckdb", "python"})
def failure_buffer(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, closed_loop: ClosedLoopResource, serving: ServingResource
) -> dg.MaterializeResult:
    """Detect, classify and buffer new failures from the DECIDE audit logs and from served traffic's feedback; DECIDE corrections
    are regenerated for each failing input (by the served model or the configured endpoint) and validated by template replay,
    served ones are the reviewer's correction validated by replay; the buffer lives in the warehouse."""
    buffer = _buffer(warehouse, closed_loop)
    files = [p for p in closed_loop.audit_files() if p.exists()]
    corrector = closed_loop.build_corrector_model(serving) if files else None
    loop = ClosedLoop(
        buffer, detector=closed_loop.detector(), classifier=closed_loop.build_classifier(), corrector_model=corrector,
        audit_heads_warehouse=warehouse.get(),
    )
    reports = []
    for path in closed_loop.audit_files():
        if path.exists():
            rep = loop.ingest_audit(path)
            reports.append(rep)
            context.log.info(f"{path}: {rep.runs} runs, {rep.failures} failures {rep.signals}, {rep.buffered} buffered ({rep.accepted} accepted), {rep.dropped} dropped")
    served = ingest_served_feedback(warehouse.get(), buffer, detector=closed_loop.detector(), classifier=closed_loop.build_classifier())
    if served.feedback_rows:
        context.log.info(f"served traffic: {served.feedback_rows} feedback rows, {served.failures} failures, {served.buffered} buffered "
                         f"({served.accepted} accepted), {served.dropped} dropped")
    stats = buffer.stats()
    return dg.MaterializeResult(
        metadata={
            "served_feedback": dg.MetadataValue.json(served.__dict__ | {"request_ids": list(served.request_ids)}),
            "size": stats.size,
            "accepted": stats.accepted,
            "drop_rate": float(stats.drop_rate),
            "version": stats.version,
            "retrain_batch": stats.retrain_batch or "-",
            "per_root_cause": dg.MetadataValue.json(stats.counts),
            "ingested": dg.MetadataValue.json([r.__dict__ for r in reports]),
        },
        data_version=dg.DataVersion(f"{stats.buffer}:v{stats.version}"),
    )


@dg.asset(group_name="deploy", deps=["trained_adapter", "evaluation_report", "failure_buffer"], pool="warehouse", kinds={"duckdb", "python"})
def gate_decision(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, closed_loop: ClosedLoopResource, serving: ServingResource
) -> dg.MaterializeResult:
    """Baseline vs candidate, generatively: the batch's failing DECIDE inputs and a fixed-size held-out sample replayed
    through their templates; plus the evaluation report's paired comparisons, the trajectory and the provenance arms."""
    wh = warehouse.get()
    buffer = _buffer(warehouse, closed_loop)
    batch_id = context.run.tags.get("agenttune/retrain_batch") or buffer.stats().retrain_batch
    base = serving.base_checkpoint or None  # else the base the candidate adapter records
    decision = gate_candidate(
        wh, AdapterDeployer(deploy_dir(closed_loop, serving), wh), closed_loop.audit_files(), buffer=buffer, batch_id=batch_id,
        run_id=context.run_id, config=closed_loop.gate_config(), base_path=base,
    )
    rp = decision.arms["replay"]
    fo, fn, ho, hn = rp["failures_old"], rp["failures_new"], rp["holdout_old"], rp["holdout_new"]

    def num(x):
        return float(x) if x is not None else float("nan")

    arms = {k: {kk: vv for kk, vv in v.items() if kk != "cases"} for k, v in decision.arms.items()}
    return dg.MaterializeResult(
        metadata={
            "decision_id": decision.decision_id,
            "approved": decision.approved,
            "candidate": decision.candidate or "-",
            "baseline": decision.baseline or "base model",
            "failures_replayed": int(fn["n"]),
            "failures_passing_old": num(fo["pass_rate"]),
            "failures_passing_new": num(fn["pass_rate"]),
            "held_out_cases": int(hn["n"]),
            "held_out_verdict_accuracy_old": num(ho["verdict_accuracy"]),
            "held_out_verdict_accuracy_new": num(hn["verdict_accuracy"]),
            "held_out_loop_collapse_old": num(ho["loop_collapse_rate"]),
            "held_out_loop_collapse_new": num(hn["loop_collapse_rate"]),
            "held_out_step_limit_old": num(ho["step_limit_rate"]),
            "held_out_step_limit_new": num(hn["step_limit_rate"]),
            "targets_arm": dg.MetadataValue.json(decision.arms["targets"]),
            "guards_arm": dg.MetadataValue.json(decision.arms["guards"]),
            "provenance_arm": dg.MetadataValue.json(decision.arms["provenance"]),
            "reasons": dg.MetadataValue.json(decision.reasons),
            "arms": dg.MetadataValue.json(arms),
        },
    )


@dg.asset(group_name="deploy", deps=["gate_decision"], pool="warehouse", kinds={"python"})
def deployed_adapter(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource, closed_loop: ClosedLoopResource, serving: ServingResource
) -> dg.MaterializeResult:
    """Which adapter serves, its predecessor, and the gate decision that put it there (deployed atomically, or kept)."""
    wh = warehouse.get()
    decision = load_gate_decision(wh, run_id=context.run_id)
    out = deploy_decision(wh, AdapterDeployer(deploy_dir(closed_loop, serving), wh), decision, _buffer(warehouse, closed_loop), run_id=context.run_id)
    serving = out.serving
    return dg.MaterializeResult(
        metadata={
            "serving": serving.adapter_id if serving else "base model",
            "path": serving.path if serving else "-",
            "predecessor": (serving.previous if out.deployed else out.previous) or "-",
            "decision_id": out.decision_id,
            "deployed_now": out.deployed,
            "reason": out.reason,
        },
    )


def dagster_run_lineage(run_ids: list[str], instance: dg.DagsterInstance | None = None) -> list[dict]:
    """Asset-level lineage for ``agenttune lineage``: per run id, its job, status, trigger tags and the assets it materialized."""
    instance = instance or dg.DagsterInstance.get()
    out = []
    for run_id in run_ids:
        run = instance.get_run_by_id(run_id)
        if run is None:
            out.append({"run_id": run_id, "found": False})
            continue
        records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
        assets = sorted({r.event_log_entry.dagster_event.asset_key.to_user_string() for r in records if r.event_log_entry.dagster_event})
        out.append({
            "run_id": run_id, "found": True, "job": run.job_name, "status": run.status.value,
            "tags": {k: v for k, v in run.tags.items() if k.startswith("agenttune/")}, "materialized": assets,
        })
    return out
