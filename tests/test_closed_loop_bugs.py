"""Regression tests for the long-life bugs of issue 14 §4: each failed before its fix."""
from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import dagster as dg
import pytest

from _closed_loop_helpers import make_example, write_kyc_audit
from agenttune_lib.closed_loop import ClosedLoop, DetectorConfig, FailureDetector, RetrainingTrigger, TrainingBuffer, TriggerConfig
from agenttune_lib.closed_loop.gate import GateDecision
from agenttune_lib.closed_loop.tick import trigger_tick
from agenttune_lib.warehouse import Warehouse

warnings.simplefilter("ignore")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def buf(tmp_path):
    return TrainingBuffer(Warehouse(tmp_path / "wh.duckdb"), reward_window=5)


def test_t4_on_an_empty_buffer_skips_with_a_reason(buf):
    buf.add(rewards=[1.0] * 5)
    buf.add(rewards=[0.0] * 5)
    out = trigger_tick(buf, RetrainingTrigger(), "T4", None)
    assert not out.fired and "reward_drift" in out.reason and "nothing to train" in out.reason
    assert buf.stats().retrain_batch is None


def test_orphaned_decide_run_does_not_stall_the_detector(tmp_path):
    from agenttune_lib.decide.audit import AuditWriter

    path = tmp_path / "audit.jsonl"
    w = AuditWriter(path)
    w.append({"record_type": "stage", "run_id": "orphan", "template_id": "t", "stage_id": "a", "stage_type": "llm_call",
              "status": "ok", "output": "x", "timestamp": "2020-01-01T00:00:00+00:00"})
    write_kyc_audit(path, n_loops=1, n_ok=2)
    read = FailureDetector(DetectorConfig(open_run_timeout_s=3600)).read_audit(path, 0)
    assert read.end_offset == path.stat().st_size
    assert len(read.runs) == 3 and read.orphaned == ["orphan"]
    # A run that is still open within the timeout holds the offset back, as before.
    w.append({"record_type": "stage", "run_id": "live", "template_id": "t", "stage_id": "a", "stage_type": "llm_call", "status": "ok"})
    again = FailureDetector(DetectorConfig(open_run_timeout_s=3600)).read_audit(path, read.end_offset)
    assert again.end_offset == read.end_offset and again.orphaned == []


def test_reingesting_the_same_eventlogs_is_a_noop_for_rewards(buf):
    from agenttune_lib.events import EventLog

    logs = []
    for i in range(3):
        log = EventLog([{"kind": "text", "payload": {"content": "done"}},
                        {"kind": "reward", "scope": "episode", "payload": {"value": 0.9}}],
                       id=f"ep-{i}", metadata={"task": f"t{i}", "succeeded": True})
        logs.append(log)
    loop = ClosedLoop(buf)
    loop.ingest_logs(logs)
    first = buf.stats().baseline_n
    loop.ingest_logs(logs)
    assert first == 3 and buf.stats().baseline_n == 3


def test_t2_honours_a_ratio_below_one_half(buf):
    buf.add([make_example(i, "wrong_tool") for i in range(4)] + [make_example(10 + i, "loop_collapse") for i in range(3)]
            + [make_example(20 + i, "wrong_routing") for i in range(3)])
    trig = RetrainingTrigger(TriggerConfig(dominance_ratio=0.4, dominance_min_buffer=10))
    firing = trig.evaluate(buf.stats()).firing("T2")
    assert firing is not None and firing.name == "dominance:wrong_tool"


def test_t5_never_drains_a_batch_without_accepted_examples(buf):
    buf.add([make_example(i, "loop_collapse", accepted=False) for i in range(3)])
    out = trigger_tick(buf, RetrainingTrigger(TriggerConfig(max_drop_rate=1.0)), "T5", None)
    assert not out.fired and "0 accepted" in out.reason
    assert buf.stats().size == 3


def test_a_requeued_batch_keeps_its_drop_rate_evidence(buf):
    buf.add([make_example(i) for i in range(6)] + [make_example(10 + i, accepted=False) for i in range(2)],
            dropped=[("f-a", "unclassified"), ("f-b", "no correction")])
    before = buf.stats()
    batch = buf.drain(trigger="T1")
    buf.finish_retrain(batch.batch_id, succeeded=False, requeue=True)
    after = buf.stats()
    assert (after.attempts, after.dropped, after.size) == (before.attempts, before.dropped, before.size) == (10, 4, 8)


