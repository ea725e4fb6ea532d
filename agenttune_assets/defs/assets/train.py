"""[train] trained_adapter: a LoRA adapter trained on teacher trajectories (or a closed-loop retrain batch) on Ray."""

import base64

import dagster as dg

from agenttune_assets.defs.resources import (
    ArtifactsResource, ClosedLoopResource, ModelsResource, RayResource, ServingResource, WarehouseResource,
)

RETRAIN_BATCH_TAG = "agenttune/retrain_batch"


class TrainedAdapterConfig(dg.Config):
    """The training run: algorithm (distill, grpo, ppo, dpo, rloo, bco), steps and LoRA/rollout settings."""

    algorithm: str = "distill"
    max_steps: int = 6
    learning_rate: float = 5e-4
    batch_size: int = 4
    num_generations: int = 4
    max_completion_length: int = 24
    max_length: int = 256
    lora_r: int = 8
    lora_top_layers: int = 4
    reward_funcs: list[str] = ["format_reward"]
    tools: list[str] = []
    efficient: bool = False
    keep_rollouts: int = 0
    max_trajectories: int = 64
    retrain_algorithm: str = "dpo"
    retrain_warm_start: bool = True  # a closed-loop retrain continues the serving adapter (same base) instead of a fresh LoRA
    dpo_loss: list[str] = ["sigmoid"]  # DPO's TRL loss terms; ["sigmoid", "sft"] is RPO (DPO plus the chosen answer's NLL)
    precision: str = "auto"  # bfloat16 mixed precision where the hardware has native bf16 (~2.1x faster steps; bench/precision.py), else float32
    # distillation (issue 12): success-only, Table 3 token weights, bounded wall-clock
    success_threshold: float = 1.0
    min_episodes: int = 4
    loss: str = "weighted"
    epochs: float = 0.0
    max_tool_chars: int = 1200
    time_budget_s: float = 150.0
    # the default run's distillation, sized from measured LoRA throughput (README: what the default run learns);
    # max_steps / learning_rate / max_length above stay the RL and closed-loop retrain defaults
    distill_max_steps: int = 40
    distill_learning_rate: float = 5e-3
    # 768 tokens hold the system prompt, the question and the first searches of an expert QA walk, not its answer (a
    # 2-hop walk with 1,200-character results needs 1,125-1,311 tokens); 1,280 measured worse in the 150 s budget
    # (10 steps instead of 22: fewer valid calls, Doc@8 0.05 against 0.25). See bench/RESULTS.md.
    distill_max_length: int = 768
    environment: str = ""  # RL environment (issue 16): tau2_retail, qa_search (needs qa_index) or tool_call; "" = teacher tasks
    env_split: str = "train"
    qa_index: str = ""


def _teacher_logs(wh, snapshot=None):
    """The newest teacher run's logs (older runs' logs stay in the warehouse for lineage, not for this adapter).

    On a DuckLake warehouse they are read at ``snapshot``, the one the adapter records.
    """
    if not wh.has_table("trajectories"):
        return []
    at = f" AT (VERSION => {int(snapshot)})" if snapshot is not None else ""
    latest = wh.execute(f"SELECT run_id FROM trajectories{at} WHERE asset_key = ? ORDER BY created_at DESC LIMIT 1", ["teacher_trajectories"])
    if not latest:
        return []
    if latest[0][0] is None:
        return wh.read_logs(where="t.asset_key = ?", params=["teacher_trajectories"], snapshot=snapshot)
    return wh.read_logs(where="t.asset_key = ? AND t.run_id = ?", params=["teacher_trajectories", latest[0][0]], snapshot=snapshot)


