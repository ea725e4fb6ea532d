"""Paper §4.2 end to end: a looping KYC-triage DECIDE log -> loop_collapse failures -> buffer -> trigger
sensor -> DPO retrain on a tiny model -> gate on cases rebuilt from successful runs -> deploy + reload;
a worse adapter is refused, and a crash during deploy leaves the old adapter serving."""
from __future__ import annotations

import json
import warnings

import dagster as dg
import pytest

from _closed_loop_helpers import DOCS_COMPLETE, DOCS_MISSING, PolicyChoiceModel, kyc_applicant, kyc_stage_replies
from agenttune_assets.defs.resources import ClosedLoopResource, WarehouseResource
from agenttune_assets.defs.sensors import retrain_t5_sensor
from agenttune_lib.closed_loop import AdapterDeployer, ClosedLoop, DeploymentGate, GateConfig, LikelihoodPolicy, TrainingBuffer
from agenttune_lib.closed_loop.gate import load_gate_decision, record_gate_decision
from agenttune_lib.closed_loop.replay import DecideReplayPolicy
from agenttune_lib.closed_loop.service import deploy_decision, holdout_from_audits
from agenttune_lib.decide.runner import GraphRunner
from agenttune_lib.events import EventLog
from agenttune_lib.warehouse import Provenance, Warehouse

warnings.simplefilter("ignore")
pytestmark = pytest.mark.slow


def _base(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _dpo(base_dir, rows, out_dir, steps=12):
    from datasets import Dataset

    from agenttune_lib.rl import create_agentic_trainer

    model, tok = _base(base_dir)
    trainer = create_agentic_trainer(
        "dpo", model=model, tokenizer=tok, train_dataset=Dataset.from_list(rows), output_dir=str(out_dir / "trainer"),
        max_steps=steps, per_device_train_batch_size=len(rows), learning_rate=3e-2, beta=0.1, seed=0, disable_tqdm=True,
    )
    trainer.train()
    trainer.model.save_pretrained(out_dir)
    return out_dir


def _identity_adapter(base_dir, out_dir):
    from peft import LoraConfig, get_peft_model

    model, _ = _base(base_dir)
    get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])).save_pretrained(out_dir)
    return out_dir


def _policy(base_dir, adapter_dir):
    from peft import PeftModel

    model, tok = _base(base_dir)
    return LikelihoodPolicy(PeftModel.from_pretrained(model, str(adapter_dir)) if adapter_dir else model, tok)


def _replay(policy, cases, review_dir):
    """Each held-out case through the whole template with the policy deciding documents; answers + trajectory metrics."""
    from agenttune_lib.evaluation import TrajectoryEvaluator

    replay = DecideReplayPolicy(PolicyChoiceModel(policy), "kyc_triage", review_dir=review_dir, human_review_timeout=0.0)
    answers = {c.case_id: replay(c) for c in cases}
    metrics = TrajectoryEvaluator().evaluate_batch([EventLog.from_pipeline_state(s) for s in replay.states])["mean"]
    loops = sum(s.status == "step_limit" for s in replay.states)
    return (lambda case: answers[case.case_id]), metrics, loops