def test_a_refused_batch_is_not_closed_as_succeeded(buf, tmp_path):
    from agenttune_lib.closed_loop import AdapterDeployer
    from agenttune_lib.closed_loop.service import deploy_decision

    buf.add([make_example(i) for i in range(3)])
    batch = buf.drain(trigger="T5")
    refused = GateDecision("d1", False, "cand", None, batch.batch_id, {}, ["accuracy: no gain"], "2026-01-01T00:00:00+00:00")
    out = deploy_decision(buf.warehouse, AdapterDeployer(tmp_path / "dep"), refused, buf)
    assert not out.deployed
    (row,) = [b for b in buf.batches() if b["batch_id"] == batch.batch_id]
    assert row["status"] == "refused"
    assert buf.stats().retrain_batch is None and buf.stats().last_retrain_at is None


def test_a_rotated_audit_log_is_detected_and_followed(tmp_path, buf):
    from agenttune_lib.decide.audit import AuditWriter

    path = tmp_path / "audit.jsonl"
    write_kyc_audit(path, n_loops=1, n_ok=1)
    loop = ClosedLoop(buf)
    assert loop.ingest_audit(path).runs == 2
    w = AuditWriter(path)
    w.append({"record_type": "run", "run_id": "tail", "template_id": "bfsi/kyc_triage", "status": "completed",
              "verdict": {"label": "approve"}, "input_text": "tail run"})
    from agenttune_lib.decide.audit import rotate_audit

    rotated = rotate_audit(path, suffix="1")
    assert rotated == tmp_path / "audit.jsonl.1" and not path.exists()
    # The writer starts a new chain under the old name.
    write_kyc_audit(path, n_loops=2, n_ok=3)
    rep = loop.ingest_audit(path)
    assert rep.runs == 1 + 5 and rep.failures == 2
    assert ClosedLoop(buf).ingest_audit(path).runs == 0


def test_run_key_and_tags_carry_the_same_buffer_version(buf):
    buf.add([make_example(i) for i in range(50)])
    out = trigger_tick(buf, RetrainingTrigger(), "T1", None)
    assert out.fired
    assert out.run_key.endswith(f":v{out.tags()['agenttune/buffer_version']}")


@pytest.mark.parametrize("config", ["dagster.yaml", "agenttune_assets/instance/postgres.yaml", "agenttune_assets/instance/sqlite.yaml"])
def test_run_monitoring_is_on_in_the_shipped_instance_configs(config):
    import yaml

    if not (ROOT / config).exists():
        pytest.skip(f"{config} is not shipped in this tree")
    data = yaml.safe_load((ROOT / config).read_text())
    mon = data.get("run_monitoring") or {}
    assert mon.get("enabled") is True and mon.get("max_runtime_seconds", 0) > 0 and mon.get("start_timeout_seconds", 0) > 0


def test_a_batch_whose_retrain_run_died_is_released_and_requeued(tmp_path, buf):
    from agenttune_assets.defs.resources import ClosedLoopResource, WarehouseResource
    from agenttune_assets.defs.sensors import SENSORS

    buf.add([make_example(i) for i in range(50)])
    resources = {"warehouse": WarehouseResource(path=buf.warehouse.path), "closed_loop": ClosedLoopResource()}
    t1 = SENSORS[0]
    with dg.instance_for_test() as instance:
        with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
            (req,) = t1(ctx).run_requests
        batch = req.tags["agenttune/retrain_batch"]
        run = instance.add_run(dg.DagsterRun(job_name="retrain_job", run_id="dead-run", tags=req.tags, status=dg.DagsterRunStatus.STARTED))
        with dg.build_sensor_context(instance=instance, resources=resources, cursor=None) as ctx:
            blocked = t1(ctx)
        assert not blocked.run_requests and buf.stats().retrain_batch == batch  # a live run keeps its batch
        instance.report_run_failed(run)  # what run monitoring does to a run whose worker died
        with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
            again = t1(ctx)
        (req2,) = again.run_requests
    assert req2.tags["agenttune/retrain_batch"] != batch
    (old,) = [b for b in buf.batches() if b["batch_id"] == batch]
    assert old["status"] == "requeued" and len(buf.read_batch(req2.tags["agenttune/retrain_batch"]).examples) == 50