@dg.asset(
    group_name="train",
    deps=["teacher_trajectories", "eventlog_tables", "base_model"],
    pool="warehouse",
    kinds={"pytorch", "ray"},
)
def trained_adapter(
    context: dg.AssetExecutionContext,
    config: TrainedAdapterConfig,
    warehouse: WarehouseResource,
    models: ModelsResource,
    artifacts: ArtifactsResource,
    ray: RayResource,
    closed_loop: ClosedLoopResource,
    serving: ServingResource,
) -> dg.MaterializeResult:
    """LoRA adapter directory under the models dir, with lineage rows (adapters, training_rows) in the warehouse."""
    from agenttune_lib.models.base import ensure_base_model
    from agenttune_lib.rl.train import TrainConfig, plot_curves, train_adapter
    from agenttune_lib.warehouse import Provenance

    wh = warehouse.get()
    info = ensure_base_model(models.get())
    base_name = f"{info.name}@{info.version[:12]}"
    algorithm, offline_rows, batch_id, parent = config.algorithm, None, context.run.tags.get(RETRAIN_BATCH_TAG), None
    if batch_id:
        from agenttune_lib.closed_loop.buffer import TrainingBuffer, retrain_rows

        batch = TrainingBuffer(wh).read_batch(batch_id)
        algorithm = config.retrain_algorithm
        try:  # DPO/BCO read preference/label rows, GRPO multi-completion rows; never a fallback to teacher trajectories
            offline_rows = retrain_rows(batch, algorithm)
        except ValueError as exc:
            raise dg.Failure(f"trained_adapter: {exc}") from None
        context.log.info(f"retrain batch {batch_id}: {len(offline_rows)} {algorithm} rows from {len(batch.accepted)} accepted examples")
        if config.retrain_warm_start:
            from agenttune_assets.defs.assets.deploy import deploy_dir
            from agenttune_lib.closed_loop import AdapterDeployer
            from agenttune_lib.closed_loop.service import warm_start_adapter

            parent, why = warm_start_adapter(wh, AdapterDeployer(deploy_dir(closed_loop, serving), wh), base_name)
            context.log.info(f"retrain batch {batch_id}: {why}")
    snapshot = wh.snapshot_id()  # None on a DuckDB file
    logs = _teacher_logs(wh, snapshot)
    if not logs and offline_rows is None and not config.environment:
        raise dg.Failure(
            "trained_adapter: no teacher trajectories in the warehouse (asset_key 'teacher_trajectories'); "
            "materialize teacher_trajectories first"
        )
    distilling = algorithm == "distill"
    train_config = TrainConfig(
        algorithm=algorithm, max_steps=config.distill_max_steps if distilling else config.max_steps,
        learning_rate=config.distill_learning_rate if distilling else config.learning_rate, batch_size=config.batch_size,
        num_generations=config.num_generations, max_completion_length=config.max_completion_length,
        max_length=config.distill_max_length if distilling else config.max_length,
        lora_r=config.lora_r, lora_top_layers=config.lora_top_layers, reward_funcs=tuple(config.reward_funcs), tools=tuple(config.tools), efficient=config.efficient,
        keep_rollouts=config.keep_rollouts or None, max_trajectories=config.max_trajectories,
        success_threshold=config.success_threshold, min_episodes=config.min_episodes, loss=config.loss, epochs=config.epochs or None,
        max_tool_chars=config.max_tool_chars or None, time_budget_s=config.time_budget_s or None,
        rollout_actors=ray.rollout_actors if ray.enabled and algorithm in ("grpo", "ppo", "rloo") else 0,
        environment=(config.environment or None) if not batch_id else None, env_split=config.env_split, qa_index=config.qa_index or None,
        dpo_loss=tuple(config.dpo_loss) if algorithm == "dpo" else ("sigmoid",), precision=config.precision,
    )
    provenance = Provenance(run_id=context.run_id, asset_key=context.asset_key.to_user_string(), model_version=base_name)
    context.log.info(f"training {algorithm} on {len(logs)} teacher trajectories ({'Ray' if ray.enabled else 'in-process'})")
    result = ray.run(  # the training task computes on every core but what its rollout actors (0.5 CPU each) need
        train_adapter, train_config, info.path, logs, models.get(), task_cpus=None, reserve_cpus=0.5 * train_config.rollout_actors,
        warehouse=wh, provenance=provenance,
        run_id=context.run_id, base_model_name=base_name, offline_rows=offline_rows, warehouse_snapshot=snapshot,
        init_adapter=parent.path if parent else None, parent_adapter_id=parent.adapter_id if parent else None,
    )
    png = plot_curves(result.loss_curve, result.reward_curve, artifacts.get() / "train" / f"{result.adapter_id}.png", title=f"{algorithm}: {result.adapter_id}")
    encoded = base64.b64encode(png.read_bytes()).decode()
    m = result.metrics()
    return dg.MaterializeResult(
        metadata={
            "adapter_id": result.adapter_id,
            "path": dg.MetadataValue.path(str(result.adapter_dir)),
            "base_model": base_name,
            "algorithm": algorithm,
            "data_version": result.data_version,
            "training_rows": dg.MetadataValue.int(len(result.trajectory_ids)),
            "first_loss": dg.MetadataValue.float(float(m["first_loss"] if m["first_loss"] is not None else float("nan"))),
            "final_loss": dg.MetadataValue.float(float(m["final_loss"] if m["final_loss"] is not None else float("nan"))),
            "rollouts_generated": dg.MetadataValue.int(result.rollouts_generated),
            "rollouts_used": dg.MetadataValue.int(result.rollouts_used),
            "rollouts_skipped_prompts": dg.MetadataValue.int(result.prompts_skipped),
            "filter_counts": dg.MetadataValue.json(result.filter_counts),
            "retrain_batch": batch_id or "-",
            "warm_start_from": parent.adapter_id if parent else "-",
            **({"warehouse_snapshot": dg.MetadataValue.int(snapshot)} if snapshot is not None else {}),
            "seconds": dg.MetadataValue.float(round(result.seconds, 2)),
            "curves": dg.MetadataValue.md(f"![loss and reward curves](data:image/png;base64,{encoded})"),
            "curves_png": dg.MetadataValue.path(str(png)),
        },
        data_version=dg.DataVersion(f"{result.data_version}:{result.adapter_id}"),
    )
