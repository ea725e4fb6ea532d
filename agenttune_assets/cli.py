"""The ``agenttune`` console script: the library's CLI plus the commands that drive Dagster.

The library stays free of Dagster; this module adds ``materialize``, ``ui`` and ``instance``
on top of ``agenttune_lib.cli.app``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import typer

from agenttune_lib.cli import app
from agenttune_lib.cli import lineage as _lineage_cli

instance_app = typer.Typer(help="The Dagster instance the platform records runs in.", no_args_is_help=True)
app.add_typer(instance_app, name="instance")


def _prepare_home() -> Path:
    """``prepare_dagster_home`` with a configuration conflict turned into a clear CLI error (exit 2)."""
    from agenttune_assets.instance import InstanceConfigError, prepare_dagster_home

    try:
        return prepare_dagster_home()
    except (InstanceConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


@app.command()
def materialize(
    select: list[str] = typer.Option(None, "--select", "-s", help="Asset keys to materialize (default: the whole graph)."),
    json_out: Path = typer.Option(None, "--json", help="Write the run summary (steps, scores, gate, serving) to this JSON file."),
    profile: str = typer.Option("default", "--profile", "-p", help="Run sizes: default (~10 min on 2 cores) or full (~60 min); see README."),
) -> None:
    """Materialize the whole asset graph (the main job) with a live view; Dagster's event log goes to a log file.

    Exit status 0 only when every run succeeded; the summary names the gate's decision either way.
    """
    from agenttune_assets.definitions import defs
    from agenttune_assets.profiles import PROFILES
    from agenttune_assets.run_view import log_file_path, render_summary, run_and_watch
    from agenttune_lib.config import PlatformPaths

    known = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    unknown = [s for s in select or [] if s not in known]
    if unknown:
        typer.echo(f"error: unknown asset key(s) {unknown}; known: {sorted(known)}", err=True)
        raise typer.Exit(2)
    if profile not in PROFILES:
        typer.echo(f"error: unknown --profile {profile!r}; expected one of {sorted(PROFILES)}", err=True)
        raise typer.Exit(2)
    home = _prepare_home()
    console = _console()
    log_path = log_file_path(PlatformPaths.from_env().home)
    console.print(f"agenttune materialize: DAGSTER_HOME={home}")
    console.print(f"log (Dagster event log, warnings): {log_path}")
    console.print(f"profile: {profile}")
    summary = run_and_watch(list(select or []), console, log_path, profile=profile)
    render_summary(console, summary)
    if json_out:
        json_out.write_text(json.dumps(summary.to_dict(), indent=2, default=str))
    raise typer.Exit(0 if summary.success else 1)


@app.command()
def status(json_out: Path = typer.Option(None, "--json", help="Also write the summary to this JSON file.")) -> None:
    """The summary of the latest ``agenttune materialize`` run: per-asset time, scores, gate decision, what serves."""
    from agenttune_assets.run_view import latest_cli_run_summary, render_summary

    _prepare_home()
    console = _console()
    summary = latest_cli_run_summary(console)
    if summary is None:
        typer.echo(f"no main_job run in the instance at DAGSTER_HOME={os.environ.get('DAGSTER_HOME')} yet; run `agenttune materialize`")
        raise typer.Exit(1)
    render_summary(console, summary)
    if json_out:
        json_out.write_text(json.dumps(summary.to_dict(), indent=2, default=str))
    raise typer.Exit(0 if summary.success else 1)


@app.command()
def init(
    kind: str = typer.Option(None, "--kind", help="sqlite (embedded) or postgres; default $AGENTTUNE_INSTANCE or sqlite."),
    dagster_home: Path = typer.Option(None, "--dagster-home", help="Instance directory; default $DAGSTER_HOME, else $AGENTTUNE_HOME/dagster[-postgres]."),
) -> None:
    """Write the Dagster instance's dagster.yaml from the packaged template, once (an existing file is kept)."""
    from agenttune_assets.instance import InstanceConfigError, default_home, init_instance

    kind = (kind or os.environ.get("AGENTTUNE_INSTANCE") or "sqlite").lower()
    try:
        home = dagster_home or (Path(os.environ["DAGSTER_HOME"]) if os.environ.get("DAGSTER_HOME") else default_home(kind))
        path, written = init_instance(home, kind)
    except (InstanceConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{'wrote' if written else 'kept existing (never overwritten)'} {path} ({kind})")
    typer.echo(f"export DAGSTER_HOME={home}" + ("  # plus AGENTTUNE_PG_HOST/PORT/USER/PASSWORD/DB" if kind == "postgres" else ""))


@app.command()
def ui(port: int = typer.Option(3000, help="Port for the Dagster webserver.")) -> None:
    """Open the Dagster UI (``dagster dev -w workspace.yaml``) on the platform's instance."""
    home = _prepare_home()
    typer.echo(f"DAGSTER_HOME={home}")
    workspace = Path.cwd() / "workspace.yaml"
    args = [sys.executable, "-m", "dagster", "dev", "-p", str(port)]
    args += ["-w", str(workspace)] if workspace.exists() else ["-m", "agenttune_assets.definitions"]
    raise typer.Exit(subprocess.call(args))


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind; anything but loopback needs an API key."),
    port: int = typer.Option(8000, help="Port to listen on."),
    api_key: str = typer.Option(None, "--api-key", envvar="AGENTTUNE_API_KEY", help="Required bearer key (env AGENTTUNE_API_KEY)."),
    base_checkpoint: Path = typer.Option(None, help="Base checkpoint (default: the selected/packaged base model)."),
    deploy_root: Path = typer.Option(None, help="Where DEPLOYED.json lives (default: $AGENTTUNE_HOME/models/deployed)."),
    warehouse: str = typer.Option(None, help="Warehouse for served EventLogs (default: $AGENTTUNE_HOME/warehouse.duckdb)."),
    review_dir: Path = typer.Option(None, help="DECIDE review folder for the operator page (default: <artifacts>/decide/reviews)."),
    engine: str = typer.Option("transformers", help="transformers (CPU/GPU, batched) or vllm (needs vLLM and a CUDA GPU)."),
    max_batch: int = typer.Option(16, help="Concurrent requests batched into one forward pass."),
    threads: int = typer.Option(1, help="torch threads for generation (one is fastest for small models on a shared CPU; 0 = torch's default)."),
    max_completion_tokens: int = typer.Option(512, help="Largest max_tokens a request may ask for."),
    max_prompt_tokens: int = typer.Option(4096, help="Longest prompt accepted, in tokens."),
    max_body_bytes: int = typer.Option(1 << 20, help="Largest request body accepted."),
) -> None:
    """Serve the deployed agent over an OpenAI-compatible API (chat completions, tools, streaming) with an operator page.

    The model 'deployed' follows DEPLOYED.json on every request; every request is stored as a full-tier EventLog.
    """
    from agenttune_lib.config import PlatformPaths

    try:
        from agenttune_lib.service import ServiceConfig
        from agenttune_lib.service.server import serve as run_service
    except ModuleNotFoundError as exc:
        typer.echo(f"error: {exc.name} is missing; install the service extra: pip install -e '.[service]'", err=True)
        raise typer.Exit(2) from None
    paths = PlatformPaths.from_env().ensure()
    if base_checkpoint is None:
        from agenttune_lib.models.base import ensure_base_model

        base_checkpoint = ensure_base_model(paths.models).path
    try:
        config = ServiceConfig(
            base_path=Path(base_checkpoint), deploy_root=deploy_root or paths.models / "deployed",
            warehouse_path=warehouse or str(paths.warehouse), host=host, port=port, api_key=api_key, engine=engine,
            review_dir=review_dir or paths.artifacts / "decide" / "reviews", audit_path=paths.artifacts / "decide" / "audit.jsonl",
            max_batch=max_batch, max_completion_tokens=max_completion_tokens, max_prompt_tokens=max_prompt_tokens,
            max_body_bytes=max_body_bytes, default_max_tokens=min(128, max_completion_tokens), num_threads=threads or None,
        )
        run_service(config, echo=typer.echo)
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@instance_app.command("show")
def instance_show() -> None:
    """Print the DAGSTER_HOME the platform uses and its storage kind (export it for plain ``dagster`` commands)."""
    from agenttune_assets.instance import instance_kind_of

    home = _prepare_home()
    typer.echo(f"export DAGSTER_HOME={home}  # {instance_kind_of(home / 'dagster.yaml')}")


def _dagster_runs(run_ids: list[str]) -> list[dict]:
    """Per run id: job, status, trigger tags, the assets it materialized and each one's upstream assets."""
    import dagster as dg

    from agenttune_assets.definitions import defs
    from agenttune_assets.defs.assets.deploy import dagster_run_lineage
    _prepare_home()
    graph = defs.resolve_asset_graph()
    runs = dagster_run_lineage(run_ids)
    for run in runs:
        run["upstream"] = {
            asset: sorted(k.to_user_string() for k in graph.get(dg.AssetKey.from_user_string(asset)).parent_keys)
            for asset in run.get("materialized", [])
            if graph.has(dg.AssetKey.from_user_string(asset))
        }
    return runs


_lineage_cli.RUN_LOOKUP = _dagster_runs


def main() -> None:
    app()


if __name__ == "__main__":
    main()