def test_the_retrain_algorithm_is_explicit(buf):
    from agenttune_lib.closed_loop.buffer import retrain_rows

    buf.add([make_example(i) for i in range(3)])
    batch = buf.drain()
    assert set(retrain_rows(batch, "dpo")[0]) >= {"prompt", "chosen", "rejected"}
    assert {r["label"] for r in retrain_rows(batch, "bco")} == {True, False}
    assert len(retrain_rows(batch, "grpo")[0]["completions"]) == 2
    with pytest.raises(ValueError, match="distill"):
        retrain_rows(batch, "distill")


def test_an_algorithm_that_cannot_consume_offline_rows_is_an_error_not_a_fallback(tmp_path):
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl.train import TrainConfig, train_adapter

    base = save_tiny_model(tmp_path / "base")
    with pytest.raises(ValueError, match="grpo"):
        train_adapter(TrainConfig(algorithm="grpo", max_steps=1), base, [], tmp_path / "out",
                      offline_rows=[{"prompt": [{"role": "user", "content": "q"}], "completions": ["a", "b"], "rewards": [1.0, 0.0]}])


def test_a_tick_that_fires_nothing_never_opens_the_warehouse(buf, monkeypatch):
    buf.add([make_example(i) for i in range(5)])
    reader = TrainingBuffer(Warehouse(buf.warehouse.path), reward_window=5)

    def no_connect(*a, **k):
        raise AssertionError("the tick opened the warehouse")

    monkeypatch.setattr(reader.warehouse, "connect", no_connect)
    out = trigger_tick(reader, RetrainingTrigger(), "T1", None, retrain_running=no_connect)
    assert not out.fired and "does not hold" in out.reason and out.version == buf.stats().version
    assert trigger_tick(reader, RetrainingTrigger(), "T1", out.version).reason.startswith("nothing new")



def test_the_closed_loop_refuses_a_tampered_audit_log(tmp_path):
    """The loop verifies the keyed chain before it reads: a log with a line removed is never turned into training data."""
    from agenttune_lib.decide.audit import AuditError
    from agenttune_lib.warehouse import Warehouse

    path = tmp_path / "audit.jsonl"
    write_kyc_audit(path, n_loops=2, n_ok=2)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1] + lines[2:]))
    buf = TrainingBuffer(Warehouse(tmp_path / "wh.duckdb"))
    with pytest.raises(AuditError, match="fails verification"):
        ClosedLoop(buf).ingest_audit(path)
    assert buf.stats().size == 0


def test_gate_criteria_read_each_metric_in_its_direction():
    """Fewer searches per question is an improvement; a lower success on a guard suite is a refusal naming it."""
    from agenttune_lib.closed_loop.criteria import SuiteCriterion
    from agenttune_lib.closed_loop.gate import DeploymentGate, GateConfig

    searches = {"suite": "qa", "metric": "searches", "n": 40, "diff": -0.8, "ci_low": -1.1, "ci_high": -0.5,
                "headline": False, "higher_is_better": False}
    score_ok = {"suite": "qa", "metric": "score", "n": 40, "diff": 0.10, "ci_low": 0.02, "ci_high": 0.2,
                "headline": True, "higher_is_better": True}
    score_bad = dict(score_ok, diff=-0.2, ci_low=-0.35, ci_high=-0.05)
    gate = DeploymentGate(GateConfig(targets={"distill": (SuiteCriterion("qa", "searches", 0.1),)},
                                     guards=(SuiteCriterion("qa", "score", 0.05),)))
    target = gate.target_arm("distill", {"qa/searches": searches}, has_batch=False)
    assert target["passed"] and target["criteria"][0]["lower_bound"] == 0.5
    assert gate.guard_arm({"qa/score": score_ok})["passed"]
    refused = gate.guard_arm({"qa/score": score_bad})
    assert not refused["passed"]
    assert refused["reason"].startswith("guard qa/score: 0") or "guard qa/score" in refused["reason"]
    assert "-0.350" in refused["reason"] and "-0.050" in refused["reason"]


