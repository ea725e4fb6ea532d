"""``agenttune materialize`` / ``agenttune status``: run the job in a worker process, watch it, summarise it.

The worker (``python -m agenttune_assets.run_view``) executes the runs with its stdout and stderr
in a log file, so Dagster's event log, tqdm bars and library warnings land there. The parent reads
the run's events back from the Dagster instance and draws a live Rich table: each step's state,
elapsed time and its latest log line. At the end it prints one summary: per-asset time, held-out
base vs adapter scores, the gate decision with its reasons and what serves now.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

SESSION_TAG = "agenttune/session"
LOG_TAG = "agenttune/log"
ENTRY_TAG = "agenttune/entry"
PROFILE_TAG = "agenttune/profile"
TAIL_WAIT_ENV = "DAGSTER_COMPUTE_LOG_TAIL_WAIT_AFTER_FINISH"
TAIL_WAIT_S = "1.5"  # seconds a step waits for the mirror to copy its last lines; tail polls once a second


# -- worker (child process) ------------------------------------------------------
def _worker(selection: list[str], session: str, log_path: str, result_path: Path, profile: str = "default") -> int:
    """The profile's partition runs first (failure_buffer reads decide_runs), then the main job under its run config; result as JSON."""
    import dagster as dg

    from agenttune_assets.definitions import defs, get_main_job
    from agenttune_assets.profiles import profile_partitions, profile_run_config

    tags = {ENTRY_TAG: "cli", SESSION_TAG: session, LOG_TAG: log_path, PROFILE_TAG: profile}
    out: dict[str, Any] = {"partitions": [], "main": None, "profile": profile}
    partitions, partition_config = profile_partitions(profile)
    with dg.DagsterInstance.get() as instance:
        if not selection:
            for asset, keys in partitions.items():
                assets_def = defs.resolve_assets_def(asset)  # resources already bound by the Definitions
                for key in keys:
                    res = dg.materialize([assets_def], instance=instance, partition_key=key, raise_on_error=False, tags=tags,
                                         run_config=partition_config.get(asset))
                    out["partitions"].append({"asset": asset, "partition": key, "success": res.success, "run_id": res.run_id})
                    result_path.write_text(json.dumps(out))
        result = dg.execute_job(
            dg.reconstructable(get_main_job), instance=instance, tags=tags, run_config=profile_run_config(profile, selection),
            asset_selection=[dg.AssetKey.from_user_string(s) for s in selection] if selection else None,
        )
        out["main"] = {"run_id": result.run_id, "success": result.success}
    result_path.write_text(json.dumps(out))
    return 0 if result.success and all(p["success"] for p in out["partitions"]) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="agenttune materialize worker (started by the CLI)")
    parser.add_argument("--session", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--select", action="append", default=[])
    parser.add_argument("--profile", default="default")
    args = parser.parse_args(argv)
    return _worker(args.select, args.session, args.log, args.result, args.profile)


# -- watching ----------------------------------------------------------------------
@dataclasses.dataclass
class StepState:
    """One step as the live view shows it."""

    key: str
    run_id: str
    status: str = "waiting"
    start: float | None = None
    end: float | None = None
    doing: str = ""

    def elapsed(self, now: float | None = None) -> float | None:
        if self.start is None:
            return None
        return (self.end or now or time.time()) - self.start


class RunWatcher:
    """Follows every run tagged with one CLI session through the instance's event log."""

    def __init__(self, instance: Any, session: str) -> None:
        self.instance = instance
        self.session = session
        self.cursors: dict[str, str | None] = {}
        self.steps: dict[tuple[str, str], StepState] = {}
        self.runs: dict[str, Any] = {}

    def poll(self) -> None:
        import dagster as dg

        for run in self.instance.get_runs(filters=dg.RunsFilter(tags={SESSION_TAG: self.session})):
            self.runs[run.run_id] = run
            if run.run_id not in self.cursors:
                self.cursors[run.run_id] = None
                plan = run.step_keys_to_execute or []
                for key in plan:
                    self.steps.setdefault((run.run_id, key), StepState(key, run.run_id))
            conn = self.instance.get_records_for_run(run.run_id, cursor=self.cursors[run.run_id], limit=5000)
            self.cursors[run.run_id] = conn.cursor
            for record in conn.records:
                self._apply(run.run_id, record.event_log_entry)

    def _apply(self, run_id: str, entry: Any) -> None:
        key = entry.step_key
        if not key:
            return
        step = self.steps.setdefault((run_id, key), StepState(key, run_id))
        event = entry.dagster_event
        kind = event.event_type_value if event else None
        if kind == "STEP_START":
            step.status, step.start = "running", entry.timestamp
        elif kind == "STEP_SUCCESS":
            step.status, step.end = "done", entry.timestamp
        elif kind == "STEP_FAILURE":
            step.status, step.end = "FAILED", entry.timestamp
            step.doing = (entry.user_message or "").splitlines()[0][:120] if entry.user_message else "failed"
        elif kind == "STEP_SKIPPED":
            step.status = "skipped"
        elif kind == "STEP_UP_FOR_RETRY":
            step.status = "retrying"
        if event is None and entry.user_message and step.status == "running":
            step.doing = entry.user_message.splitlines()[0][:120]
        elif kind in ("ASSET_MATERIALIZATION", "ASSET_CHECK_EVALUATION", "ENGINE_EVENT", "STEP_WORKER_STARTING") and step.status in ("waiting", "running"):
            step.doing = (entry.user_message or kind.lower()).splitlines()[0][:120]

    def table(self):
        from rich.table import Table

        now = time.time()
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        table.add_column("step")
        table.add_column("state")
        table.add_column("time", justify="right")
        table.add_column("doing", overflow="ellipsis", no_wrap=True, max_width=80)
        style = {"done": "green", "FAILED": "bold red", "running": "yellow", "skipped": "dim", "waiting": "dim"}
        for step in sorted(self.steps.values(), key=lambda s: (s.start is None, s.start or 0, s.key)):
            el = step.elapsed(now)
            table.add_row(step.key, f"[{style.get(step.status, '')}]{step.status}[/]", f"{el:.0f}s" if el is not None else "-", step.doing)
        return table


# -- the summary -------------------------------------------------------------------
@dataclasses.dataclass
class RunSummary:
    """What one ``agenttune materialize`` did: steps, partition runs, scores, gate and serving."""

    run_id: str | None
    success: bool
    status: str
    seconds: float | None
    log_path: str | None
    steps: list[dict[str, Any]]
    partitions: list[dict[str, Any]]
    outcome: Any  # agenttune_lib.warehouse.outcome.RunOutcome
    profile: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["outcome"] = dataclasses.asdict(self.outcome) if self.outcome is not None else None
        return out


def step_times(instance: Any, run_id: str) -> list[dict[str, Any]]:
    """Per step: key, status, wall-clock seconds and, for a failed step, why (in start order)."""
    stats = instance.get_run_step_stats(run_id)
    steps = [
        {
            "step": s.step_key,
            "status": s.status.value if s.status else "?",
            "seconds": round((s.end_time or time.time()) - s.start_time, 1) if s.start_time else None,
        }
        for s in sorted(stats, key=lambda s: s.start_time or 0)
    ]
    if any(st["status"] == "FAILURE" for st in steps):
        reasons = failure_reasons(instance, run_id)
        for st in steps:
            if st["status"] == "FAILURE" and st["step"] in reasons:
                st["reason"] = reasons[st["step"]]
    return steps


def failure_reasons(instance: Any, run_id: str) -> dict[str, str]:
    """Per failed step, one line: the executor's word when its process died (a signal such as SIGKILL from the
    kernel's out-of-memory killer, or an exit code), else the first line of the step's error."""
    import dagster as dg

    out: dict[str, str] = {}
    crashed: dict[str, str] = {}
    types = {dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.ENGINE_EVENT}
    for entry in instance.all_logs(run_id, of_type=types):
        event, key = entry.dagster_event, entry.step_key
        if not key or event is None:
            continue
        message = entry.user_message or ""
        if event.event_type == dg.DagsterEventType.ENGINE_EVENT and ("terminated by signal" in message or "unexpectedly exited" in message):
            crashed[key] = message.split(". ")[0].replace("Multiprocess executor: child process for step ", "process of ")
            if "running out of memory" in " ".join(message.split()):  # Dagster's SIGKILL explanation, line-wrapped
                crashed[key] += " (the operating system's out-of-memory killer, usually)"
        elif event.event_type == dg.DagsterEventType.STEP_FAILURE:
            error = getattr(event.step_failure_data, "error", None)
            while error is not None and error.cause is not None:  # Dagster wraps the op's own exception
                error = error.cause
            text = (error.message if error is not None else message).strip()
            out.setdefault(key, text.splitlines()[0][:200] if text else "failed")
    return {**out, **crashed}


def build_summary(instance: Any, run_id: str | None, partitions: list[dict[str, Any]], seconds: float | None, log_path: str | None) -> RunSummary:
    """Read the run's step stats from the instance and its outcome from the warehouse and deploy root."""
    from agenttune_assets.defs.resources import ClosedLoopResource, WarehouseResource
    from agenttune_lib.warehouse.outcome import run_outcome

    run = instance.get_run_by_id(run_id) if run_id else None
    steps = step_times(instance, run_id) if run else []
    status = run.status.value if run else "NOT STARTED"
    success = bool(run and run.is_success) and all(p.get("success") for p in partitions)
    if seconds is None and run is not None:
        rec = instance.get_run_record_by_id(run_id)
        if rec and rec.start_time:
            seconds = round((rec.end_time or time.time()) - rec.start_time, 1)
    if log_path is None and run is not None:
        log_path = run.tags.get(LOG_TAG)
    outcome = run_outcome(WarehouseResource().get(), ClosedLoopResource().deploy_dir(), run_id=run_id)
    profile = run.tags.get(PROFILE_TAG) if run is not None else None
    return RunSummary(run_id, success, status, seconds, log_path, steps, partitions, outcome, profile)


def _fmt(x: Any, digits: int = 3) -> str:
    return "-" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


def render_summary(console: Any, s: RunSummary) -> None:
    """The ten-second read: headline, per-asset time, scores, gate, serving (well under 60 lines)."""
    from rich.markup import escape

    o = s.outcome
    gate = o.gate if o is not None else None
    # A run still going (or queued) has not failed: say what it is doing.
    running = str(s.status).upper() in ("STARTED", "STARTING", "QUEUED", "NOT_STARTED", "CANCELING")
    verdict = "SUCCEEDED" if s.success else (f"IN PROGRESS ({s.status})" if running else f"FAILED ({s.status})")
    head = f"run {s.run_id or '-'}" + (f" (profile {s.profile})" if s.profile else "") + f" {verdict}"
    if s.seconds is not None:
        head += f" in {s.seconds:.0f}s"
    if gate is not None and gate.from_this_run:
        head += " - gate APPROVED the adapter" if gate.approved else " - gate REFUSED the adapter, nothing new deployed"
    console.print(f"[bold {'green' if s.success else 'yellow' if running else 'red'}]{head}[/]")
    if s.log_path:
        console.print(f"log: {s.log_path}")
    failed = [st for st in s.steps if st["status"] not in ("SUCCESS", "SKIPPED")]
    if s.steps:
        done = [st for st in s.steps if st["seconds"] is not None]
        cells = [f"{st['step']} {st['seconds']:.0f}s" for st in sorted(done, key=lambda x: -x["seconds"])]
        console.print("per-asset time (slowest first):")
        for i in range(0, len(cells), 4):
            console.print("  " + " | ".join(cells[i:i + 4]))
    for st in failed:
        console.print(f"  [red]{st['step']}: {st['status']}[/]" + (f" - {escape(st['reason'])}" if st.get("reason") else ""))
    for p in s.partitions:
        if not p.get("success"):
            console.print(f"  [red]{p['asset']}[{p['partition']}] FAILED (run {p['run_id']})[/]")
    if o is None:
        return
    console.print("held-out scores (base -> adapter; headline metrics, n and minimum detectable effect):")
    rows = [c for c in o.comparisons if c.get("headline") is not False]
    if rows:
        for c in rows[:12]:
            ci = f" [{_fmt(c.get('ci_low'))}, {_fmt(c.get('ci_high'))}]" if c.get("ci_low") is not None else ""
            console.print(
                f"  {c.get('suite')}/{c.get('metric')}: {_fmt(c.get('base_mean'))} -> {_fmt(c.get('candidate_mean'))} "
                f"(diff {_fmt(c.get('diff'))}{ci}, n={c.get('n')}, MDE {_fmt(c.get('mde'))})"
            )
        if len(rows) > 12:
            console.print(f"  ... {len(rows) - 12} more rows in evaluation_comparisons")
    else:
        console.print("  none recorded (no evaluation_comparisons rows in the warehouse)")
    if gate is None:
        console.print("gate: no decision recorded")
    else:
        when = "this run" if gate.from_this_run else f"an earlier run {gate.run_id or '-'} (this run recorded none)"
        console.print(f"gate ({when}): {'[green]APPROVED[/]' if gate.approved else '[red]REFUSED[/]'} candidate {gate.candidate or '-'} "
                      f"vs {gate.baseline or 'base model'}")
        for c in gate.criteria:
            lb = c.get("lower_bound")
            console.print(f"  {'ok  ' if c.get('passed') else 'FAIL'} {c.get('role')} {c.get('criterion')}: {_fmt(c.get('base'))} -> "
                          f"{_fmt(c.get('candidate'))}, n={c.get('n', 0)}, lower bound {_fmt(lb)} vs "
                          f"{'+' if c.get('role') == 'target' else '-'}{_fmt(c.get('margin'))}")
        for reason in gate.reasons[:6]:
            console.print(f"  - {reason}")
    console.print(f"serving now: {o.serving_label}" + (f" (decision {o.serving.get('decision_id')})" if o.serving else ""))
    for note in o.notes:
        console.print(f"note: {note}")


# -- driving a run from the CLI ---------------------------------------------------
def log_file_path(home: Path) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return home / "logs" / f"materialize-{stamp}-{uuid.uuid4().hex[:6]}.log"


def run_and_watch(selection: list[str], console: Any, log_path: Path, poll_s: float = 0.5, profile: str = "default") -> RunSummary:
    """Start the worker, draw the live view while it runs, and return the run's summary."""
    import dagster as dg
    from rich.live import Live

    session = uuid.uuid4().hex
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result_path = log_path.with_suffix(".result.json")
    cmd = [sys.executable, "-m", "agenttune_assets.run_view", "--session", session, "--log", str(log_path), "--result", str(result_path),
           "--profile", profile]
    for s in selection:
        cmd += ["--select", s]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # A step's stdout/stderr reach the log file through Dagster's `tail -F` mirror of its compute log, which is
    # killed as the step ends and can drop the step's last lines (STEP_SUCCESS among them: dagster-io/dagster#23336).
    env.setdefault(TAIL_WAIT_ENV, TAIL_WAIT_S)
    t0 = time.monotonic()
    with open(log_path, "ab") as log, dg.DagsterInstance.get() as instance:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        watcher = RunWatcher(instance, session)
        try:
            if not console.is_terminal:
                proc.wait()  # nothing to draw: the summary reads the instance once, after the worker ends
            else:
                with Live(watcher.table(), console=console, transient=True, auto_refresh=False, redirect_stderr=False) as live:
                    while proc.poll() is None:
                        try:
                            watcher.poll()
                        except Exception:  # noqa: BLE001 - the instance may be mid-write; the next poll catches up
                            pass
                        live.update(watcher.table(), refresh=True)
                        time.sleep(poll_s)
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(60)
            raise
        total = time.monotonic() - t0
        result = json.loads(result_path.read_text()) if result_path.exists() else {"partitions": [], "main": None}
        main = result.get("main") or {}
        run_id = main.get("run_id")
        if run_id is None:  # the worker died before or during the main run: find the run it started, if any
            runs = instance.get_runs(filters=dg.RunsFilter(tags={SESSION_TAG: session, ENTRY_TAG: "cli"}), limit=1)
            run_id = runs[0].run_id if runs and runs[0].job_name == "main_job" else None
        summary = build_summary(instance, run_id, result.get("partitions", []), round(total, 1), str(log_path))
    if proc.returncode != 0:
        summary.success = False
    if result_path.exists():
        result_path.unlink()
    return summary


def latest_cli_run_summary(console: Any) -> RunSummary | None:
    """The summary of the newest ``main_job`` run in the instance (what ``agenttune status`` prints)."""
    import dagster as dg

    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(job_name="main_job"), limit=1)
        if not runs:
            return None
        run = runs[0]
        partitions = []
        session = run.tags.get(SESSION_TAG)
        if session:
            for other in instance.get_runs(filters=dg.RunsFilter(tags={SESSION_TAG: session})):
                if other.run_id != run.run_id:
                    partitions.append({"asset": ",".join(sorted(k.to_user_string() for k in other.asset_selection or [])) or other.job_name,
                                       "partition": other.tags.get("dagster/partition", "-"), "success": other.is_success, "run_id": other.run_id})
        return build_summary(instance, run.run_id, partitions, None, None)


if __name__ == "__main__":
    sys.exit(main())
