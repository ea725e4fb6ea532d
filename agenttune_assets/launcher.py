"""The run launcher the shipped instances use: Dagster's default launcher, plus a worker health check.

Why: run monitoring fails a STARTED run whose worker died only if the launcher can check worker
health, and ``DefaultRunLauncher`` cannot (``supports_check_run_worker_health`` is False). Its
code server notices a dead child only while that server itself lives; when both die (the OOM
killer, a ``kill -9`` of the process group, a crashed daemon) the run stayed STARTED until
``max_runtime_seconds`` (6 h), holding its ``warehouse`` pool slot, so no retrain could start.
This launcher reads the worker's pid from the run's "Started process for run (pid: N)" engine
event and reports the worker FAILED once that process is gone (or a zombie, or the pid was
reused by a younger process). It can only see processes on its own host: a run whose code
server is remote, or a run with no recorded worker pid (``execute_job`` in the caller's process),
reports RUNNING and is bounded by ``max_runtime_seconds`` as before.
"""
from __future__ import annotations

import json
import socket

from dagster import DagsterEventType, DagsterRun, DefaultRunLauncher
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
from dagster._core.storage.tags import GRPC_INFO_TAG

__all__ = ["LocalHealthRunLauncher", "worker_pid", "worker_alive"]

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
_PID_EVENT = "Started process for run (pid: "


def _is_local(run: DagsterRun) -> bool:
    """True when the run's code server (hence its worker) runs on this host."""
    raw = run.tags.get(GRPC_INFO_TAG)  # set by DefaultRunLauncher at launch
    if not raw:
        return False
    try:
        info = json.loads(raw)
    except ValueError:
        return False
    if info.get("socket"):
        return True
    host = str(info.get("host") or "")
    return host in _LOCAL_HOSTS or host in {socket.gethostname(), socket.getfqdn()}


def worker_pid(instance, run_id: str) -> tuple[int, float] | None:
    """(pid, time it was reported) of the run's worker process, from its engine event; None when none was reported."""
    # The worker reports its pid in one of the run's first engine events (a resumed run would report a newer one: none here).
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT, ascending=True, limit=20).records
    for record in records:
        entry = record.event_log_entry
        message = entry.dagster_event.message if entry.dagster_event else entry.user_message
        if message and message.startswith(_PID_EVENT):
            try:
                return int(message[len(_PID_EVENT):].split(")")[0]), entry.timestamp
            except ValueError:
                return None
    return None


def worker_alive(pid: int, reported_at: float) -> bool:
    """Whether ``pid`` is still the worker that reported itself at ``reported_at`` (not gone, not a zombie, not reused)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return proc.create_time() <= reported_at + 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class LocalHealthRunLauncher(DefaultRunLauncher):
    """``DefaultRunLauncher`` whose runs' workers the run-monitoring daemon can check by pid on this host."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        if not _is_local(run):
            return CheckRunHealthResult(WorkerStatus.RUNNING, "worker not on this host: not checked (max_runtime_seconds applies)")
        found = worker_pid(self._instance, run.run_id)
        if found is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "no worker pid recorded: not checked (max_runtime_seconds applies)")
        pid, reported_at = found
        if worker_alive(pid, reported_at):
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"worker pid {pid} alive")
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker process (pid {pid}) is gone: it was killed or crashed")
