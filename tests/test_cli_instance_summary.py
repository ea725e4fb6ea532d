"""The instance a user owns (init once, never overwritten, kind conflicts are errors) and the run summary."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agenttune_assets.instance import InstanceConfigError, init_instance, instance_kind_of, prepare_dagster_home, template_path

REPO = Path(__file__).resolve().parents[1]


def _cli(args, env_extra, tmp_path, timeout=300):
    env = {**os.environ, "AGENTTUNE_HOME": str(tmp_path / "home"), **env_extra}
    for key in [k for k, v in env_extra.items() if v is None]:
        env.pop(key, None)
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "agenttune_assets.cli", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def test_templates_are_packaged_and_init_never_overwrites(tmp_path):
    assert instance_kind_of(template_path("sqlite")) == "sqlite" and instance_kind_of(template_path("postgres")) == "postgres"
    path, written = init_instance(tmp_path / "inst", "sqlite")
    assert written and path.read_text() == template_path("sqlite").read_text()
    path.write_text(path.read_text() + "\n# my edit\n")
    again, written = init_instance(tmp_path / "inst", "sqlite")
    assert again == path and not written and path.read_text().endswith("# my edit\n")
    with pytest.raises(InstanceConfigError, match="configures a sqlite instance but postgres was requested"):
        init_instance(tmp_path / "inst", "postgres")
    assert path.read_text().endswith("# my edit\n")


def test_postgres_instance_with_and_without_dagster_home(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AGENTTUNE_INSTANCE", "postgres")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    home = prepare_dagster_home()
    assert home == tmp_path / "home" / "dagster-postgres" and instance_kind_of(home / "dagster.yaml") == "postgres"
    # With DAGSTER_HOME set (and empty), the postgres template lands there: the variable is no longer ignored.
    own = tmp_path / "own"
    monkeypatch.setenv("DAGSTER_HOME", str(own))
    assert prepare_dagster_home() == own and instance_kind_of(own / "dagster.yaml") == "postgres"
    # A DAGSTER_HOME holding a SQLite dagster.yaml conflicts with AGENTTUNE_INSTANCE=postgres: a clear error.
    sqlite_home = tmp_path / "sqlite_home"
    init_instance(sqlite_home, "sqlite")
    monkeypatch.setenv("DAGSTER_HOME", str(sqlite_home))
    with pytest.raises(InstanceConfigError, match=str(sqlite_home / "dagster.yaml")):
        prepare_dagster_home()
    assert instance_kind_of(sqlite_home / "dagster.yaml") == "sqlite"
    # Without AGENTTUNE_INSTANCE the existing file decides.
    monkeypatch.delenv("AGENTTUNE_INSTANCE")
    assert prepare_dagster_home() == sqlite_home


def test_cli_init_and_instance_show_keep_the_users_file(tmp_path):
    out = _cli(["init"], {"DAGSTER_HOME": None, "AGENTTUNE_INSTANCE": None}, tmp_path)
    assert out.returncode == 0, out.stderr
    target = tmp_path / "home" / "dagster" / "dagster.yaml"
    assert f"wrote {target} (sqlite)" in out.stdout
    target.write_text(target.read_text() + "# user tuned this\n")
    again = _cli(["init"], {"DAGSTER_HOME": None, "AGENTTUNE_INSTANCE": None}, tmp_path)
    assert again.returncode == 0 and "kept existing (never overwritten)" in again.stdout
    show = _cli(["instance", "show"], {"DAGSTER_HOME": None, "AGENTTUNE_INSTANCE": None}, tmp_path)
    assert show.returncode == 0 and f"export DAGSTER_HOME={target.parent}  # sqlite" in show.stdout
    assert target.read_text().endswith("# user tuned this\n")
    conflict = _cli(["instance", "show"], {"DAGSTER_HOME": str(target.parent), "AGENTTUNE_INSTANCE": "postgres"}, tmp_path)
    assert conflict.returncode == 2 and "configures a sqlite instance but postgres was requested" in conflict.stderr
    pg = _cli(["init", "--kind", "postgres"], {"DAGSTER_HOME": None, "AGENTTUNE_INSTANCE": None}, tmp_path)
    assert pg.returncode == 0 and "dagster-postgres" in pg.stdout
    assert instance_kind_of(tmp_path / "home" / "dagster-postgres" / "dagster.yaml") == "postgres"


def _outcome_fixture(tmp_path: Path, approved: bool):
    """A warehouse holding real evaluation_comparisons and gate_decisions rows (written by their owners' code)."""
    from agenttune_lib.closed_loop.gate import GateDecision, record_gate_decision
    from agenttune_lib.evaluation.paired import paired_comparison
    from agenttune_lib.evaluation.store import write_comparisons
    from agenttune_lib.warehouse import Warehouse

    wh = Warehouse(tmp_path / "warehouse.duckdb")
    comp = paired_comparison([0.0, 1.0, 0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0, 1.0, 0.0], metric="success", n_resamples=200)
    write_comparisons(wh, "rep1", "qa_validation", [comp], config_hash="h1", adapter_id="adapter-7", base_id="base")
    decision = GateDecision(
        decision_id="gate-1", approved=approved, candidate="adapter-7", baseline=None, batch_id=None,
        arms={"accuracy": {"passed": approved, "accuracy_old": 0.25, "accuracy_new": 0.5, "n_cases": 12}},
        reasons=[] if approved else ["accuracy: only 12 held-out cases from successful runs (need 30)"],
        created_at="2026-11-30T18:00:00+00:00",
    )
    record_gate_decision(wh, decision, run_id="run-abc")
    return wh


def _render(summary) -> str:
    from rich.console import Console

    from agenttune_assets.run_view import render_summary

    buf = io.StringIO()
    render_summary(Console(file=buf, width=200, highlight=False, soft_wrap=True, color_system=None), summary)
    return buf.getvalue()


def test_summary_names_scores_gate_refusal_and_what_serves(tmp_path):
    from agenttune_assets.run_view import RunSummary
    from agenttune_lib.warehouse.outcome import run_outcome

    wh = _outcome_fixture(tmp_path, approved=False)
    deploy = tmp_path / "models" / "deployed"
    outcome = run_outcome(wh, deploy, run_id="run-abc")
    assert outcome.gate is not None and outcome.gate.from_this_run and not outcome.gate.approved
    assert [c["metric"] for c in outcome.comparisons] == ["success"]
    steps = [{"step": f"asset_{i}", "status": "SUCCESS", "seconds": float(i)} for i in range(20)]
    text = _render(RunSummary("run-abc", True, "SUCCESS", 412.0, "/x/run.log", steps, [], outcome))
    lines = text.splitlines()
    assert lines[0] == "run run-abc SUCCEEDED in 412s - gate REFUSED the adapter, nothing new deployed"
    assert "qa_validation/success: 0.333 -> 0.667" in text and "n=6" in text
    assert "gate (this run): REFUSED candidate adapter-7" in text and "only 12 held-out cases" in text
    assert "serving now: base model (no adapter deployed)" in text
    assert "asset_19 19s" in text and len(lines) < 30
    # An earlier run's decision is labelled as such; a deployment pointer is what serves.
    deploy.mkdir(parents=True)
    (deploy / "DEPLOYED.json").write_text('{"adapter_id": "adapter-6", "decision_id": "gate-0", "path": "/r/6"}')
    text = _render(RunSummary("run-new", False, "FAILURE", 3.0, None, [{"step": "trained_adapter", "status": "FAILURE", "seconds": 3.0}], [],
                              run_outcome(wh, deploy, run_id="run-new")))
    assert text.startswith("run run-new FAILED (FAILURE) in 3s\n") and "trained_adapter: FAILURE" in text
    assert "gate (an earlier run run-abc (this run recorded none)): REFUSED" in text
    assert "serving now: adapter-6 (decision gate-0)" in text
    # A run still going is in progress, not failed.
    text = _render(RunSummary("run-now", False, "STARTED", 30.0, None, [{"step": "trained_adapter", "status": "IN_PROGRESS", "seconds": 30.0}], [],
                              run_outcome(wh, deploy, run_id="run-now")))
    assert text.startswith("run run-now IN PROGRESS (STARTED) in 30s\n") and "FAILED" not in text.splitlines()[0]


def test_summary_without_evaluation_or_gate_tables(tmp_path):
    from agenttune_assets.run_view import RunSummary
    from agenttune_lib.warehouse import Warehouse
    from agenttune_lib.warehouse.outcome import run_outcome

    wh = Warehouse(tmp_path / "warehouse.duckdb")
    wh.tables()
    text = _render(RunSummary("r", True, "SUCCESS", 1.0, None, [], [], run_outcome(wh, tmp_path / "deployed", run_id="r")))
    assert "none recorded (no evaluation_comparisons rows" in text and "gate: no decision recorded" in text
    missing = run_outcome(Warehouse(tmp_path / "absent.duckdb"), tmp_path / "deployed")
    assert missing.notes == [f"no warehouse at {tmp_path / 'absent.duckdb'} yet"]


def _polling_tail(tmp_path) -> str:
    """A PATH whose ``tail`` polls once a second, as GNU tail does when inotify watches run out (a busy CI machine)."""
    real = shutil.which("tail")
    shim = tmp_path / "bin" / "tail"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {real} ---disable-inotify "$@"\n')
    shim.chmod(0o755)
    return f"{shim.parent}{os.pathsep}{os.environ['PATH']}"


def test_materialize_prints_a_short_run_with_a_log_file_and_status_repeats_it(tmp_path):
    # The step's lines reach the log file through Dagster's tail mirror; with a polling tail they are lost unless
    # the CLI lets each step wait for the mirror (DAGSTER_COMPUTE_LOG_TAIL_WAIT_AFTER_FINISH).
    env = {"DAGSTER_HOME": None, "AGENTTUNE_INSTANCE": None, "DAGSTER_COMPUTE_LOG_TAIL_WAIT_AFTER_FINISH": None,
           "PATH": _polling_tail(tmp_path)}
    proc = _cli(["materialize", "-s", "corpus_documents"], env, tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) < 60 and proc.stderr.strip() == "", proc.stdout + proc.stderr
    log_line = next(line for line in lines if line.startswith("log (Dagster event log, warnings): "))
    log_path = Path(log_line.split(": ", 1)[1])
    assert "STEP_SUCCESS" in log_path.read_text() and "STEP_SUCCESS" not in proc.stdout
    head = next(line for line in lines if line.startswith("run "))
    assert " SUCCEEDED in " in head
    assert any("corpus_documents" in line and line.strip().endswith("s") for line in lines)
    assert "gate: no decision recorded" in proc.stdout and "serving now: base model" in proc.stdout
    status = _cli(["status"], env, tmp_path)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0].startswith(head.split(" in ")[0] + " in ")  # same run id, SUCCEEDED
    assert f"log: {log_path}" in status.stdout and "corpus_documents" in status.stdout


