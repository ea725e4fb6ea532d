"""``agenttune eval``: BFCL and τ² calibration with a progress bar, and trajectory metrics over warehouse logs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(name="eval", help="Score models on BFCL and τ²-bench (mean and spread over seeds) and trajectories on Table 7 metrics.",
                  no_args_is_help=True)


def _settings(seeds: str, template: str, thinking_history: bool, temperature: float, max_new_tokens: int):
    from agenttune_lib.evaluation.settings import EvalSettings

    try:
        seed_list = tuple(int(s) for s in seeds.split(",") if s.strip())
    except ValueError:
        raise typer.BadParameter(f"--seeds must be comma-separated integers, got {seeds!r}") from None
    try:
        return EvalSettings(seeds=seed_list, template_mode=template, keep_thinking_history=thinking_history,
                            temperature=temperature, max_new_tokens=max_new_tokens)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _generator(model: str, adapter: Optional[str]):
    """``base`` is the packaged base model (converted once under $AGENTTUNE_HOME/models), ``tiny`` a random-init
    test model (a smoke run, not a score); anything else is a checkpoint path."""
    from agenttune_lib.evaluation.generation import load_eval_generator

    if model == "tiny":
        import tempfile

        from agenttune_lib.models.tiny import save_tiny_model

        if adapter:
            raise typer.BadParameter("--adapter needs a real base checkpoint, not --model tiny")
        with tempfile.TemporaryDirectory(prefix="agenttune_tiny_") as tmp:
            return load_eval_generator(str(save_tiny_model(Path(tmp) / "tiny")))
    if model == "base":
        from agenttune_lib.config import PlatformPaths
        from agenttune_lib.models.base import ensure_base_model

        path = str(ensure_base_model(PlatformPaths.from_env().ensure().models).path)
    else:
        if not (Path(model) / "config.json").exists():
            raise typer.BadParameter(f"--model {model!r} is neither 'base', 'tiny' nor a checkpoint directory with config.json")
        path = model
    if adapter and not (Path(adapter) / "adapter_config.json").exists():
        raise typer.BadParameter(f"--adapter {adapter!r} is not a PEFT adapter directory (no adapter_config.json)")
    return load_eval_generator(path, adapter)


def _progress(total: int, label: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    task = progress.add_task(label, total=total)
    return progress, lambda name, n: progress.update(task, advance=n, description=f"{label} {name}")


def _table(title: str, rows: list[tuple[str, dict]], settings: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("score", "mean", "std", "min", "max", "seeds"):
        table.add_column(col)
    for name, agg in rows:
        table.add_row(name, f"{agg['mean']:.3f}", f"{agg['std']:.3f}", f"{agg['min']:.3f}", f"{agg['max']:.3f}", str(agg["n_seeds"]))
    console = Console()
    console.print(table)
    console.print(f"template={settings['template_mode']} thinking_history={settings['keep_thinking_history']} "
                  f"system_prompt_sha256={settings['system_prompt_sha256']} seeds={settings['seeds']} temperature={settings['temperature']}")


def _write(output: Optional[Path], data: dict) -> None:
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        typer.echo(f"wrote {output}")


@app.command("bfcl")
def bfcl(
    model: str = typer.Option(..., help="'base' (packaged SmolLM2), 'tiny' (random-init smoke model) or a checkpoint directory"),
    categories: list[str] = typer.Option(["simple_python,multiple,parallel,parallel_multiple,irrelevance"],
                                         help="BFCL categories, comma-separated and/or repeated"),
    limit: Optional[int] = typer.Option(20, help="entries per category (omit with --limit 0 for all)"),
    sample_seed: Optional[int] = typer.Option(None, help="draw a seeded random sample of --limit entries instead of the first ones"),
    adapter: Optional[str] = typer.Option(None, help="PEFT adapter directory applied to the model"),
    seeds: str = typer.Option("0,1,2", help="comma-separated seeds; scores are the mean and spread over them"),
    template: str = typer.Option("native", help="multi-turn template: native or context"),
    thinking_history: bool = typer.Option(True, help="keep <think> blocks of earlier turns"),
    temperature: float = typer.Option(0.7, help="sampling temperature (0 = greedy)"),
    max_new_tokens: int = typer.Option(128),
    output: Optional[Path] = typer.Option(None, help="write the full result (per item verdicts) as JSON"),
) -> None:
    """Score a model on BFCL single-turn categories with BFCL's AST rules."""
    from agenttune_lib.evaluation.bfcl import SINGLE_TURN_CATEGORIES, run_bfcl

    cats = [c.strip() for group in categories for c in group.split(",") if c.strip()]
    unknown = [c for c in cats if c not in SINGLE_TURN_CATEGORIES]
    if unknown or not cats:
        raise typer.BadParameter(f"unknown categories {unknown}; choose from {list(SINGLE_TURN_CATEGORIES)}")
    settings = _settings(seeds, template, thinking_history, temperature, max_new_tokens)
    from agenttune_lib.evaluation.bfcl import load_bfcl

    n = sum(len(load_bfcl(c, limit=limit or None, sample_seed=sample_seed)) for c in cats) * len(settings.seeds)
    generate = _generator(model, adapter)
    progress, advance = _progress(n, "bfcl")
    with progress:
        result = run_bfcl(generate, cats, limit=limit or None, settings=settings, sample_seed=sample_seed, progress=advance)
    _table(f"BFCL ({model}{' + ' + adapter if adapter else ''})", [*result.categories.items(), ("overall", result.overall)], result.settings)
    _write(output, result.to_dict())