def test_section_4_2_decide_closed_loop_end_to_end(tmp_path):
    from peft import PeftModel

    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl.lineage import record_adapter

    home = tmp_path / "home"
    wh = Warehouse(home / "warehouse.duckdb")
    base_dir = save_tiny_model(home / "models" / "base")
    audit = home / "decide" / "kyc_triage" / "audit.jsonl"
    deployer = AdapterDeployer(home / "models" / "deployed", wh)
    reviews = tmp_path / "reviews"

    # Past successful runs: document checks made by the earlier rule (complete when both documents are on file).
    earlier = kyc_stage_replies(doc_check=lambda r: DOCS_COMPLETE if "proof_of_address" in r.prompt else DOCS_MISSING)
    ok_runner = GraphRunner.from_template("kyc_triage", model=earlier, audit=audit, review_dir=reviews, destinations=[])
    assert all(ok_runner.run(kyc_applicant(i)).status == "completed" for i in range(6))

    # The serving adapter v1 (bootstrapped through the gate; it behaves like the base model) takes over and loops.
    v1 = _identity_adapter(base_dir, tmp_path / "v1")
    boot_cases = holdout_from_audits([audit])
    base_answer, _, _ = _replay(_policy(base_dir, None), boot_cases, reviews)
    v1_answer, v1_traj, v1_loops = _replay(_policy(base_dir, v1), boot_cases, reviews)
    boot = DeploymentGate(GateConfig(require_improvement=False)).evaluate_decision(
        boot_cases, base_answer, v1_answer, trajectory_old=v1_traj, trajectory_new=v1_traj, candidate="v1")
    assert boot.approved, boot.reasons
    deployer.apply_decision(boot, v1, "v1")
    serving = PolicyChoiceModel(LikelihoodPolicy(deployer.load(_base(base_dir)[0]), _base(base_dir)[1]))
    bad_runner = GraphRunner.from_template("kyc_triage", model=serving, audit=audit, review_dir=reviews, destinations=[])
    looped = [bad_runner.run(kyc_applicant(100 + i, loop=True)) for i in range(6)]
    assert all(s.status == "step_limit" for s in looped)
    wh.append_logs([EventLog.from_pipeline_state(s) for s in looped], Provenance(run_id="decide-run-1", asset_key="decide_runs", adapter_version="v1"), source="decide")

    # Stage 1: the detector reports six loop_collapse failures; classifier and generator buffer examples.
    buffer = TrainingBuffer(wh)
    report = ClosedLoop(buffer).ingest_audit(audit)
    assert report.failures == 6 and report.signals == {"loop_collapse": 6}
    assert report.buffered == 6 and report.accepted == 6
    ex = buffer.examples()[0]
    assert ex.root_cause == "loop_collapse" and ex.metadata["stage"] == "doc_check"
    assert json.loads(ex.chosen) == json.loads(DOCS_COMPLETE) and json.loads(ex.rejected) == json.loads(DOCS_MISSING)

    # Stage 2: a trigger sensor fires (T5: loop_collapse was never trained on and recurs 6 >= 3 times).
    resources = {"warehouse": WarehouseResource(path=wh.path), "closed_loop": ClosedLoopResource(audit_paths=[str(audit)])}
    with dg.instance_for_test() as instance:
        with dg.build_sensor_context(instance=instance, resources=resources) as sensor_ctx:
            result = retrain_t5_sensor(sensor_ctx)
    (request,) = result.run_requests
    assert request.tags["agenttune/trigger_name"] == "novel_failure:loop_collapse"
    batch = buffer.read_batch(request.tags["agenttune/retrain_batch"])
    assert len(batch.accepted) == 6 and buffer.stats().size == 0

    # A DPO retrain on the tiny model from the drained batch.
    good = _dpo(base_dir, batch.dpo_rows(), tmp_path / "adapter-good")
    record_adapter(wh, "kyc-dpo-1", str(good), str(base_dir), "dpo", [e.trajectory_id for e in batch.accepted], run_id="retrain-run-1")

    # The gate: old vs new on held-out cases rebuilt from past successful runs, plus trajectory and provenance arms.
    cases = holdout_from_audits([audit], batch.accepted)
    assert len(cases) == 6 and {c.trajectory_id for c in cases}.isdisjoint({e.trajectory_id for e in batch.accepted})
    old_answer, old_traj, old_loops = _replay(_policy(base_dir, v1), cases, reviews)
    new_answer, new_traj, new_loops = _replay(_policy(base_dir, good), cases, reviews)
    assert old_loops == 6 and new_loops == 0
    decision = DeploymentGate().evaluate_decision(
        cases, old_answer, new_answer, examples=batch.accepted, trajectory_old=old_traj, trajectory_new=new_traj,
        candidate="kyc-dpo-1", baseline="v1", batch_id=batch.batch_id)
    acc = decision.arms["accuracy"]
    assert decision.approved, decision.reasons
    assert acc["accuracy_old"] < acc["accuracy_new"] == 1.0 and acc["n_cases"] == 6
    assert decision.arms["trajectory"]["exercised"] and decision.arms["provenance"]["passed"]
    record_gate_decision(wh, decision, run_id="retrain-run-1")

    # A crash injected during deploy leaves the old adapter serving (and loadable).
    class Crash(Exception):
        pass

    def crash(step):
        if step == "pointer_written":
            raise Crash(step)

    with pytest.raises(Crash):
        AdapterDeployer(deployer.root, wh, fault=crash).apply_decision(decision, good, "kyc-dpo-1")
    assert deployer.current().adapter_id == "v1"
    assert isinstance(deployer.load(_base(base_dir)[0]), PeftModel)

    # Deploy for real; the adapter reloads as a PeftModel and no longer loops on a looping applicant.
    out = deploy_decision(wh, deployer, load_gate_decision(wh, run_id="retrain-run-1"), buffer, run_id="retrain-run-1")
    assert out.deployed and out.serving.adapter_id == "kyc-dpo-1" and out.serving.previous == "v1"
    assert buffer.stats().retrain_batch is None and buffer.stats().last_retrain_at is not None
    reloaded = deployer.load(_base(base_dir)[0])
    assert isinstance(reloaded, PeftModel)
    fixed = GraphRunner.from_template("kyc_triage", model=PolicyChoiceModel(LikelihoodPolicy(reloaded, _base(base_dir)[1])),
                                      audit=None, review_dir=reviews, destinations=[]).run(kyc_applicant(100, loop=True))
    assert fixed.status == "completed" and fixed.verdict["label"] == "approve"

    # A second, worse adapter (trained on the pairs reversed) is refused; the good one keeps serving.
    reversed_rows = [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in batch.dpo_rows()]
    worse = _dpo(base_dir, reversed_rows, tmp_path / "adapter-worse")
    record_adapter(wh, "kyc-dpo-2", str(worse), str(base_dir), "dpo", [e.trajectory_id for e in batch.accepted], run_id="retrain-run-2")
    serving_answer, serving_traj, _ = _replay(_policy(base_dir, deployer.current().path), cases, reviews)
    worse_answer, worse_traj, _ = _replay(_policy(base_dir, worse), cases, reviews)
    refused = DeploymentGate().evaluate_decision(cases, serving_answer, worse_answer, examples=batch.accepted,
                                                 trajectory_old=serving_traj, trajectory_new=worse_traj,
                                                 candidate="kyc-dpo-2", baseline="kyc-dpo-1")
    assert not refused.approved and refused.arms["accuracy"]["accuracy_new"] < refused.arms["accuracy"]["accuracy_old"]
    record_gate_decision(wh, refused, run_id="retrain-run-2")
    kept = deploy_decision(wh, deployer, refused, run_id="retrain-run-2")
    assert not kept.deployed and deployer.current().adapter_id == "kyc-dpo-1"

    # Row-level lineage from the deployed adapter back to the DECIDE runs it learned from.
    from agenttune_lib.lineage import adapter_lineage

    chain = adapter_lineage(wh, "kyc-dpo-1", deploy_root=deployer.root)
    assert chain["deployment"]["adapter_id"] == "kyc-dpo-1" and chain["gate_decision"]["approved"]
    assert {t["id"] for t in chain["trajectories"]} == {e.trajectory_id for e in batch.accepted}
    assert {t["run_id"] for t in chain["trajectories"]} == {"decide-run-1"}
