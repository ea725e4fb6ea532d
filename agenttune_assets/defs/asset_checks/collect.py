"""Checks on teacher_trajectories: the run's logs are in the warehouse, well formed, with provenance."""
import dagster as dg

from agenttune_assets.defs.assets.collect import teacher_trajectories
from agenttune_assets.defs.resources import WarehouseResource
from agenttune_lib.spine.validate import episode_problems


@dg.asset_check(asset=teacher_trajectories, blocking=True, description="This run's teacher EventLogs are full tier, well formed and carry a model version.")
def teacher_trajectories_well_formed(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    wh = warehouse.get()
    run_id = context.run.run_id
    rows = wh.execute("SELECT id, model_version FROM trajectories WHERE run_id = ? AND source = 'teacher'", [run_id])
    if not rows:
        return dg.AssetCheckResult(passed=False, metadata={"run_id": run_id, "problem": "no teacher trajectories written by this run"})
    problems = episode_problems(wh.read_logs(ids=[r[0] for r in rows]))
    problems += [{"trajectory_id": tid, "problem": "no model_version in provenance"} for tid, version in rows if not version]
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={"run_id": run_id, "trajectories": len(rows), "problems": dg.MetadataValue.json(problems[:20])},
    )