@app.command("tau2")
def tau2(
    model: str = typer.Option(..., help="'base' (packaged SmolLM2), 'tiny' (random-init smoke model) or a checkpoint directory"),
    split: str = typer.Option("test", help="τ² retail split: train, test or all"),
    limit: Optional[int] = typer.Option(5, help="tasks to run (0 = all of the split)"),
    max_steps: int = typer.Option(8, help="agent steps per task"),
    adapter: Optional[str] = typer.Option(None, help="PEFT adapter directory applied to the model"),
    seeds: str = typer.Option("0,1,2"),
    template: str = typer.Option("native", help="multi-turn template: native or context"),
    thinking_history: bool = typer.Option(True),
    temperature: float = typer.Option(0.7),
    max_new_tokens: int = typer.Option(128),
    output: Optional[Path] = typer.Option(None, help="write the result as JSON"),
) -> None:
    """Run a ReAct agent on τ² retail tasks; success is the database-state match."""
    from agenttune_lib.evaluation.tau2 import run_tau2
    from agenttune_lib.spine.tau2 import load_tau2_tasks

    settings = _settings(seeds, template, thinking_history, temperature, max_new_tokens)
    try:
        n_tasks = len(load_tau2_tasks(split, limit=limit or None))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    generate = _generator(model, adapter)
    progress, advance = _progress(n_tasks * len(settings.seeds), "tau2")
    with progress:
        result = run_tau2(generate, split=split, limit=limit or None, settings=settings, max_steps=max_steps, progress=advance)
    _table(f"τ² retail {split} ({model}{' + ' + adapter if adapter else ''})",
           [("success", result.success), *sorted(result.trajectory.items())], result.settings)
    _write(output, result.to_dict())


@app.command("trajectories")
def trajectories(
    source: Optional[str] = typer.Option(None, help="only logs from this source"),
    run_id: Optional[str] = typer.Option(None, help="only logs written by this run"),
    warehouse: Optional[Path] = typer.Option(None, help="DuckDB file (default: $AGENTTUNE_HOME/warehouse.duckdb)"),
) -> None:
    """Table 7 trajectory metrics (batch means) over EventLogs stored in the warehouse."""
    from rich.console import Console
    from rich.table import Table

    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.evaluation.trajectory import TRAJECTORY_METRICS, TrajectoryEvaluator
    from agenttune_lib.warehouse import Warehouse

    path = warehouse or PlatformPaths.from_env().warehouse
    if not Path(path).exists():
        raise typer.BadParameter(f"warehouse {path} does not exist")
    logs = Warehouse(path).read_logs(source=source, run_id=run_id)
    if not logs:
        typer.echo("no trajectories match")
        raise typer.Exit(1)
    schemas = {}
    for log in logs:
        for tool in log.metadata.get("tools") or []:
            fn = tool.get("function", tool) if isinstance(tool, dict) else {}
            if fn.get("name") and isinstance(fn.get("parameters"), dict):
                schemas[fn["name"]] = fn["parameters"]
    batch = TrajectoryEvaluator(schemas or None).evaluate_batch(logs)
    table = Table(title=f"trajectory metrics over {batch['n']} logs")
    table.add_column("metric")
    table.add_column("mean")
    for m in TRAJECTORY_METRICS:
        if m in batch["mean"]:
            v = batch["mean"][m]
            table.add_row(m, "n/a" if v is None else f"{v:.3f}")
    Console().print(table)


@app.command("comparisons")
def comparisons(
    adapter: Optional[str] = typer.Option(None, help="the newest report comparing this adapter (default: the newest report)"),
    warehouse: Optional[Path] = typer.Option(None, help="DuckDB file (default: $AGENTTUNE_HOME/warehouse.duckdb)"),
) -> None:
    """The newest paired base-vs-candidate comparison: per suite and metric, n, means, diff with its 95 % interval, and the MDE."""
    from rich.console import Console
    from rich.table import Table

    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.evaluation.store import latest_comparisons
    from agenttune_lib.warehouse import Warehouse

    path = warehouse or PlatformPaths.from_env().warehouse
    if not Path(path).exists():
        raise typer.BadParameter(f"warehouse {path} does not exist")
    rows = latest_comparisons(Warehouse(path), adapter)
    if not rows:
        typer.echo("no evaluation comparisons stored" + (f" for adapter {adapter!r}" if adapter else ""))
        raise typer.Exit(1)
    table = Table(title=f"report {rows[0]['report_id']}: {rows[0]['base_id']} vs {rows[0]['adapter_id']} (config {rows[0]['config_hash']})")
    for col in ("suite", "metric", "n", "base", "candidate", "diff", "95% CI", "MDE", "detected"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["suite"], r["metric"], str(r["n"]), f"{r['base_mean']:.3f}", f"{r['candidate_mean']:.3f}", f"{r['diff']:+.3f}",
                      f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]", f"{r['mde']:.3f}", "yes" if r["excludes_zero"] else "no")
    Console().print(table)
