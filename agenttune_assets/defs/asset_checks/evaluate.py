"""Asset check on evaluation_report: the candidate adapter's TAC may not fall, nor LCF rise, beyond tolerance vs the deployed adapter."""

import dagster as dg

from agenttune_assets.defs.resources import WarehouseResource
from agenttune_lib.evaluation.report_model import (
    EVALUATION_REPORTS_TABLE, EvaluationReport, compare_reports, deployed_adapter_id, latest_report,
)


class EvaluationRegressionConfig(dg.Config):
    """Allowed regression against the deployed adapter's report."""

    tac_tolerance: float = 0.05
    lcf_tolerance: float = 0.05


def _candidates(wh, run_id: str) -> list[EvaluationReport]:
    """Adapter reports written by this run, else the newest adapter report."""
    if not wh.has_table(EVALUATION_REPORTS_TABLE):
        return []
    rows = wh.query_arrow(
        f"SELECT * FROM {EVALUATION_REPORTS_TABLE} WHERE model_kind = 'adapter' AND run_id = ? ORDER BY created_at", [run_id]
    ).to_pylist()
    if not rows:
        rows = wh.query_arrow(f"SELECT * FROM {EVALUATION_REPORTS_TABLE} WHERE model_kind = 'adapter' ORDER BY created_at DESC LIMIT 1").to_pylist()
    return [EvaluationReport.from_row(r) for r in rows]


# Not blocking: a regressed adapter must still reach gate_decision, whose trajectory arm refuses it and records why.
@dg.asset_check(asset="evaluation_report", blocking=False, description="TAC must not fall and LCF must not rise beyond tolerance against the deployed adapter.")
def evaluation_no_trajectory_regression(
    context: dg.AssetCheckExecutionContext, config: EvaluationRegressionConfig, warehouse: WarehouseResource
) -> dg.AssetCheckResult:
    wh = warehouse.get()
    deployed_id = deployed_adapter_id(wh)
    candidates = _candidates(wh, context.run.run_id)
    if not candidates:
        return dg.AssetCheckResult(passed=True, metadata={"note": "no adapter report to check yet"})
    if deployed_id is None:
        return dg.AssetCheckResult(passed=True, metadata={"note": "no adapter deployed yet: nothing to regress against",
                                                           "candidates": [c.adapter_id for c in candidates]})
    results = {}
    for cand in candidates:
        if cand.adapter_id == deployed_id:
            continue
        deployed = latest_report(wh, deployed_id, cand.config_fingerprint) or latest_report(wh, deployed_id)
        if deployed is None:
            results[cand.adapter_id] = {"passed": False, "no_baseline": True, "reasons": [f"deployed adapter {deployed_id!r} has no evaluation report"]}
            continue
        results[cand.adapter_id] = compare_reports(cand, deployed, config.tac_tolerance, config.lcf_tolerance)
    passed = all(r["passed"] for r in results.values())
    regressed = any(not r["passed"] and not r.get("no_baseline") for r in results.values())
    return dg.AssetCheckResult(
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR if regressed else dg.AssetCheckSeverity.WARN,
        description="; ".join(reason for r in results.values() for reason in r.get("reasons", [])) or None,
        metadata={"deployed_adapter": deployed_id, "tac_tolerance": config.tac_tolerance, "lcf_tolerance": config.lcf_tolerance,
                  "comparisons": dg.MetadataValue.json(results)},
    )
