"""[collect] decide_runs: one DECIDE template (a partition) over an input table → audit records and EventLogs."""

import json
from pathlib import Path

import dagster as dg

from agenttune_assets.defs.resources import ArtifactsResource, DecideModelResource, ModelsResource, ServingResource, WarehouseResource
from agenttune_lib.decide import CollectRunner, GraphRunner, TemplateRegistry, default_audit_path, read_labelled_inputs, verify_audit

decide_partitions = dg.StaticPartitionsDefinition(TemplateRegistry().ids())

#: Partitions ``agenttune materialize`` runs after the main job: KYC triage, whose audit log the closed loop reads.
MAIN_JOB_PARTITIONS = {"decide_runs": ["bfsi/kyc_triage"]}


class DecideRunsConfig(dg.Config):
    """Small by default so the main job stays fast (2 rows, 10 steps, no retries, reviews fail closed at once);
    ``input_path`` replaces the template's example rows; ``max_steps: 0`` keeps the template's own limit."""

    input_path: str = ""
    limit: int = 2
    max_retries: int = 0
    max_steps: int = 10
    human_review_timeout_s: float = 0.0
    dispatch_destinations: bool = False
    #: Where runs waiting for review are parked when ``human_review_timeout_s`` > 0: a postgresql:// URL in
    #: production; empty means SQLite next to the reviews. ``agenttune decide resume`` continues them.
    checkpointer: str = ""


def audit_path(artifacts_dir: Path) -> Path:
    """Where DECIDE's audit log lives: ``<artifacts>/decide/audit.jsonl``."""
    return default_audit_path(artifacts_dir)


@dg.asset(
    group_name="collect",
    partitions_def=decide_partitions,
    deps=["base_model"],
    pool="warehouse",
    kinds={"duckdb", "python"},
)
def decide_runs(
    context: dg.AssetExecutionContext,
    config: DecideRunsConfig,
    warehouse: WarehouseResource,
    models: ModelsResource,
    artifacts: ArtifactsResource,
    decide_model: DecideModelResource,
    serving: ServingResource,
) -> dg.MaterializeResult:
    """Run the partition's template over its input rows; audit lines go to the hash-chained log, EventLogs to the warehouse."""
    from agenttune_lib.warehouse import Provenance

    template_id = context.partition_key
    registry = TemplateRegistry()
    template = registry.get(template_id)
    # an input row's expected_label (as in evaluation mode) goes to its audit line, never to a stage
    labelled = read_labelled_inputs(config.input_path, limit=config.limit) if config.input_path else template.labelled_examples[: config.limit]
    if not labelled:
        raise ValueError(f"template {template_id!r} has no example rows and no input_path was given")
    model, model_version = decide_model.build(models.get(), serving)
    served_adapter_id = getattr(model, "served_adapter_id", None)
    artifacts_dir = artifacts.get()
    audit = audit_path(artifacts_dir)
    wh = warehouse.get()
    runner = GraphRunner(
        template,
        model=model,
        audit=audit,
        review_dir=artifacts_dir / "decide" / "reviews",
        human_review_timeout=config.human_review_timeout_s,
        max_retries=config.max_retries,
        max_steps=config.max_steps or None,
        destinations=None if config.dispatch_destinations else [],
        destination_base=artifacts_dir / "decide",
        warehouse_path=wh.path if hasattr(wh, "path") else None,
        checkpointer=config.checkpointer or "default",
    )
    provenance = Provenance(
        run_id=context.run_id,
        asset_key=context.asset_key.to_user_string(),
        partition=template_id,
        model_version=model_version,
        adapter_version=served_adapter_id,
    )
    from agenttune_lib.decide.collect import replace_partition_logs

    replaced = replace_partition_logs(wh, context.asset_key.to_user_string(), template_id)  # re-materializing replaces
    runner.retry_outbox()
    result = CollectRunner(runner, warehouse=wh, provenance=provenance).collect([r for r, _ in labelled], [e for _, e in labelled])
    check = verify_audit(audit, warehouse=wh)
    context.log.info(f"{template_id}: verdicts {result.verdict_counts}, statuses {result.status_counts}")
    return dg.MaterializeResult(metadata=_runs_metadata(template_id, result, replaced, audit, check, model_version, served_adapter_id))


def _trace_md(summary: dict, steps: list[dict]) -> str:
    """The first run's path as a table, from its redacted summary and steps (metadata never holds raw input)."""
    verdict = summary.get("verdict") or {}
    lines = [f"**{summary['template_id']}** run `{summary['run_id']}` → **{verdict.get('label')}** ({summary['status']})", "", "| step | stage | type | status |", "|---|---|---|---|"]
    for i, step in enumerate(steps, start=1):
        lines.append(f"| {i} | {step['stage_id']} | {step['stage_type']} | {step['status']} |")
    if summary.get("error"):
        lines += ["", f"error: {json.dumps(summary['error'])[:300]}"]
    return "\n".join(lines)


def _runs_metadata(template_id: str, result, replaced: int, audit, check, model_version: str, served_adapter_id) -> dict:
    """The partition's metadata: verdict and status counts, a redacted sample trace, the audit chain's state."""
    return {
        "template_id": template_id,
        "n_runs": len(result.states),
        "verdict_counts": dg.MetadataValue.json(result.verdict_counts),
        "status_counts": dg.MetadataValue.json(result.status_counts),
        "sample_trace": dg.MetadataValue.json(result.sample_trace() or {}),
        "eventlogs_written": result.written,
        "eventlogs_replaced": replaced,
        "trajectory_ids": dg.MetadataValue.json([log.id for log in result.logs]),
        "audit_log": dg.MetadataValue.path(str(audit)),
        "audit_chain_ok": check.ok,
        "audit_lines": check.count,
        "model_version": model_version,
        "served_adapter_id": served_adapter_id or "-",
        "sample_steps": dg.MetadataValue.md(_trace_md(result.summaries[0], result.redacted_steps[0]) if result.summaries else ""),
    }
