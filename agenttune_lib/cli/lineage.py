"""``agenttune lineage ADAPTER``: the chain from a deployed adapter back to its documents, row by row, with run ids."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import typer

#: Joins run ids to the Dagster instance; installed by the Dagster layer (``agenttune_assets.cli``),
#: so this library never imports Dagster. ``(run_ids) -> [{"run_id", "found", "job", "status", ...}]``.
RUN_LOOKUP: Callable[[list[str]], list[dict]] | None = None

app = typer.Typer(help="Audit an adapter's lineage: gate decision, training rows, trajectories, QA items, chunks, documents.")


def _render(chain: dict, dagster_runs: list | None) -> None:
    from rich.console import Console
    from rich.tree import Tree

    a = chain["adapter"]
    root = Tree(f"[bold]adapter {a['adapter_id']}[/] ({a.get('algorithm')}, base {a.get('base_model')}, run {a.get('run_id')})")
    if a.get("parent_adapter_id"):
        root.add(f"warm-started from adapter {a['parent_adapter_id']} (what served when it was retrained)")
    dep = chain.get("deployment")
    root.add(f"deployment: {dep.get('action', 'deploy')} replacing {dep.get('previous') or dep.get('previous_adapter_id') or '-'} "
             f"by decision {dep.get('decision_id')}" if dep else "deployment: [yellow]not deployed[/]")
    g = chain.get("gate_decision")
    if g:
        node = root.add(f"gate decision {g['decision_id']}: {'approved' if g.get('approved') else 'refused'} "
                        f"(accuracy {g.get('accuracy_old')} -> {g.get('accuracy_new')} on {g.get('n_cases')} held-out cases, run {g.get('run_id')})")
        for reason in g.get("reasons") or []:
            node.add(f"[red]{reason}[/]")
    if chain.get("retrain_batch"):
        b = chain["retrain_batch"]
        root.add(f"retrain batch {b['batch_id']}: trigger {b.get('trigger')}, {b.get('n_accepted')} accepted of {b.get('n_examples')}, causes {b.get('causes')}")
    ex = root.add(f"corrected examples: {len(chain.get('corrected_examples') or [])}")
    for e in (chain.get("corrected_examples") or [])[:20]:
        ex.add(f"{e['trajectory_id']} {e.get('root_cause')} at {e.get('stage')}: {str(e.get('chosen'))[:60]} "
               f"({e.get('origin')}; {'accepted' if e.get('accepted') else 'rejected'}; source {e.get('source')}, trusted {e.get('trusted')})")
    al = root.add(f"failing audit lines: {len(chain.get('failing_audit_lines') or [])}")
    for line in (chain.get("failing_audit_lines") or [])[:30]:
        al.add(f"{line['file']}#{line.get('seq')} {line.get('record_type')} {line.get('run_id')} {line.get('stage_id') or line.get('label') or ''} "
               f"{line.get('status')}" + (f" served by {line['served_adapter_id']}" if line.get("served_adapter_id") else ""))
    snap = chain.get("as_of_snapshot")
    tr = root.add(f"training rows: {len(chain['training_rows'])}" + (f" (as read at warehouse snapshot {snap})" if snap is not None else ""))
    for t in chain["trajectories"][:20]:
        tr.add(f"trajectory {t['id']} ({t.get('source')}, {t.get('asset_key')} run {t.get('run_id')}, qa {len(t.get('qa_item_ids') or [])}, chunks {len(t.get('chunk_ids') or [])})")
    if len(chain["trajectories"]) > 20:
        tr.add(f"... {len(chain['trajectories']) - 20} more")
    qa = root.add(f"QA items: {len(chain['qa_items'])}")
    for q in chain["qa_items"][:10]:
        qa.add(f"{q['qa_id']} [{q.get('split')}] {str(q.get('question'))[:80]}")
    ch = root.add(f"chunks: {len(chain['chunks'])}")
    for c in chain["chunks"][:10]:
        ch.add(f"{c['chunk_id']} of {c.get('doc_id')}")
    docs = root.add(f"documents: {len(chain['documents'])}")
    for d in chain["documents"][:20]:
        docs.add(f"{d['doc_id']} {d.get('title') or ''} ({d.get('path')})")
    runs = root.add("asset lineage (Dagster runs)")
    by_id = {r["run_id"]: r for r in dagster_runs or []}
    for r in chain["runs"]:
        extra = by_id.get(r["run_id"])
        detail = f" job {extra['job']} {extra['status']} materialized {extra['materialized']}" if extra and extra.get("found") else ""
        runs.add(f"{r['asset']} <- run {r['run_id']} ({r['rows']} rows){detail}")
    for gap in chain.get("gaps", []):
        root.add(f"[yellow]gap: {gap}[/]")
    Console().print(root)


def lineage(
    adapter: str = typer.Argument(..., help="The adapter id (as in the warehouse's adapters table)."),
    as_json: bool = typer.Option(False, "--json", help="Print the chain as JSON for machines."),
    warehouse: str = typer.Option(None, help="The warehouse: a DuckDB file (default: $AGENTTUNE_HOME/warehouse.duckdb) or a ducklake: URL."),
    deploy_root: Path = typer.Option(None, help="The deployment root (default: $AGENTTUNE_HOME/models/deployed)."),
    dagster: bool = typer.Option(True, help="Join each run id to the platform's Dagster instance (asset lineage per run)."),
    audit: list[Path] = typer.Option(None, help="DECIDE audit logs to read the failing runs' lines from (default: every audit.jsonl under $AGENTTUNE_HOME)."),
) -> None:
    """Walk ADAPTER back through its gate decision, training rows, trajectories, QA items, chunks and documents."""
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.lineage import LineageError, adapter_lineage
    from agenttune_lib.warehouse import Warehouse

    from agenttune_lib.warehouse.lake import is_lake

    paths = PlatformPaths.from_env()
    wh_path = str(warehouse) if warehouse else str(paths.warehouse)
    if not is_lake(wh_path) and not Path(wh_path).exists():
        typer.echo(f"error: warehouse {wh_path} does not exist", err=True)
        raise typer.Exit(2)
    try:
        audits = list(audit) if audit else sorted(paths.home.rglob("audit.jsonl"))
        chain = adapter_lineage(Warehouse(wh_path), adapter, deploy_root or paths.models / "deployed", audit_files=audits)
    except LineageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    dagster_runs = None
    if dagster and RUN_LOOKUP is not None:
        dagster_runs = RUN_LOOKUP([r["run_id"] for r in chain["runs"]])
        chain["dagster_runs"] = dagster_runs
    if as_json:
        typer.echo(json.dumps(chain, indent=2, sort_keys=True, default=str))
    else:
        _render(chain, dagster_runs)


app.command()(lineage)
