"""[train] multi_agent_adapter: a LoRA adapter trained by GRPO through a YAML-spec'd AgentTuneGraph (policies, judge panel, router)."""

import dagster as dg

from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, ServingResource, WarehouseResource


class MultiAgentAdapterConfig(dg.Config):
    """The graph spec (a YAML path; empty: the packaged planner/solver spec) and optional overrides of its train section."""

    spec_path: str = ""
    max_steps: int = 0
    max_prompts: int = 0


def _uses(spec, ref: str) -> bool:
    return any(p.model == ref for p in spec.policies) or any(j.kind == "llm" and j.model == ref for j in spec.judges)


@dg.asset(group_name="train", deps=["teacher_trajectories", "eventlog_tables", "base_model"], pool="warehouse", kinds={"pytorch"})
def multi_agent_adapter(
    context: dg.AssetExecutionContext,
    config: MultiAgentAdapterConfig,
    warehouse: WarehouseResource,
    models: ModelsResource,
    artifacts: ArtifactsResource,
    serving: ServingResource,
) -> dg.MaterializeResult:
    """LoRA adapter of the spec's trainable policy; every multi-agent rollout (authored events, per-judge REWARDs) in the warehouse.

    Frozen nodes with ``model: deployed`` (the packaged spec's planner) run the deployed model: the base plus the adapter
    ``DEPLOYED.json`` names, resolved at the start of the run and recorded as ``deployed_model``."""
    import dataclasses

    from agenttune_lib.multi_agent.spec import default_spec_path, load_graph_spec
    from agenttune_lib.multi_agent.train import attribution, train_multi_agent
    from agenttune_lib.warehouse import Provenance
    from agenttune_lib.warehouse.queries import logs_written_by

    wh = warehouse.get()
    spec_path = config.spec_path or str(default_spec_path())
    try:
        spec = load_graph_spec(spec_path)
    except (ValueError, FileNotFoundError) as exc:
        raise dg.Failure(f"multi_agent_adapter: {exc}") from exc
    overrides = {k: v for k, v in (("max_steps", config.max_steps), ("max_prompts", config.max_prompts)) if v}
    if overrides:
        spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, **overrides))
    logs = logs_written_by(wh, "teacher_trajectories", tier="full")
    if not logs:
        raise dg.Failure("multi_agent_adapter: no teacher trajectories in the warehouse to take tasks from; materialize teacher_trajectories first")
    base_path, base_name = None, None
    if _uses(spec, "base"):
        from agenttune_lib.models.base import ensure_base_model

        info = ensure_base_model(models.get())
        base_path, base_name = info.path, f"{info.name}@{info.version[:12]}"
    served = serving.resolve(models.get()) if _uses(spec, "deployed") else None
    if served is not None:
        context.log.info(f"model 'deployed' is {served.served_adapter_id} on {served.base_path}")
    provenance = Provenance(run_id=context.run_id, asset_key=context.asset_key.to_user_string(), model_version=base_name or spec.trainable.model,
                            adapter_version=served.served_adapter_id if served is not None else None)
    context.log.info(f"multi-agent GRPO: spec {spec.name!r} from {spec_path}, {len(spec.policies)} policies, {len(spec.judges)} judges")
    result = train_multi_agent(
        spec, logs, models.get(), base_model_path=base_path, warehouse=wh, provenance=provenance, run_id=context.run_id,
        base_model_name=base_name, log_fn=context.log.info, served=served,
    )
    metadata = _adapter_metadata(result, spec, spec_path, attribution(wh, trajectory_ids=result.trajectory_ids), artifacts.get())
    metadata["deployed_model"] = served.served_adapter_id if served is not None else "-"
    metadata["node_models"] = dg.MetadataValue.json(result.graph["models"])
    return dg.MaterializeResult(
        metadata=metadata,
        data_version=dg.DataVersion(f"{result.data_version}:{result.adapter_id}"),
    )


def _adapter_metadata(result, spec, spec_path: str, attr: dict, artifacts_root) -> dict:
    """The adapter's metadata, and its report (judge scores, attribution, graph) written under artifacts/multi_agent."""
    import json

    from agenttune_lib.multi_agent.train import score_summary

    summaries = {name: score_summary(vals) for name, vals in result.judge_scores.items()}
    rows = "\n".join(
        f"| {name} | {s['n']} | {s['mean']:.3f} | {s['std']:.3f} | {s['min']:.3f} | {s['median']:.3f} | {s['max']:.3f} |"
        for name, s in summaries.items() if s["n"]
    )
    table = "| judge | n | mean | std | min | median | max |\n|---|---|---|---|---|---|---|\n" + rows
    report = artifacts_root / "multi_agent" / f"{result.adapter_id}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps({"judge_scores": result.judge_scores, "attribution": attr, "graph": result.graph}, indent=2, default=str))
    m = result.metrics()
    return {
        "adapter_id": result.adapter_id,
        "path": dg.MetadataValue.path(str(result.adapter_dir)),
        "base_model": result.base_model,
        "spec": spec.name,
        "spec_path": dg.MetadataValue.path(spec_path),
        "plan": dg.MetadataValue.json(result.graph["plan"]),
        "aggregate": spec.aggregate,
        "routes": dg.MetadataValue.json(result.routes),
        "rollouts": dg.MetadataValue.int(len(result.trajectory_ids)),
        "data_version": result.data_version,
        "judge_score_distributions": dg.MetadataValue.json(result.judge_scores),
        "judge_score_summary": dg.MetadataValue.md(table),
        "agent_event_counts": dg.MetadataValue.json(attr["agents"]),
        "final_loss": dg.MetadataValue.float(float(m["final_loss"]) if m["final_loss"] is not None else float("nan")),
        "final_reward": dg.MetadataValue.float(float(m["final_reward"]) if m["final_reward"] is not None else float("nan")),
        "report": dg.MetadataValue.path(str(report)),
        "node_seconds": dg.MetadataValue.json(result.node_seconds),
        "seconds": dg.MetadataValue.float(round(result.seconds, 2)),
    }