def test_rpo_adds_the_chosen_answers_nll_to_the_dpo_loss(tmp_path):
    """TrainConfig.dpo_loss reaches TRL: ("sigmoid", "sft") trains on DPO plus the chosen side's NLL (RPO)."""
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl.train import TrainConfig, train_adapter

    base = save_tiny_model(tmp_path / "base")
    rows = [{"prompt": [{"role": "user", "content": f"case {i}: is the file complete?"}],
             "chosen": [{"role": "assistant", "content": '{"complete": true}'}],
             "rejected": [{"role": "assistant", "content": "looks fine"}], "trajectory_id": f"t{i}"} for i in range(4)]

    def first_loss(loss):
        cfg = TrainConfig(algorithm="dpo", max_steps=1, batch_size=4, learning_rate=1e-3, dpo_loss=loss)
        return train_adapter(cfg, base, [], tmp_path / "-".join(loss), offline_rows=rows).loss_curve[0]

    dpo, rpo = first_loss(("sigmoid",)), first_loss(("sigmoid", "sft"))
    assert abs(dpo - 0.6931) < 0.01  # log 2: policy == reference at the first step
    assert rpo > dpo + 1.0  # plus the untrained model's NLL of the chosen answer
    with pytest.raises(ValueError, match="DPO setting"):
        TrainConfig(algorithm="grpo", dpo_loss=("sigmoid", "sft"))
    with pytest.raises(ValueError, match="no loss term"):
        TrainConfig(algorithm="dpo", dpo_loss=())


def test_a_warm_started_retrain_continues_the_given_adapter_and_records_its_parent(tmp_path):
    """init_adapter continues a trained adapter (its LoRA weights, not a fresh zero-B LoRA); lineage names the parent."""
    import torch
    from safetensors.torch import load_file

    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl.train import TrainConfig, train_adapter
    from agenttune_lib.warehouse import Warehouse

    base = save_tiny_model(tmp_path / "base")
    wh = Warehouse(tmp_path / "wh.duckdb")
    rows = [{"prompt": [{"role": "user", "content": f"case {i}: is the file complete?"}],
             "chosen": [{"role": "assistant", "content": '{"complete": true}'}],
             "rejected": [{"role": "assistant", "content": "looks fine"}], "trajectory_id": f"t{i}"} for i in range(4)]
    parent = train_adapter(TrainConfig(algorithm="dpo", max_steps=3, batch_size=4, learning_rate=5e-2), base, [], tmp_path / "p",
                           offline_rows=rows, warehouse=wh)

    def lora_b(result):
        weights = load_file(str(result.adapter_dir / "adapter_model.safetensors"))
        return torch.cat([v.flatten() for k, v in sorted(weights.items()) if "lora_B" in k])

    tiny_lr = TrainConfig(algorithm="dpo", max_steps=1, batch_size=4, learning_rate=1e-9)
    warm = train_adapter(tiny_lr, base, [], tmp_path / "w", offline_rows=rows, warehouse=wh,
                         init_adapter=parent.adapter_dir, parent_adapter_id=parent.adapter_id)
    cold = train_adapter(tiny_lr, base, [], tmp_path / "c", offline_rows=rows, warehouse=wh)
    assert lora_b(parent).abs().max() > 1e-3
    assert torch.allclose(lora_b(warm), lora_b(parent), atol=1e-6)  # continued from the parent's weights
    assert lora_b(cold).abs().max() < 1e-6  # a fresh LoRA starts at B = 0
    parents = dict(wh.execute("SELECT adapter_id, parent_adapter_id FROM adapters"))
    assert parents == {parent.adapter_id: None, warm.adapter_id: parent.adapter_id, cold.adapter_id: None}
    with pytest.raises(FileNotFoundError, match="not a PEFT adapter"):
        train_adapter(tiny_lr, base, [], tmp_path / "x", offline_rows=rows, init_adapter=tmp_path / "nowhere")


