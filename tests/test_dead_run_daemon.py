"""A loop that survives a dead run, against a real `dagster-daemon run` on the shipped instance config.

The T5 sensor drains the failure buffer and launches retrain_job; mid-run its worker and the code server that
spawned it are killed with SIGKILL (nothing is left to report the death). Run monitoring fails the run within
its poll bound (the launcher's pid check), the monitoring daemon frees its `warehouse` pool slot, the sensor
requeues the batch and fires again, and the next run retrains, gates and deploys."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import dagster as dg
import pytest

from _chat_stub import chat_endpoint
from _closed_loop_helpers import DOCS_COMPLETE, DOCS_MISSING, docs_rule as _docs_rule, kyc_applicant, kyc_stage_replies, kyc_teacher_reply as _teacher_reply

warnings.simplefilter("ignore")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[1]
# Bounds from the shipped config (poll_interval_seconds 10, free_slots_after_run_end_seconds 15) plus slack for a loaded machine.
FAILED_WITHIN_S = 45
SLOT_FREED_WITHIN_S = 75




def _fill_failure_buffer(home: Path, base: Path, audit: Path, tmp_path: Path) -> None:
    """Production-like DECIDE traffic (6 good, 6 failing national-ID runs) and failure_buffer over it, as in the §4.2 e2e test."""
    from agenttune_assets.defs.assets.deploy import failure_buffer
    from agenttune_assets.defs.resources import ClosedLoopResource, ServingResource, WarehouseResource
    from agenttune_lib.decide.runner import GraphRunner

    wh_path = home / "warehouse.duckdb"

    def runner(doc_check):
        return GraphRunner.from_template("kyc_triage", model=kyc_stage_replies(doc_check=doc_check), audit=audit, warehouse_path=wh_path,
                                         review_dir=tmp_path / "reviews", destinations=[], human_review_timeout=0.0, served_adapter_id="base:tiny")
    for i in range(6):
        runner(lambda r: _docs_rule(r.prompt)).run(kyc_applicant(i))
    for i in range(6):
        runner(lambda r: "the documents look fine").run(kyc_applicant(100 + i, documents=("national_id", "proof_of_address")))
    with chat_endpoint(_teacher_reply, "/v1") as (url, _seen):
        res = dg.materialize([failure_buffer], resources={
            "warehouse": WarehouseResource(path=str(wh_path)),
            "serving": ServingResource(deploy_root=str(home / "models" / "deployed"), base_checkpoint=str(base)),
            "closed_loop": ClosedLoopResource(audit_paths=[str(audit)], corrector="llm", corrector_endpoint=url, corrector_model="teacher"),
        })
    assert res.asset_materializations_for_node("failure_buffer")[0].metadata["accepted"].value == 6


def _wait(what: str, bound_s: float, probe, daemon_log: Path, every: float = 0.5):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        out = probe()
        if out:
            return out
        time.sleep(every)
    tail = daemon_log.read_text(errors="replace")[-4000:] if daemon_log.exists() else ""
    pytest.fail(f"{what}: not within {bound_s:.0f}s\n--- daemon log tail ---\n{tail}")


def _runs(instance):
    return [r.dagster_run for r in instance.get_run_records(filters=dg.RunsFilter(job_name="retrain_job"), ascending=True)]


def _step_started(instance, run_id: str, step: str) -> bool:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_START).records
    return any(r.event_log_entry.step_key == step for r in records)


def test_kill_9_of_a_retrain_run_fails_it_frees_its_pool_slot_and_the_next_trigger_retrains_and_deploys(tmp_path, platform_home, monkeypatch):
    import psutil

    from agenttune_assets.instance import init_instance
    from agenttune_assets.launcher import worker_pid
    from agenttune_lib.closed_loop import TrainingBuffer
    from agenttune_lib.models.base import select_base_model
    from agenttune_lib.models.serving import resolve_served_model
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.warehouse import Warehouse

    models = platform_home / "models"
    base = save_tiny_model(models / "tiny")
    select_base_model(models, checkpoint=base)
    audit = platform_home / "artifacts" / "decide" / "audit.jsonl"
    _fill_failure_buffer(platform_home, base, audit, tmp_path)

    dagster_home = tmp_path / "dagster"
    init_instance(dagster_home, "sqlite")  # the shipped template, unchanged
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(json.dumps({"load_from": [{"python_file": {
        "relative_path": str(REPO / "tests" / "_daemon_location.py"), "working_directory": str(REPO), "location_name": "daemon_test"}}]}))
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "AGENTTUNE_HOME": str(platform_home), "AGENTTUNE_TEST_BASE": str(base),
           "AGENTTUNE_TEST_AUDIT": str(audit), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    daemon_log = tmp_path / "daemon.log"
    daemon_bin = Path(sys.executable).with_name("dagster-daemon")
    with open(daemon_log, "wb") as log:
        daemon = subprocess.Popen([str(daemon_bin), "run", "-w", str(workspace)], env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        with dg.DagsterInstance.get() as instance:
            assert type(instance.run_launcher).__name__ == "LocalHealthRunLauncher"
            # 1. The sensor fires and the retrain run gets into trained_adapter, holding a `warehouse` slot.
            first = _wait("a retrain run started by the T5 sensor", 600, lambda: next(iter(_runs(instance)), None), daemon_log)
            _wait("trained_adapter started in the first run", 600, lambda: _step_started(instance, first.run_id, "trained_adapter"), daemon_log, 0.2)
            pid, _ = worker_pid(instance, first.run_id)
            worker = psutil.Process(pid)
            server = worker.parent()
            assert "grpc" in " ".join(server.cmdline()), server.cmdline()  # the code server that spawned the worker
            held = instance.event_log_storage.get_concurrency_info("warehouse")
            assert first.run_id in held.active_run_ids
            # 2. kill -9: the code server first (it would report its child's death), then the worker itself.
            os.kill(server.pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            assert instance.get_run_by_id(first.run_id).status == dg.DagsterRunStatus.STARTED

            failed = _wait("the killed run marked FAILED", FAILED_WITHIN_S,
                           lambda: instance.get_run_by_id(first.run_id).status == dg.DagsterRunStatus.FAILURE, daemon_log)
            failed_after = time.monotonic() - killed_at
            messages = [r.event_log_entry.message for r in instance.get_records_for_run(first.run_id).records]
            assert any(f"run worker process (pid {pid}) is gone" in (m or "") for m in messages), messages[-5:]
            assert failed

            def slot_freed():
                return first.run_id not in instance.event_log_storage.get_concurrency_info("warehouse").active_run_ids
            _wait("the dead run's warehouse pool slot freed", SLOT_FREED_WITHIN_S, slot_freed, daemon_log)
            freed_after = time.monotonic() - killed_at

            # 3. The sensor requeues the dead run's batch and fires again; that run retrains, gates and deploys.
            def second_run():
                later = [r for r in _runs(instance) if r.run_id != first.run_id]
                return later[0] if later else None
            second = _wait("the next retrain run launched", 300, second_run, daemon_log)
            assert second.tags["agenttune/retrain_batch"] != first.tags["agenttune/retrain_batch"]
            done = _wait("the next retrain run finished", 1500,
                         lambda: (s := instance.get_run_by_id(second.run_id).status) in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE) and s,
                         daemon_log, 2.0)
            assert done == dg.DagsterRunStatus.SUCCESS, [r.event_log_entry.message for r in instance.get_records_for_run(second.run_id).records][-10:]
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(10)
    wh = Warehouse(platform_home / "warehouse.duckdb")
    (batch,) = [b for b in TrainingBuffer(wh).batches() if b["batch_id"] == first.tags["agenttune/retrain_batch"]]
    assert batch["status"] == "requeued"
    decision = wh.execute("SELECT approved, candidate FROM gate_decisions WHERE run_id = ?", [second.run_id])
    assert decision and decision[0][0], decision
    assert resolve_served_model(platform_home / "models" / "deployed", base).adapter_id == decision[0][1]
    assert wh.execute("SELECT run_id FROM adapters WHERE adapter_id = ?", [decision[0][1]]) == [(second.run_id,)]
    print(f"killed run FAILED {failed_after:.1f}s after kill -9, its pool slot freed after {freed_after:.1f}s")
