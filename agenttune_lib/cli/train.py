"""``agenttune train``: train a LoRA adapter with any of the five RL algorithms (or distillation), with tools."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from agenttune_lib.cli._tasks import load_task_logs

app = typer.Typer(help="Train a LoRA adapter: distill teacher trajectories or run GRPO/PPO/DPO/RLOO/BCO with tool-calling rollouts.")


def _split(values: list[str]) -> tuple[str, ...]:
    return tuple(v.strip() for item in values for v in item.split(",") if v.strip())


@app.callback(invoke_without_command=True)
def train(
    algorithm: str = typer.Option("grpo", "--algorithm", "-a", help="distill, grpo, ppo, dpo, rloo or bco"),
    tools: list[str] = typer.Option([], "--tools", help="tools for agentic rollouts: 'calculator' or 'package.module:attr' (repeat or comma-separate)"),
    reward: list[str] = typer.Option([], "--reward", help="REWARD_REGISTRY names (or package.module:attr) combined with equal weights (default format_reward; environment_reward with --env)"),
    env: Optional[str] = typer.Option(None, "--env", help="train in an RL environment: tau2_retail, qa_search or tool_call (its tasks, tools and reward)"),
    env_split: str = typer.Option("train", "--env-split", help="which split of the environment's tasks"),
    qa_index: Optional[Path] = typer.Option(None, "--qa-index", help="search index directory for --env qa_search"),
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="JSONL of {'task', 'answer'?} prompts (default: teacher trajectories in the warehouse)"),
    base_model: Optional[Path] = typer.Option(None, "--base-model", help="checkpoint dir (default: the packaged SmolLM2 under the models dir)"),
    steps: int = typer.Option(4, "--steps", help="optimizer steps"),
    learning_rate: float = typer.Option(5e-4, "--lr"),
    batch_size: int = typer.Option(4, "--batch-size"),
    num_generations: int = typer.Option(4, "--num-generations", help="rollouts per prompt (GRPO/PPO/RLOO; DPO/BCO ranking)"),
    max_completion_length: int = typer.Option(32, "--max-completion-length"),
    efficient: bool = typer.Option(False, "--efficient/--no-efficient", help="online pre-rollout filtering (GRPO/PPO)"),
    keep_rollouts: int = typer.Option(0, "--keep-rollouts", help="max-variance down-sampling to m rollouts per prompt (0 keeps all)"),
    max_trajectories: int = typer.Option(16, "--max-trajectories"),
) -> None:
    """Train and save an adapter under the models dir; rollouts and lineage go to the warehouse."""
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.rl.train import TrainConfig, train_adapter, validate_names
    from agenttune_lib.warehouse import Provenance, Warehouse

    try:
        config = TrainConfig(
            algorithm=algorithm, max_steps=steps, learning_rate=learning_rate, batch_size=batch_size, num_generations=num_generations,
            max_completion_length=max_completion_length, reward_funcs=_split(reward) or (("environment_reward",) if env else ("format_reward",)),
            tools=_split(tools), efficient=efficient, keep_rollouts=keep_rollouts or None, max_trajectories=max_trajectories,
            environment=env, env_split=env_split, qa_index=str(qa_index) if qa_index else None,
        )
        validate_names(config)  # a bad tool or reward name fails here, before any model loads
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if tasks is not None and config.algorithm == "distill":
        raise typer.BadParameter("--tasks gives prompts only; distill trains on teacher trajectories in the warehouse")
    if env and tasks is not None:
        raise typer.BadParameter("--env brings its own tasks; drop --tasks")
    paths = PlatformPaths.from_env().ensure()
    wh = Warehouse(paths.warehouse)
    logs = [] if env else load_task_logs(tasks, wh)
    if base_model is None:
        from agenttune_lib.models.base import ensure_base_model

        info = ensure_base_model(paths.models)
        base_path, base_name = info.path, f"{info.name}@{info.version[:12]}"
    else:
        base_path, base_name = base_model, str(base_model)
    run_id = f"cli-train-{config.algorithm}"
    result = train_adapter(
        config, base_path, logs, paths.models, warehouse=wh, provenance=Provenance(run_id=run_id, asset_key="cli:train", model_version=base_name),
        run_id=run_id, base_model_name=base_name, log_fn=typer.echo,
    )
    typer.echo(json.dumps({"adapter_id": result.adapter_id, "path": str(result.adapter_dir), "data_version": result.data_version, **result.metrics()}, indent=2, default=str))
