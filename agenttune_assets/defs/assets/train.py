"""[train] trained_adapter: a LoRA adapter trained on teacher trajectories (or a closed-loop retrain batch) on Ray."""

import base64

import dagster as dg

from agenttune_assets.defs.resources import (
    ArtifactsResource, ClosedLoopResource, ModelsResource, RayResource, ServingResource, WarehouseResource,
)

RETRAIN_BATCH_TAG = "agenttune/retrain_batch"


class DistillSettings(dg.Config):
    """Distillation of teacher trajectories (paper §3.8): success-only episodes, Table 3 token weights, bounded by steps."""

    max_steps: int = 60
    epochs: float = 0.0  # > 0: whole passes over the rows instead of max_steps
    learning_rate: float = 5e-4
    max_length: int = 1024
    rows_mode: str = "turns"  # every assistant turn, the final answer included, carries loss (distill.ROW_MODES)
    loss: str = "weighted"
    success_threshold: float = 1.0
    min_episodes: int = 4
    max_tool_chars: int = 2400
    max_trajectories: int = 96
    # Each no-tool demonstration of these kinds (teachers.no_tool.NO_TOOL_KINDS; []: every kind) this many times in the
    # rows: near misses, unfit retail tools and capitalising, the kinds that neither offer corpus search nor reuse QA
    # train questions (repeating those taught declining QA questions: bench/RESULTS.md, near-miss no-tool items).
    no_tool_repeats: int = 5
    no_tool_repeat_kinds: list[str] = ["unfit_near", "unfit_retail", "upper"]
    answer_weight: float = 1.0  # multiplies each answer-after-a-search's loss weight (Table 3: 1.0 vs 2.0 per call)


class RLSettings(dg.Config):
    """Online RL (grpo, ppo, rloo, and dpo/bco from the student's own rollouts) on teacher tasks or an environment."""

    max_steps: int = 6
    learning_rate: float = 5e-4
    num_generations: int = 4
    max_completion_length: int = 24
    max_length: int = 256
    reward_funcs: list[str] = ["format_reward"]
    tools: list[str] = []
    efficient: bool = False
    keep_rollouts: int = 0
    max_trajectories: int = 64
    environment: str = ""  # tau2_retail, qa_search (needs qa_index) or tool_call; "" = teacher tasks
    env_split: str = "train"
    qa_index: str = ""


class RetrainSettings(dg.Config):
    """A closed-loop retrain on a drained buffer batch (run tag ``agenttune/retrain_batch``)."""

    algorithm: str = "dpo"
    warm_start: bool = True  # continue the serving adapter (same base) instead of a fresh LoRA
    dpo_loss: list[str] = ["sigmoid"]  # ["sigmoid", "sft"] is RPO (DPO plus the chosen answer's NLL)
    max_steps: int = 6
    learning_rate: float = 5e-4
    max_length: int = 256


def _no_tool_kinds(kinds: list[str]) -> tuple[str, ...]:
    """``distill.no_tool_repeat_kinds`` checked against the kinds the no-tool teacher builds."""
    from agenttune_lib.teachers.no_tool import NO_TOOL_KINDS

    unknown = sorted(set(kinds) - set(NO_TOOL_KINDS))
    if unknown:
        raise ValueError(f"distill.no_tool_repeat_kinds: unknown kind(s) {unknown}; the no-tool kinds are {list(NO_TOOL_KINDS)}")
    return tuple(kinds)


