"""Asset check on evaluation_report: the candidate may not stop calling tools, lose TAC or gain LCF against the deployed adapter."""

import dagster as dg

from agenttune_assets.defs.resources import ServingResource, WarehouseResource
from agenttune_lib.evaluation.paired import ConfigMismatchError
from agenttune_lib.evaluation.regression import items_for, trajectory_regression
from agenttune_lib.evaluation.store import EVALUATION_ITEMS_TABLE
from agenttune_lib.models.serving import deployed_pointer
from agenttune_lib.warehouse.queries import newest_adapter_of


class EvaluationRegressionConfig(dg.Config):
    """Allowed regression against the deployed adapter on the same items and evaluation config."""

    tac_tolerance: float = 0.05
    lcf_tolerance: float = 0.05
    tool_use_tolerance: float = 0.2


def _candidate_id(wh) -> str | None:
    return newest_adapter_of(wh, EVALUATION_ITEMS_TABLE, model_label="candidate")


# Not blocking: a regressed adapter must still reach gate_decision, whose trajectory arm refuses it and records why.
@dg.asset_check(asset="evaluation_report", blocking=False,
                description="The candidate must keep calling tools where the deployed adapter did; TAC must not fall nor LCF rise beyond tolerance.")
def evaluation_no_trajectory_regression(
    context: dg.AssetCheckExecutionContext, config: EvaluationRegressionConfig, warehouse: WarehouseResource, serving: ServingResource
) -> dg.AssetCheckResult:
    wh = warehouse.get()
    pointer = deployed_pointer(serving.deploy_dir())  # what serves now, as evaluation_report's deployed arm scored it
    deployed_id = pointer["adapter_id"] if pointer else None
    cand_id = _candidate_id(wh)
    if cand_id is None:
        return dg.AssetCheckResult(passed=True, metadata={"note": "no candidate adapter evaluated yet"})
    if deployed_id is None:
        return dg.AssetCheckResult(passed=True, metadata={"note": "no adapter deployed yet: nothing to regress against", "candidate": cand_id})
    if cand_id == deployed_id:
        return dg.AssetCheckResult(passed=True, metadata={"note": "the candidate is the deployed adapter", "candidate": cand_id})
    cand = items_for(wh, cand_id)
    deployed = items_for(wh, deployed_id, config_hashes={s: rows[0]["config_hash"] for s, rows in cand.items() if rows})
    if not deployed:
        other = items_for(wh, deployed_id)
        why = (f"deployed adapter {deployed_id!r} was evaluated only under other configs "
               f"{ {s: rows[0]['config_hash'] for s, rows in other.items()} } than the candidate's "
               f"{ {s: rows[0]['config_hash'] for s, rows in cand.items()} }: not comparable") if other else \
            f"deployed adapter {deployed_id!r} has no per-item evaluation rows"
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, description=why,
                                   metadata={"deployed_adapter": deployed_id, "candidate": cand_id})
    try:
        out = trajectory_regression(cand, deployed, config.tac_tolerance, config.lcf_tolerance, config.tool_use_tolerance)
    except ConfigMismatchError as exc:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, description=str(exc),
                                   metadata={"deployed_adapter": deployed_id, "candidate": cand_id})
    return dg.AssetCheckResult(
        passed=out["passed"],
        severity=dg.AssetCheckSeverity.ERROR,
        description="; ".join(out["reasons"]) or None,
        metadata={"deployed_adapter": deployed_id, "candidate": cand_id, "tac_tolerance": config.tac_tolerance,
                  "lcf_tolerance": config.lcf_tolerance, "tool_use_tolerance": config.tool_use_tolerance,
                  "suites": dg.MetadataValue.json(out["suites"])},
    )
