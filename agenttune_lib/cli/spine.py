"""``agenttune spine``: τ² tasks, harness conformance, the base model, teacher collection and trajectory views."""
from __future__ import annotations

import json
from typing import Optional

import typer

app = typer.Typer(name="spine", help="The agentic spine: tasks, harnesses, teacher collection, trajectories.", no_args_is_help=True)


def _warehouse(path: Optional[str]):
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.warehouse import Warehouse

    paths = PlatformPaths.from_env().ensure()
    return Warehouse(path or paths.warehouse)


@app.command()
def tasks(split: str = typer.Option("train", help="train, test, base or all."), limit: int = typer.Option(10, help="How many to list.")) -> None:
    """List τ² retail tasks of a split: gold action counts, reward basis, and whether the gold state is the initial one."""
    from rich.console import Console
    from rich.table import Table

    from agenttune_lib.spine.tau2 import gold_equals_initial, load_tau2_tasks

    try:
        rows = load_tau2_tasks(split)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--split") from None
    table = Table(title=f"τ² retail {split}: {len(rows)} tasks")
    for col in ("id", "actions", "reward basis", "gold=initial", "request"):
        table.add_column(col)
    for t in rows[:limit]:
        basis = "+".join(t.reward_basis) + (f" ({len(t.nl_assertions)} NL)" if t.nl_assertions else "")
        table.add_row(t.id, str(len(t.actions)), basis, "yes" if gold_equals_initial(t) else "", t.reason_for_call[:90])
    Console(width=160).print(table)


@app.command()
def conformance(harness: str = typer.Option("tau2", help="tau2 or dict.")) -> None:
    """Exercise a harness's declared capabilities and print drift (exit 1 on drift)."""
    from agenttune_lib.spine import DictToolHarness, run_conformance
    from agenttune_lib.spine.tau2 import Tau2RetailHarness, load_tau2_tasks

    if harness == "tau2":
        report = run_conformance(Tau2RetailHarness(max_steps=4), task=load_tau2_tasks("train")[0])
    elif harness == "dict":

        def echo(text: str) -> str:
            """Echo the text back."""
            return text

        report = run_conformance(DictToolHarness({"echo": echo}, max_steps=4))
    else:
        raise typer.BadParameter(f"unknown harness {harness!r}; expected tau2 or dict", param_hint="--harness")
    typer.echo(json.dumps({"passed": report.passed, "drift": report.drift, "checks": report.checks}, indent=2))
    raise typer.Exit(0 if report.passed else 1)


@app.command("base-model")
def base_model(force: bool = typer.Option(False, help="Convert again even if cached.")) -> None:
    """Convert the packaged SmolLM2 GGUF into the cached checkpoint under $AGENTTUNE_HOME/models."""
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.models.base import ensure_base_model

    info = ensure_base_model(PlatformPaths.from_env().ensure().models, force=force)
    typer.echo(json.dumps(info.to_dict(), indent=2))


@app.command()
def collect(
    split: str = typer.Option("train", help="τ² split."),
    n_tasks: int = typer.Option(2, help="How many tasks from the split."),
    strategy: str = typer.Option("react", help="react, plan_execute, reflexion or tree_of_thoughts."),
    max_steps: int = typer.Option(2),
    max_new_tokens: int = typer.Option(48),
    temperature: float = typer.Option(0.0),
    checkpoint: Optional[str] = typer.Option(None, help="A converted checkpoint (default: the packaged base model)."),
    warehouse: Optional[str] = typer.Option(None, help="DuckDB path (default: $AGENTTUNE_HOME/warehouse.duckdb)."),
) -> None:
    """Run the teacher over τ² tasks and write its EventLogs (with provenance) to the warehouse."""
    import uuid

    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.models.base import ensure_base_model
    from agenttune_lib.models.generate import GenerationConfig, load_chat_generator
    from agenttune_lib.spine.collect import STRATEGIES, TeacherConfig, collect_teacher, tau2_teacher_tasks
    from agenttune_lib.warehouse import Provenance

    if strategy not in STRATEGIES:
        raise typer.BadParameter(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}", param_hint="--strategy")
    if checkpoint:
        path, version = checkpoint, checkpoint
    else:
        info = ensure_base_model(PlatformPaths.from_env().ensure().models)
        path, version = str(info.path), f"{info.name}@{info.version}"
    generator = load_chat_generator(path, GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, num_threads=1))
    config = TeacherConfig(strategy=strategy, max_steps=max_steps)
    teacher_tasks = tau2_teacher_tasks(split, n_tasks, config)
    run = collect_teacher(generator, teacher_tasks, config, model_name=version, progress=lambda i, log: typer.echo(f"task {i + 1}/{len(teacher_tasks)}: {len(log)} events"))
    run_id = f"cli-{uuid.uuid4().hex[:12]}"
    wh = _warehouse(warehouse)
    wh.append_logs(
        run.logs,
        provenance=[Provenance(run_id=run_id, asset_key="cli:spine.collect", model_version=version, extra={"task_id": t.task_id}) for t in run.tasks],
        source="teacher",
    )
    summary = {k: v for k, v in run.summary().items()}
    summary["run_id"] = run_id
    typer.echo(json.dumps(summary, indent=2, default=str))


@app.command()
def show(trajectory_id: str, warehouse: Optional[str] = typer.Option(None)) -> None:
    """Render one stored trajectory as markdown."""
    from agenttune_lib.spine.collect import trajectory_markdown

    try:
        log = _warehouse(warehouse).get_log(trajectory_id)
    except KeyError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    typer.echo(trajectory_markdown(log))