def test_training_precision_is_checked_and_bf16_trains_an_fp32_adapter(tmp_path):
    from safetensors.torch import load_file

    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl.train import TrainConfig, train_adapter

    with pytest.raises(ValueError, match="TrainConfig.precision"):
        TrainConfig(algorithm="dpo", precision="fp8")
    assert TrainConfig(precision="auto").precision in ("float32", "bfloat16")
    base = save_tiny_model(tmp_path / "base")
    rows = [{"prompt": [{"role": "user", "content": f"case {i}"}], "chosen": [{"role": "assistant", "content": "yes"}],
             "rejected": [{"role": "assistant", "content": "no"}], "trajectory_id": f"t{i}"} for i in range(4)]
    res = train_adapter(TrainConfig(algorithm="dpo", max_steps=2, batch_size=4, learning_rate=1e-2, precision="bfloat16"), base, [],
                        tmp_path / "o", offline_rows=rows)
    assert len(res.loss_curve) == 2 and all(x == x for x in res.loss_curve)  # finite, no NaN
    weights = load_file(str(res.adapter_dir / "adapter_model.safetensors"))
    assert {str(v.dtype) for v in weights.values()} == {"torch.float32"}
    assert max(float(v.abs().max()) for k, v in weights.items() if "lora_B" in k) > 0  # it trained


def _holdout_replays(correct: list[bool]) -> list[dict]:
    return [{"kind": "holdout", "passed": ok, "verdict_correct": ok, "stage_correct": {}, "loop_collapse": False,
             "step_limit": False, "error": False} for ok in correct]


def test_without_a_retrain_batch_the_held_out_decide_verdicts_are_judged_once_by_their_guard():
    """No batch: the replay arm does not apply, so a held-out verdict drop inside the guard's margin is approved, and
    one beyond it is refused by the decide/verdict_accuracy guard alone (never by the replay arm's tighter margin)."""
    from agenttune_lib.closed_loop.criteria import SuiteCriterion
    from agenttune_lib.closed_loop.gate import DeploymentGate, GateConfig

    target = {"suite": "qa", "metric": "valid_call", "n": 24, "diff": 0.5, "ci_low": 0.29, "ci_high": 0.7,
              "base_mean": 0.0, "candidate_mean": 0.5, "higher_is_better": True, "created_at": "2026-12-06"}
    gate = DeploymentGate(GateConfig(noninferiority_margin=0.05, require_trajectory_arm=False,
                                     targets={"distill": (SuiteCriterion("qa", "valid_call", 0.0, 20),)},
                                     guards=(SuiteCriterion("decide", "verdict_accuracy", 0.25, 10),)))
    base = _holdout_replays([True] * 20)
    one_lost = _holdout_replays([True] * 19 + [False])  # 1.00 -> 0.95: beyond 0.05, inside the guard's 0.25
    ok = gate.evaluate_decision(replay_old=base, replay_new=one_lost, comparisons=[target], candidate="c", baseline="b")
    assert ok.approved, ok.reasons
    assert ok.arms["replay"] == {**ok.arms["replay"], "exercised": False, "passed": True, "reason": None}
    assert ok.arms["replay"]["holdout_new"]["verdict_accuracy"] == 0.95
    guard = ok.arms["guards"]["criteria"][0]
    assert guard["criterion"] == "decide/verdict_accuracy" and guard["n"] == 20 and guard["passed"]

    half_lost = _holdout_replays([True] * 10 + [False] * 10)  # 1.00 -> 0.50: beyond the guard's margin
    refused = gate.evaluate_decision(replay_old=base, replay_new=half_lost, comparisons=[target], candidate="c", baseline="b")
    assert not refused.approved
    assert [r.split(":")[0] for r in refused.reasons] == ["guards"]
    assert "guard decide/verdict_accuracy: 1.000 -> 0.500" in refused.reasons[0]

    with_batch = gate.evaluate_decision(replay_old=base, replay_new=one_lost, comparisons=[target], candidate="c", baseline="b",
                                        batch_id="batch-1")
    assert with_batch.arms["replay"]["exercised"] and not with_batch.arms["replay"]["passed"]
    assert "held-out verdict_accuracy 1.00 -> 0.95 (margin 0.05)" in with_batch.arms["replay"]["reason"]
