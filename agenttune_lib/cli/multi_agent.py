"""``agenttune multi-agent``: check a YAML graph spec, train through it with GRPO, read per-agent/per-judge attribution."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer

from agenttune_lib.cli._tasks import load_task_logs

app = typer.Typer(help="Multi-agent GRPO: rollout policies and a judge panel composed into one graph (paper §3.10).", no_args_is_help=True)


def _spec(path: Optional[Path]):
    from agenttune_lib.multi_agent.spec import default_spec_path, load_graph_spec

    try:
        return load_graph_spec(path or default_spec_path())
    except (ValueError, FileNotFoundError) as exc:
        raise typer.BadParameter(str(exc)) from exc


@app.command()
def check(spec: Optional[Path] = typer.Argument(None, help="graph spec YAML (default: the packaged planner/solver spec)")) -> None:
    """Validate a graph spec and print its policies, judges, aggregate and router."""
    s = _spec(spec)
    typer.echo(json.dumps({
        "name": s.name,
        "policies": [{"name": p.name, "model": p.model, "trainable": p.trainable, "prompt_from": p.prompt_from} for p in s.policies],
        "judges": [{"name": j.name, "kind": j.kind, "reward": j.reward, "model": j.model, "weight": j.weight} for j in s.judges],
        "aggregate": s.aggregate,
        "router": dataclasses.asdict(s.router) if s.router else None,
        "train": dataclasses.asdict(s.train),
    }, indent=2))


@app.command()
def train(
    spec: Optional[Path] = typer.Option(None, "--spec", help="graph spec YAML (default: the packaged planner/solver spec)"),
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="JSONL of {'task', 'answer'?} prompts (default: teacher trajectories in the warehouse)"),
    base_model: Optional[Path] = typer.Option(None, "--base-model", help="checkpoint for spec models named 'base' (default: the packaged SmolLM2)"),
    steps: int = typer.Option(0, "--steps", help="override the spec's max_steps (0 keeps it)"),
) -> None:
    """Train the spec's trainable policy through its graph; rollouts (authored events, judge REWARDs) go to the warehouse."""
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.multi_agent.train import score_summary, train_multi_agent
    from agenttune_lib.warehouse import Provenance, Warehouse

    s = _spec(spec)
    if steps:
        s = dataclasses.replace(s, train=dataclasses.replace(s.train, max_steps=steps))
    paths = PlatformPaths.from_env().ensure()
    wh = Warehouse(paths.warehouse)
    logs = load_task_logs(tasks, wh)
    base_path, base_name = base_model, str(base_model) if base_model else None
    needs_base = any(p.model == "base" for p in s.policies) or any(j.kind == "llm" and j.model == "base" for j in s.judges)
    if base_model is None and needs_base:
        from agenttune_lib.models.base import ensure_base_model

        info = ensure_base_model(paths.models)
        base_path, base_name = info.path, f"{info.name}@{info.version[:12]}"
    served = None
    if any(p.model == "deployed" for p in s.policies) or any(j.kind == "llm" and j.model == "deployed" for j in s.judges):
        from agenttune_lib.models.serving import resolve_deployed_model

        try:  # the base (--base-model, else the platform's) plus the adapter DEPLOYED.json names
            served = resolve_deployed_model(paths.models / "deployed", base_model, paths.models)
        except (FileNotFoundError, ValueError) as exc:
            raise typer.BadParameter(str(exc)) from exc
        typer.echo(f"model 'deployed' is {served.served_adapter_id}")
    run_id = f"cli-multi-agent-{s.name}"
    result = train_multi_agent(
        s, logs, paths.models, base_model_path=base_path, warehouse=wh,
        provenance=Provenance(run_id=run_id, asset_key="cli:multi-agent", model_version=base_name,
                              adapter_version=served.served_adapter_id if served else None), run_id=run_id,
        base_model_name=base_name, log_fn=typer.echo, served=served,
    )
    _print_scores({k: score_summary(v) for k, v in result.judge_scores.items()})
    typer.echo(json.dumps({"adapter_id": result.adapter_id, "path": str(result.adapter_dir), "data_version": result.data_version,
                           "run_id": run_id, **result.metrics()}, indent=2, default=str))


@app.command()
def attribution(run_id: Optional[str] = typer.Option(None, "--run-id", help="only this run's multi-agent rollouts")) -> None:
    """Per-agent event counts and per-judge reward statistics from the warehouse (events.author)."""
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.multi_agent.train import attribution as read_attribution
    from agenttune_lib.warehouse import Warehouse

    wh = Warehouse(PlatformPaths.from_env().ensure().warehouse)
    if not wh.has_table("events"):
        raise typer.BadParameter("the warehouse has no events yet")
    attr = read_attribution(wh, run_id=run_id)
    if not attr["agents"] and not attr["judges"]:
        raise typer.BadParameter(f"no multi-agent rollouts in the warehouse{f' for run {run_id!r}' if run_id else ''}")
    typer.echo(json.dumps(attr, indent=2))


def _print_scores(summaries: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="judge score distributions")
    for col in ("judge", "n", "mean", "std", "min", "median", "max"):
        table.add_column(col)
    for name, s in summaries.items():
        if s["n"]:
            table.add_row(name, str(s["n"]), *(f"{s[k]:.3f}" for k in ("mean", "std", "min", "median", "max")))
    Console(stderr=True).print(table)
