"""The ``agenttune`` console script: the library's CLI plus the commands that drive Dagster.

The library stays free of Dagster; this module adds ``materialize``, ``ui`` and ``instance``
on top of ``agenttune_lib.cli.app``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import typer

from agenttune_lib.cli import app
from agenttune_lib.cli import lineage as _lineage_cli

instance_app = typer.Typer(help="The Dagster instance the platform records runs in.", no_args_is_help=True)
app.add_typer(instance_app, name="instance")


def _materialize_main_job(selection: list[str] | None, tags: dict[str, str]) -> tuple[bool, str, list[dict]]:
    import dagster as dg

    from agenttune_assets.definitions import get_main_job
    from agenttune_assets.instance import prepare_dagster_home

    prepare_dagster_home()
    with dg.DagsterInstance.get() as instance:
        result = dg.execute_job(
            dg.reconstructable(get_main_job),
            instance=instance,
            asset_selection=[dg.AssetKey.from_user_string(s) for s in selection] if selection else None,
            tags=tags,
        )
        stats = instance.get_run_step_stats(result.run_id)
        steps = [
            {
                "step": s.step_key,
                "status": s.status.value if s.status else "?",
                "seconds": round((s.end_time or time.time()) - (s.start_time or time.time()), 2) if s.start_time else None,
            }
            for s in sorted(stats, key=lambda s: s.start_time or 0)
        ]
        return result.success, result.run_id, steps


def _materialize_partitions(asset: str, partitions: list[str]) -> list[tuple[str, bool, str]]:
    import dagster as dg

    from agenttune_assets.definitions import defs

    out = []
    assets_def = defs.resolve_assets_def(asset)  # resources already bound by the Definitions
    with dg.DagsterInstance.get() as instance:
        for key in partitions:
            result = dg.materialize(
                [assets_def], instance=instance, partition_key=key, raise_on_error=False,
                tags={"agenttune/entry": "cli"},
            )
            out.append((key, result.success, result.run_id))
    return out


@app.command()
def materialize(
    select: list[str] = typer.Option(None, "--select", "-s", help="Asset keys to materialize (default: the whole graph)."),
    json_out: Path = typer.Option(None, "--json", help="Write per-step timings to this JSON file."),
) -> None:
    """Materialize the whole asset graph (the main job) on the configured instance."""
    from agenttune_assets.definitions import PARTITIONED_DEFAULTS, defs
    from agenttune_assets.instance import prepare_dagster_home

    known = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    unknown = [s for s in select or [] if s not in known]
    if unknown:
        typer.echo(f"error: unknown asset key(s) {unknown}; known: {sorted(known)}", err=True)
        raise typer.Exit(2)
    t0 = time.monotonic()
    prepare_dagster_home()
    partition_runs = []
    if not select:
        # Partitioned assets first: downstream assets of the main job (failure_buffer) read what they wrote.
        for asset, keys in PARTITIONED_DEFAULTS.items():
            for key, pok, prun in _materialize_partitions(asset, keys):
                partition_runs.append({"asset": asset, "partition": key, "success": pok, "run_id": prun})
    ok, run_id, steps = _materialize_main_job(select, {"agenttune/entry": "cli"})
    ok = ok and all(p["success"] for p in partition_runs)
    total = time.monotonic() - t0
    typer.echo(f"\nrun {run_id}: {'SUCCESS' if ok else 'FAILURE'} in {total:.1f}s (DAGSTER_HOME={os.environ.get('DAGSTER_HOME')})")
    for s in steps:
        typer.echo(f"  {s['step']:<32} {s['status']:<10} {s['seconds']}s")
    for p in partition_runs:
        typer.echo(f"  {p['asset']}[{p['partition']}]  {'SUCCESS' if p['success'] else 'FAILURE'}  run {p['run_id']}")
    if json_out:
        json_out.write_text(json.dumps({"run_id": run_id, "success": ok, "seconds": total, "steps": steps, "partitions": partition_runs}, indent=2))
    raise typer.Exit(0 if ok else 1)


@app.command()
def ui(port: int = typer.Option(3000, help="Port for the Dagster webserver.")) -> None:
    """Open the Dagster UI (``dagster dev -w workspace.yaml``) on the platform's instance."""
    from agenttune_assets.instance import prepare_dagster_home

    home = prepare_dagster_home()
    typer.echo(f"DAGSTER_HOME={home}")
    workspace = Path.cwd() / "workspace.yaml"
    args = [sys.executable, "-m", "dagster", "dev", "-p", str(port)]
    args += ["-w", str(workspace)] if workspace.exists() else ["-m", "agenttune_assets.definitions"]
    raise typer.Exit(subprocess.call(args))


@instance_app.command("show")
def instance_show() -> None:
    """Print the DAGSTER_HOME the platform uses and its storage kind (export it for plain ``dagster`` commands)."""
    from agenttune_assets.instance import prepare_dagster_home

    home = prepare_dagster_home()
    kind = os.environ.get("AGENTTUNE_INSTANCE", "sqlite")
    typer.echo(f"export DAGSTER_HOME={home}  # {kind}")


def _dagster_runs(run_ids: list[str]) -> list[dict]:
    """Per run id: job, status, trigger tags, the assets it materialized and each one's upstream assets."""
    import dagster as dg

    from agenttune_assets.definitions import defs
    from agenttune_assets.defs.assets.deploy import dagster_run_lineage
    from agenttune_assets.instance import prepare_dagster_home

    prepare_dagster_home()
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