def test_materialize_exit_status_reports_a_failed_run(tmp_path):
    # corpus_chunks needs its upstream assets materialized first: alone, its step fails; the exit status must say so.
    proc = _cli(["materialize", "-s", "corpus_chunks"], {"DAGSTER_HOME": None, "AGENTTUNE_INSTANCE": None}, tmp_path, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " FAILED (FAILURE)" in proc.stdout and "corpus_chunks: FAILURE" in proc.stdout


@pytest.mark.slow
def test_non_editable_install_finds_its_instance_templates(tmp_path):
    """``pip install .`` (a wheel, not the source tree): the templates ship in the package and ``agenttune init`` works."""
    wheels, target, cwd = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    cwd.mkdir()
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    assert "deprecated" not in build.stderr.lower(), build.stderr
    wheel = next(wheels.glob("agenttune_platform-*.whl"))
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert inst.returncode == 0, inst.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env.update(PYTHONPATH=str(target), AGENTTUNE_HOME=str(tmp_path / "home"))
    where = subprocess.run([sys.executable, "-c", "import agenttune_assets.instance as i; print(i.__file__); print(i.template_path('sqlite'))"],
                           cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0 and where.stdout.startswith(str(target)), where.stdout + where.stderr
    init = subprocess.run([sys.executable, "-m", "agenttune_assets.cli", "init"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert init.returncode == 0 and f"wrote {tmp_path / 'home' / 'dagster' / 'dagster.yaml'} (sqlite)" in init.stdout, init.stdout + init.stderr


def test_summary_says_a_step_was_killed_by_a_signal_and_why_another_failed(tmp_path, monkeypatch):
    import dagster as dg
    from rich.console import Console

    from agenttune_assets.run_view import RunSummary, render_summary, step_times

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # reconstructable re-imports the job in each step process
    from _killed_step_job import killed_job

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = dg.execute_job(dg.reconstructable(killed_job), instance=instance, raise_on_error=False)
        steps = {s["step"]: s for s in step_times(instance, result.run_id)}
    assert steps["fine"]["status"] == "SUCCESS" and "reason" not in steps["fine"]
    assert steps["killed"]["status"] == "FAILURE"
    assert steps["killed"]["reason"].startswith("process of killed was terminated by signal 9 (SIGKILL)")
    assert "out-of-memory killer" in steps["killed"]["reason"]
    assert steps["broken"]["reason"] == "RuntimeError: bad input 1: the step's own error"
    summary = RunSummary(result.run_id, False, "FAILURE", 1.0, None, list(steps.values()), [], None)
    buf = io.StringIO()
    render_summary(Console(file=buf, width=300, highlight=False, soft_wrap=True, color_system=None), summary)
    assert "killed: FAILURE - process of killed was terminated by signal 9 (SIGKILL)" in buf.getvalue()
