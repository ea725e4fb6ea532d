"""Checks on multi_agent_adapter: every rollout the run wrote is attributable per agent and per judge."""
import dagster as dg

from agenttune_assets.defs.assets.multi_agent import multi_agent_adapter
from agenttune_assets.defs.resources import WarehouseResource


@dg.asset_check(asset=multi_agent_adapter, blocking=True, description="This run's multi-agent EventLogs name each event's agent and each judge's REWARD.")
def multi_agent_attribution_complete(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    from agenttune_lib.multi_agent.train import attribution_problems

    wh = warehouse.get()
    run_id = context.run.run_id
    logs = wh.read_logs(source="multi_agent", run_id=run_id) if wh.has_table("trajectories") else []
    if not logs:
        return dg.AssetCheckResult(passed=False, metadata={"run_id": run_id, "problem": "no multi-agent rollouts written by this run"})
    problems = attribution_problems(logs)
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={"run_id": run_id, "trajectories": len(logs), "problems": dg.MetadataValue.json(problems[:20])},
    )
