"""Checks on decide_runs: the audit log's hash chain is intact after every materialization."""
import dagster as dg

from agenttune_assets.defs.assets.decide import audit_path, decide_runs
from agenttune_assets.defs.resources import ArtifactsResource, WarehouseResource
from agenttune_lib.decide import verify_audit


@dg.asset_check(asset=decide_runs, blocking=True, description="The DECIDE audit log verifies: keyed chain intact, head checkpoint (warehouse) matches.")
def decide_audit_chain_intact(artifacts: ArtifactsResource, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    path = audit_path(artifacts.get())
    if not path.exists():
        return dg.AssetCheckResult(passed=False, metadata={"audit_log": str(path), "problem": "audit log missing"})
    result = verify_audit(path, warehouse=warehouse.get())
    return dg.AssetCheckResult(
        passed=result.ok,
        metadata={"audit_log": str(path), "lines": result.count, "problems": dg.MetadataValue.json(result.problems[:20]),
                  "warnings": dg.MetadataValue.json(result.warnings)},
    )