class TrainedAdapterConfig(dg.Config):
    """The training run: ``algorithm`` (distill, grpo, ppo, dpo, rloo, bco) plus one settings block per concern.

    Every path is bounded by optimizer steps; ``max_wall_s`` only fails a run that overruns it (0: no limit).
    """

    algorithm: str = "distill"
    batch_size: int = 4
    lora_r: int = 8
    lora_top_layers: int = 0  # 0: every linear layer of every block; N: the top N blocks only (faster backward, learns less)
    seed: int = 0
    precision: str = "auto"  # bf16 autocast where the CPU has native bf16 (bench/precision.py), else float32
    max_wall_s: float = 3600.0
    distill: DistillSettings = DistillSettings()
    rl: RLSettings = RLSettings()
    retrain: RetrainSettings = RetrainSettings()

    def to_lib(self, algorithm: str, retrain: bool, rollout_actors: int):
        """The library's TrainConfig for this run (a retrain batch's algorithm overrides ``algorithm``)."""
        from agenttune_lib.rl.train import TrainConfig

        d, r, rt = self.distill, self.rl, self.retrain
        common = dict(algorithm=algorithm, batch_size=self.batch_size, lora_r=self.lora_r, lora_top_layers=self.lora_top_layers,
                      seed=self.seed, precision=self.precision, max_wall_s=self.max_wall_s or None)
        if retrain:
            return TrainConfig(**common, max_steps=rt.max_steps, learning_rate=rt.learning_rate, max_length=rt.max_length,
                               dpo_loss=tuple(rt.dpo_loss) if algorithm == "dpo" else ("sigmoid",))
        if algorithm == "distill":
            return TrainConfig(**common, max_steps=d.max_steps, learning_rate=d.learning_rate, max_length=d.max_length,
                               epochs=d.epochs or None, rows_mode=d.rows_mode, loss=d.loss, success_threshold=d.success_threshold,
                               min_episodes=d.min_episodes, max_tool_chars=d.max_tool_chars or None, max_trajectories=d.max_trajectories,
                               no_tool_repeats=d.no_tool_repeats, no_tool_repeat_kinds=_no_tool_kinds(d.no_tool_repeat_kinds),
                               answer_weight=d.answer_weight)
        return TrainConfig(**common, max_steps=r.max_steps, learning_rate=r.learning_rate, max_length=r.max_length,
                           num_generations=r.num_generations, max_completion_length=r.max_completion_length,
                           reward_funcs=tuple(r.reward_funcs), tools=tuple(r.tools), efficient=r.efficient,
                           keep_rollouts=r.keep_rollouts or None, max_trajectories=r.max_trajectories,
                           rollout_actors=rollout_actors if algorithm in ("grpo", "ppo") else 0,  # RLOO drops the sampling logprobs the IS correction needs
                           environment=r.environment or None, env_split=r.env_split, qa_index=r.qa_index or None)


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
    from agenttune_lib.rl.lineage import latest_teacher_logs
    from agenttune_lib.rl.train import plot_curves, train_adapter
    from agenttune_lib.warehouse import Provenance

    wh = warehouse.get()
    info = ensure_base_model(models.get())
    base_name = f"{info.name}@{info.version[:12]}"
    retrain, batch_id = None, context.run.tags.get(RETRAIN_BATCH_TAG)
    if batch_id:
        from agenttune_assets.defs.assets.deploy import deploy_dir
        from agenttune_lib.closed_loop import AdapterDeployer
        from agenttune_lib.closed_loop.service import retrain_inputs

        try:
            retrain = retrain_inputs(wh, batch_id, config.retrain.algorithm, config.retrain.warm_start,
                                     AdapterDeployer(deploy_dir(closed_loop, serving), wh), base_name)
        except ValueError as exc:
            raise dg.Failure(f"trained_adapter: {exc}") from None
        for note in retrain.notes:
            context.log.info(note)
    algorithm, parent = (retrain.algorithm, retrain.parent) if retrain else (config.algorithm, None)
    snapshot = wh.snapshot_id()  # None on a DuckDB file
    logs = latest_teacher_logs(wh, snapshot)
    if not logs and retrain is None and not config.rl.environment:
        raise dg.Failure(
            "trained_adapter: no teacher trajectories in the warehouse (asset_key 'teacher_trajectories'); "
            "materialize teacher_trajectories first"
        )
    train_config = config.to_lib(algorithm, retrain=bool(batch_id), rollout_actors=ray.rollout_actors if ray.enabled else 0)
    provenance = Provenance(run_id=context.run_id, asset_key=context.asset_key.to_user_string(), model_version=base_name)
    context.log.info(f"training {algorithm} on {len(logs)} teacher trajectories ({'Ray' if ray.enabled else 'in-process'})")
    result = ray.run(  # the training task computes on every core but what its rollout actors (0.5 CPU each) need
        train_adapter, train_config, info.path, logs, models.get(), task_cpus=None, reserve_cpus=0.5 * train_config.rollout_actors,
        warehouse=wh, provenance=provenance,
        run_id=context.run_id, base_model_name=base_name, offline_rows=retrain.rows if retrain else None, warehouse_snapshot=snapshot,
        init_adapter=parent.path if parent else None, parent_adapter_id=parent.adapter_id if parent else None,
    )
    png = plot_curves(result.loss_curve, result.reward_curve, artifacts.get() / "train" / f"{result.adapter_id}.png", title=f"{algorithm}: {result.adapter_id}")
    return dg.MaterializeResult(metadata=_adapter_metadata(result, base_name, algorithm, batch_id, parent, snapshot, png),
                                data_version=dg.DataVersion(f"{result.data_version}:{result.adapter_id}"))


def _adapter_metadata(result, base_name: str, algorithm: str, batch_id: str | None, parent, snapshot: int | None, png) -> dict:
    """The trained_adapter materialization's metadata: identity, lineage, step-bounded training figures, curves."""
    m = result.metrics()
    nan_if_none = lambda v: float(v if v is not None else float("nan"))  # noqa: E731
    return {
        "adapter_id": result.adapter_id,
        "path": dg.MetadataValue.path(str(result.adapter_dir)),
        "base_model": base_name,
        "algorithm": algorithm,
        "data_version": result.data_version,
        "training_rows": dg.MetadataValue.int(len(result.trajectory_ids)),
        "first_loss": dg.MetadataValue.float(nan_if_none(m["first_loss"])),
        "final_loss": dg.MetadataValue.float(nan_if_none(m["final_loss"])),
        "rollouts_generated": dg.MetadataValue.int(result.rollouts_generated),
        "rollouts_used": dg.MetadataValue.int(result.rollouts_used),
        "rollouts_skipped_prompts": dg.MetadataValue.int(result.prompts_skipped),
        "filter_counts": dg.MetadataValue.json(result.filter_counts),
        "retrain_batch": batch_id or "-",
        "warm_start_from": parent.adapter_id if parent else "-",
        **({"warehouse_snapshot": dg.MetadataValue.int(snapshot)} if snapshot is not None else {}),
        "steps": dg.MetadataValue.int(result.steps),
        "tokens_seen": dg.MetadataValue.int(result.tokens_seen),
        "row_stats": dg.MetadataValue.json(result.row_stats),
        "loss_curve": dg.MetadataValue.json([round(x, 4) for x in result.loss_curve]),
        "seconds": dg.MetadataValue.float(round(result.seconds, 2)),
        "curves": dg.MetadataValue.md(f"![loss and reward curves](data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()})"),
        "curves_png": dg.MetadataValue.path(str(png)),
    }
