"""What lets the loop survive a dead run, without a daemon: the shipped instance settings, the launcher's pid check,
and a requeued batch being novel again (the real-daemon kill -9 test is test_dead_run_daemon.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import dagster as dg
import pytest

from _closed_loop_helpers import make_example


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_shipped_configs_free_dead_runs_slots_and_check_worker_health(kind, tmp_path, monkeypatch):
    import yaml

    from agenttune_assets.instance import template_path

    data = yaml.safe_load(template_path(kind).read_text())
    assert data["run_launcher"] == {"module": "agenttune_assets.launcher", "class": "LocalHealthRunLauncher"}
    assert data["run_monitoring"] == {"enabled": True, "poll_interval_seconds": 10, "start_timeout_seconds": 300, "cancel_timeout_seconds": 300,
                                      "max_runtime_seconds": 21600, "free_slots_after_run_end_seconds": 15}
    if kind == "sqlite":  # Dagster accepts the file as it ships (the key names are this Dagster version's)
        (tmp_path / "dagster.yaml").write_text(template_path(kind).read_text())
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
        with dg.DagsterInstance.get() as instance:
            assert type(instance.run_launcher).__name__ == "LocalHealthRunLauncher" and instance.run_launcher.supports_check_run_worker_health
            assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] == 15
            assert instance.run_monitoring_poll_interval_seconds == 10


def _run_with_worker(instance, pid: int, grpc_info: dict | None):
    from dagster._core.events import EngineEventData
    from dagster._core.storage.tags import GRPC_INFO_TAG

    run = instance.create_run_for_job(dg.GraphDefinition("g").to_job(), tags={GRPC_INFO_TAG: json.dumps(grpc_info)} if grpc_info else {})
    instance.report_engine_event(f"Started process for run (pid: {pid}).", run, EngineEventData.in_process(pid))
    return instance.get_run_by_id(run.run_id)


def test_launcher_reports_a_live_worker_running_and_a_killed_one_failed(tmp_path, monkeypatch):
    from dagster._core.launcher import WorkerStatus

    from agenttune_assets.instance import template_path

    (tmp_path / "dagster.yaml").write_text(template_path("sqlite").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with dg.DagsterInstance.get() as instance:
            launcher = instance.run_launcher
            run = _run_with_worker(instance, worker.pid, {"host": "localhost", "socket": "/tmp/x.sock"})
            live = launcher.check_run_worker_health(run)
            assert live.status == WorkerStatus.RUNNING and live.msg == f"worker pid {worker.pid} alive"
            worker.kill()
            worker.wait(10)
            dead = launcher.check_run_worker_health(run)
            assert dead.status == WorkerStatus.FAILED and f"pid {worker.pid}" in dead.msg
            # A remote code server's worker, or a run with no worker pid, cannot be checked here: left to max_runtime_seconds.
            remote = _run_with_worker(instance, worker.pid, {"host": "10.9.8.7", "port": 4000})
            assert launcher.check_run_worker_health(remote).status == WorkerStatus.RUNNING
            bare = instance.create_run_for_job(dg.GraphDefinition("h").to_job())
            assert launcher.check_run_worker_health(bare).status == WorkerStatus.RUNNING
    finally:
        if worker.poll() is None:
            worker.kill()


def test_a_pid_reused_by_a_younger_process_is_not_the_worker():
    from agenttune_assets.launcher import worker_alive

    assert worker_alive(os.getpid(), time.time())
    assert not worker_alive(os.getpid(), time.time() - 3600 * 24 * 365 * 30)  # "reported" long before this process started


def test_a_requeued_batch_of_a_dead_run_is_novel_again_for_t5(warehouse):
    from agenttune_lib.closed_loop import RetrainingTrigger, TrainingBuffer

    buf = TrainingBuffer(warehouse)
    buf.add([make_example(i, "hallucinated_output") for i in range(3)])
    assert RetrainingTrigger().evaluate(buf.stats()).firing("T5") is not None
    batch = buf.drain()
    buf.finish_retrain(batch.batch_id, succeeded=False, requeue=True)  # its run was killed: nothing was trained
    again = RetrainingTrigger().evaluate(buf.stats()).firing("T5")
    assert again is not None and again.figures["count"] == 3
    second = buf.drain()
    buf.finish_retrain(second.batch_id, succeeded=False, refused=True)  # a candidate was trained on it (and refused)
    buf.add([make_example(10 + i, "hallucinated_output") for i in range(3)])
    assert RetrainingTrigger().evaluate(buf.stats()).firing("T5") is None
