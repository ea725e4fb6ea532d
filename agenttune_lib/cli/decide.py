"""``agenttune decide``: list, validate and run DECIDE templates; verify an audit log; extract training data."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(name="decide", help="DECIDE decision workflows: templates, runs and the audit trail.", no_args_is_help=True)


def _registry(templates_dir: Optional[Path]):
    from agenttune_lib.decide import TemplateRegistry

    return TemplateRegistry(templates_dir)


def _served_or_checkpoint(checkpoint: Optional[Path], deploy_root: Optional[Path], max_new_tokens: Optional[int] = None):
    """(model, served adapter id): the checkpoint as given, else the deployed model (base + the adapter DEPLOYED.json names)."""
    from agenttune_lib.decide import build_model
    from agenttune_lib.models.serving import base_adapter_id, resolve_deployed_model

    if checkpoint is not None:
        return build_model("transformers", checkpoint=checkpoint, max_new_tokens=max_new_tokens), base_adapter_id(checkpoint)
    try:
        served = resolve_deployed_model(deploy_root)
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"served by: {served.served_adapter_id} (base {served.base_path})", err=True)
    return served.decide_model(max_new_tokens), served.served_adapter_id


_DEPLOY_ROOT_HELP = "Deployment root holding DEPLOYED.json (default: $AGENTTUNE_HOME/models/deployed); ignored with --checkpoint."


@app.command("list")
def list_templates(templates_dir: Optional[Path] = typer.Option(None, help="Templates directory (default: the bundled ones).")) -> None:
    """List every template with its domain, stage count and description."""
    from rich.console import Console
    from rich.table import Table

    from agenttune_lib.decide import DecideError

    reg = _registry(templates_dir)
    table = Table(title=f"DECIDE templates ({reg.templates_dir})")
    for col in ("id", "domain", "stages", "description"):
        table.add_column(col)
    for ident in reg.ids():
        try:
            cfg = reg.get(ident)
            table.add_row(ident, cfg.domain, str(len(cfg.stages)), cfg.description)
        except DecideError as exc:
            table.add_row(ident, "?", "?", f"[red]invalid: {exc}[/red]")
    Console(width=200).print(table)


@app.command()
def validate(
    template_id: str = typer.Argument(..., help="Template id (bfsi/kyc_triage) or a unique name (kyc_triage)."),
    templates_dir: Optional[Path] = typer.Option(None, help="Templates directory (default: the bundled ones)."),
) -> None:
    """Load, merge and check a template: YAML, stage types, routes, rules grammar, tools, graph shape, and that every
    {stage.output…} reference is defined on every path that reaches it."""
    from agenttune_lib.decide import DecideError
    from agenttune_lib.decide.domain_tools import default_tools

    try:
        cfg = _registry(templates_dir).get(template_id)
    except DecideError as exc:
        typer.echo(f"invalid: {exc}", err=True)
        raise typer.Exit(1) from None
    from agenttune_lib.decide import GraphRunner

    nodes = len(GraphRunner(cfg).compile().get_graph().nodes) - 2  # less LangGraph's __start__ and __end__
    tools = default_tools()
    missing = [
        (s["id"], s["tool"])
        for stage in cfg.stages
        for s in [stage, *stage.get("branches", [])]
        if s.get("type") == "tool_call" and s["tool"] not in tools
    ]
    for sid, tool in missing:
        typer.echo(f"note: stage {sid!r} calls tool {tool!r}, which is not bundled; pass it to GraphRunner(tools=...)")
    from agenttune_lib.decide.static import undefined_references

    problems = undefined_references(cfg)
    if problems:
        for problem in problems:
            typer.echo(f"invalid: {cfg.id}: {problem}", err=True)
        raise typer.Exit(1)
    typer.echo(
        f"ok: {cfg.id} ({len(cfg.stages)} stages compiled to {nodes} LangGraph nodes, {len(cfg.edges)} edges, entry {cfg.entry!r}, max_steps {cfg.max_steps}; "
        f"extends {' -> '.join(cfg.chain)})"
    )


@app.command()
def run(
    template_id: str = typer.Argument(..., help="Template id or unique name."),
    input: Path = typer.Option(..., "--input", "-i", help="Input rows: .jsonl, .json, .csv, .parquet, or a text file (one run)."),
    checkpoint: Optional[Path] = typer.Option(None, help="Local transformers checkpoint (default: the deployed model: base + deployed adapter)."),
    deploy_root: Optional[Path] = typer.Option(None, help=_DEPLOY_ROOT_HELP),
    endpoint: Optional[str] = typer.Option(None, help="OpenAI-compatible base URL (uses /v1/chat/completions)."),
    model_name: Optional[str] = typer.Option(None, help="Model name for --endpoint."),
    api_key_env: Optional[str] = typer.Option(None, help="Environment variable holding the endpoint's API key."),
    replies: Optional[Path] = typer.Option(None, help="JSON file mapping stage id to a reply or a list of replies (a scripted model)."),
    audit: Optional[Path] = typer.Option(None, help="Audit log (default: <artifacts>/decide/audit.jsonl)."),
    limit: Optional[int] = typer.Option(None, help="Run at most this many rows."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Cap on generated tokens per model call."),
    review_timeout: Optional[float] = typer.Option(None, help="Seconds to wait for human review decisions (fails closed)."),
    review_dir: Optional[Path] = typer.Option(None, help="Folder holding pending_reviews/ and decisions/."),
    warehouse: Optional[Path] = typer.Option(None, help="Also store each run as an EventLog in this DuckDB warehouse."),
    templates_dir: Optional[Path] = typer.Option(None, help="Templates directory (default: the bundled ones)."),
    checkpointer: Optional[str] = typer.Option(None, help="Where runs waiting for review are parked: a SQLite file or a postgresql:// URL (default: <review-dir>/checkpoints.sqlite)."),
) -> None:
    """Run a template over the input rows; print one JSON verdict per run (a run waiting for review is "suspended";
    continue it with ``agenttune decide resume``)."""
    import os

    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.decide import CollectRunner, DecideError, GraphRunner, ScriptedModel, build_model, read_labelled_inputs

    try:
        cfg = _registry(templates_dir).get(template_id)
        labelled = read_labelled_inputs(input, limit=limit)  # expected_label: the audit line only
    except DecideError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    paths = PlatformPaths.from_env()
    if replies is not None:
        try:
            script = json.loads(replies.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            typer.echo(f"error: --replies {replies}: {exc}", err=True)
            raise typer.Exit(1) from None
        if not isinstance(script, dict):
            typer.echo(f"error: --replies {replies} must hold a JSON object of stage id -> reply", err=True)
            raise typer.Exit(1) from None
        model = ScriptedModel(script)
        served_id = None
    elif endpoint:
        model = build_model("openai", endpoint=endpoint, model_name=model_name, api_key=os.environ.get(api_key_env) if api_key_env else None, max_new_tokens=max_new_tokens)
        served_id = f"endpoint:{model_name or endpoint}"
    else:
        paths.ensure()
        model, served_id = _served_or_checkpoint(checkpoint, deploy_root, max_new_tokens)
    from agenttune_lib.decide import default_audit_path

    audit_path = audit or default_audit_path(paths.artifacts)
    runner = GraphRunner(
        cfg, model=model, audit=audit_path, review_dir=review_dir or paths.artifacts / "decide" / "reviews",
        human_review_timeout=review_timeout, max_new_tokens=max_new_tokens, destination_base=paths.artifacts / "decide",
        checkpointer=checkpointer or "default", served_adapter_id=served_id,
    )
    wh = None
    if warehouse is not None:
        from agenttune_lib.warehouse import Warehouse

        wh = Warehouse(warehouse)
    delivered, pending = runner.retry_outbox()  # earlier failed destination writes first
    if delivered or pending:
        typer.echo(f"outbox: {delivered} earlier decision(s) delivered, {pending} still failing ({runner.outbox.path})", err=True)
    result = CollectRunner(runner, warehouse=wh).collect([r for r, _ in labelled], [e for _, e in labelled])
    for summary in result.summaries:  # redacted: terminal output leaves the run too
        typer.echo(json.dumps(summary, sort_keys=True, default=str))
    typer.echo(f"audit: {audit_path}; verdicts: {json.dumps(result.verdict_counts, sort_keys=True)}", err=True)
    failed_runs = [s.run_id for s in result.states if s.status in ("error", "step_limit")]
    failed_writes = [(s.run_id, d) for s in result.states for d in s.destinations if not d.get("ok")]
    for run_id, dest in failed_writes:
        typer.echo(f"error: run {run_id}: destination {dest.get('type')} failed ({dest.get('error')}); kept in {dest.get('outbox', 'no outbox')} for retry", err=True)
    if failed_runs:
        typer.echo(f"error: {len(failed_runs)} run(s) ended in error or at the step limit: {', '.join(failed_runs)}", err=True)
    if failed_runs or failed_writes:
        raise typer.Exit(1)


@app.command()
def resume(
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Resume only this parked run (default: every run whose decision arrived or whose deadline passed)."),
    review_dir: Optional[Path] = typer.Option(None, help="Folder holding pending_reviews/ and decisions/ (default: <artifacts>/decide/reviews)."),
    checkpointer: Optional[str] = typer.Option(None, help="Where parked runs live: a SQLite file or a postgresql:// URL (default: <review-dir>/checkpoints.sqlite)."),
    checkpoint: Optional[Path] = typer.Option(None, help="Local transformers checkpoint for the remaining stages (default: the deployed model)."),
    deploy_root: Optional[Path] = typer.Option(None, help=_DEPLOY_ROOT_HELP),
    replies: Optional[Path] = typer.Option(None, help="JSON file mapping stage id to a reply (a scripted model)."),
    audit: Optional[Path] = typer.Option(None, help="Audit log (default: <artifacts>/decide/audit.jsonl)."),
    warehouse: Optional[Path] = typer.Option(None, help="Warehouse holding the audit head checkpoint, when the runs used one."),
    templates_dir: Optional[Path] = typer.Option(None, help="Templates directory (default: the bundled ones)."),
) -> None:
    """Continue parked runs from their checkpoint: a reviewer's decisions/<review_id>.json (with "decision" and
    "reviewer") is consumed once; a review past its deadline fails closed. Prints one redacted summary per run."""
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.decide import DecideError, GraphRunner, ScriptedModel, default_audit_path
    from agenttune_lib.decide.review import resume_decided

    paths = PlatformPaths.from_env()
    reviews = review_dir or paths.artifacts / "decide" / "reviews"
    model: object | None = None

    def get_model() -> object:
        nonlocal model
        if model is None:
            if replies is not None:
                model = ScriptedModel(json.loads(replies.read_text(encoding="utf-8")))
            else:
                paths.ensure()
                model = _served_or_checkpoint(checkpoint, deploy_root)[0]
        return model

    runners: dict[str, GraphRunner] = {}

    def runner_for(template_id: str) -> GraphRunner:
        if template_id not in runners:
            runners[template_id] = GraphRunner(
                _registry(templates_dir).get(template_id), model=get_model(), review_dir=reviews,
                audit=audit or default_audit_path(paths.artifacts), warehouse_path=warehouse,
                checkpointer=checkpointer or "default", destination_base=paths.artifacts / "decide",
            )
        return runners[template_id]

    try:
        outcomes = resume_decided(reviews, runner_for, run_id=run_id)
    except DecideError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    failed = 0
    for out in outcomes:
        if out.action == "error":
            failed += 1
            typer.echo(f"error: review {out.review_id}: {out.error}", err=True)
        elif out.state is not None:
            summary = runners[out.template_id].redactor_for(out.state)(out.state.summary())
            typer.echo(json.dumps({"action": out.action, "review_id": out.review_id, **summary}, sort_keys=True, default=str))
    waiting = sum(o.action == "waiting" for o in outcomes)
    typer.echo(f"resumed {sum(o.action == 'resumed' for o in outcomes)}, timed out {sum(o.action == 'timed_out' for o in outcomes)}, "
               f"still waiting {waiting}, errors {failed}", err=True)
    if run_id is not None and not outcomes:
        typer.echo(f"error: no pending review for run {run_id!r}", err=True)
        raise typer.Exit(1)
    if failed:
        raise typer.Exit(1)


@app.command()
def evaluate(
    template_id: str = typer.Argument(..., help="Template id or unique name."),
    input: Path = typer.Option(..., "--input", "-i", help="Labelled rows (.jsonl/.json/.csv/.parquet), each with the expected verdict label."),
    label_key: str = typer.Option("expected_label", help="The column holding the expected verdict label."),
    min_accuracy: Optional[float] = typer.Option(None, help="Block below this accuracy (default: the template's settings.evaluation, else 0.8)."),
    max_error_rate: Optional[float] = typer.Option(None, help="Block above this share of errored runs (default: template, else 0.1)."),
    checkpoint: Optional[Path] = typer.Option(None, help="Local transformers checkpoint (default: the deployed model)."),
    deploy_root: Optional[Path] = typer.Option(None, help=_DEPLOY_ROOT_HELP),
    replies: Optional[Path] = typer.Option(None, help="JSON file mapping stage id to a reply (a scripted model)."),
    templates_dir: Optional[Path] = typer.Option(None, help="Templates directory (default: the bundled ones)."),
) -> None:
    """Evaluation mode: run the template over labelled rows and exit 1 when a threshold fails, so the training or
    deployment step after it does not run. Reviews fail closed at once; nothing is audited or dispatched."""
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.decide import DecideError, GraphRunner, ScriptedModel, read_inputs
    from agenttune_lib.decide.evaluate import evaluate_template

    paths = PlatformPaths.from_env()
    try:
        cfg = _registry(templates_dir).get(template_id)
        rows = read_inputs(input)
        if replies is not None:
            model = ScriptedModel(json.loads(replies.read_text(encoding="utf-8")))
        else:
            paths.ensure()
            model = _served_or_checkpoint(checkpoint, deploy_root)[0]
        runner = GraphRunner(cfg, model=model, audit=None, destinations=[], human_review_timeout=0.0, checkpointer=None,
                             review_dir=paths.artifacts / "decide" / "evaluation_reviews")
        limits = {k: v for k, v in (("min_accuracy", min_accuracy), ("max_error_rate", max_error_rate)) if v is not None}
        result = evaluate_template(runner, rows, label_key=label_key, thresholds=limits)
    except DecideError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(result.to_dict(), sort_keys=True))
    if not result.passed:
        typer.echo(f"BLOCKED: {'; '.join(result.failures)}", err=True)
        raise typer.Exit(1)


@app.command("verify-audit")
def verify_audit_cmd(
    path: Path = typer.Argument(..., help="The audit.jsonl to check."),
    warehouse: Optional[Path] = typer.Option(None, help="Warehouse holding the log's head checkpoint (runs that wrote with --warehouse / Dagster)."),
    heads_dir: Optional[Path] = typer.Option(None, help="Folder of head checkpoint files (default: $AGENTTUNE_HOME/audit_heads)."),
) -> None:
    """Recompute the keyed (HMAC) chain and compare its end with the head checkpoint; exit 1 naming each problem.

    The key comes from $AGENTTUNE_AUDIT_KEY, $AGENTTUNE_AUDIT_KEY_FILE or $AGENTTUNE_HOME/secrets/audit.key."""
    from agenttune_lib.decide import AuditError, verify_audit
    from agenttune_lib.decide.audit import FileHeadStore

    try:
        result = verify_audit(path, warehouse=warehouse, heads=FileHeadStore(heads_dir) if heads_dir else None)
    except AuditError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if not result.ok:
        for problem in result.problems:
            typer.echo(f"TAMPERED {path}: {problem}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"ok: {result.count} records, keyed hash chain intact and matching its head checkpoint ({path})")


@app.command()
def extract(
    path: Path = typer.Argument(..., help="The audit.jsonl to read."),
    kind: str = typer.Option("dpo", "--format", help="dpo (chosen/rejected pairs) or bco (binary labels)."),
    out: Optional[Path] = typer.Option(None, help="Write JSON lines here instead of standard output."),
) -> None:
    """Extract DPO preference pairs or BCO labels from an audit log."""
    from agenttune_lib.decide import AuditError, AuditReader

    reader = AuditReader(path)
    try:
        rows = reader.extract_dpo_pairs() if kind == "dpo" else reader.extract_bco_labels() if kind == "bco" else None
    except AuditError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if rows is None:
        typer.echo(f"error: --format must be dpo or bco, got {kind!r}", err=True)
        raise typer.Exit(2)
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    if out is not None:
        out.write_text(text, encoding="utf-8")
        typer.echo(f"{len(rows)} {kind} rows -> {out}", err=True)
    else:
        typer.echo(text, nl=False)
