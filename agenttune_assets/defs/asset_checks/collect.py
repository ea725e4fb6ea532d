"""Checks on teacher_trajectories: the run's logs are in the warehouse, well formed, with provenance."""
import dagster as dg

from agenttune_assets.defs.assets.collect import teacher_trajectories
from agenttune_assets.defs.resources import WarehouseResource
from agenttune_lib.spine.validate import episode_problems
from agenttune_lib.warehouse.queries import trajectory_versions


@dg.asset_check(asset=teacher_trajectories, blocking=True, description="This run's teacher EventLogs are full tier, well formed and carry a model version.")
def teacher_trajectories_well_formed(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    wh = warehouse.get()
    run_id = context.run.run_id
    rows = trajectory_versions(wh, run_id, source="teacher")
    if not rows:
        return dg.AssetCheckResult(passed=False, metadata={"run_id": run_id, "problem": "no teacher trajectories written by this run"})
    problems = episode_problems(wh.read_logs(ids=[r[0] for r in rows]))
    problems += [{"trajectory_id": tid, "problem": "no model_version in provenance"} for tid, version in rows if not version]
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={"run_id": run_id, "trajectories": len(rows), "problems": dg.MetadataValue.json(problems[:20])},
    )


#: Fewer successful episodes than this and training would learn from almost nothing: block it.
MIN_SUCCESSFUL_EPISODES = 4


@dg.asset_check(
    asset=teacher_trajectories,
    blocking=True,
    description=f"The teacher succeeded: at least {MIN_SUCCESSFUL_EPISODES} of this run's episodes reach the success reward; states success rate, valid-call rate and count.",
)
def teacher_trajectories_succeed(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    from agenttune_lib.spine.collect import valid_call_stats
    from agenttune_lib.spine.episode import episode_succeeded

    logs = warehouse.get().read_logs(run_id=context.run.run_id, source="teacher")
    n = len(logs)
    ok = sum(1 for log in logs if episode_succeeded(log))
    valid, attempts = valid_call_stats(logs)
    by_kind: dict[str, list[int]] = {}
    for log in logs:
        entry = by_kind.setdefault(str(log.metadata.get("teacher_kind") or log.metadata.get("teacher") or "?"), [0, 0])
        entry[0] += 1
        entry[1] += episode_succeeded(log)
    return dg.AssetCheckResult(
        passed=ok >= MIN_SUCCESSFUL_EPISODES,
        metadata={
            "count": n,
            "successful": ok,
            "success_rate": dg.MetadataValue.float(ok / n if n else 0.0),
            "valid_call_rate": dg.MetadataValue.float(valid / attempts if attempts else 0.0),
            "tool_call_attempts": attempts,
            "by_teacher": dg.MetadataValue.json({k: {"count": v[0], "successful": v[1]} for k, v in by_kind.items()}),
            "min_successful": MIN_SUCCESSFUL_EPISODES,
        },
    )


@dg.asset_check(
    asset=teacher_trajectories,
    blocking=True,
    description="Expert QA walks retrieved their evidence: gold-hop recall and answer-in-context at or above their floors, and no episode "
                "whose context lacks the answer counts as a success.",
)
def teacher_trajectories_evidence(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    from agenttune_lib.spine.collect import evidence_figures

    logs = warehouse.get().read_logs(run_id=context.run.run_id, source="teacher")
    fig = evidence_figures(logs)
    if fig["qa_episodes"] == 0:
        return dg.AssetCheckResult(passed=True, metadata={"note": "no expert QA episodes in this run", **fig})
    return dg.AssetCheckResult(passed=not fig["problems"], metadata={**{k: v for k, v in fig.items() if k != "problems"},
                                                                    "problems": dg.MetadataValue.json(fig["problems"])})
