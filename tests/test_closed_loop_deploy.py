"""DeploymentGate arms and atomic deploy/rollback with crash injection; the deployed adapter reloads as a PeftModel."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from _closed_loop_helpers import make_example, write_kyc_audit
from agenttune_lib.closed_loop import AdapterDeployer, DeploymentGate, GateConfig, GateRefused, build_holdout
from agenttune_lib.closed_loop.deploy import DEPLOY_STEPS, DeployError
from agenttune_lib.closed_loop.gate import GateDecision, load_gate_decision, record_gate_decision, trajectory_composite
from agenttune_lib.warehouse import Warehouse


def _decision(approved=True, candidate="a1"):
    return GateDecision("d-" + candidate, approved, candidate, None, None, {}, [] if approved else ["accuracy: worse"], "2026-01-01T00:00:00+00:00")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two real LoRA adapters on a tiny Qwen2, built with peft directly."""
    import torch
    from peft import LoraConfig, get_peft_model

    from agenttune_lib.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("adapters")
    out = {}
    for i, name in enumerate(["a1", "a2", "a3"]):
        model, _ = build_tiny_model()
        peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        torch.manual_seed(i)
        peft_model.save_pretrained(root / name)
        out[name] = root / name
    return out


def _lora_sum(model):
    return float(sum(p.detach().abs().sum() for n, p in model.named_parameters() if "lora_" in n))


def test_deploy_reload_and_rollback(tmp_path, adapters):
    from peft import PeftModel

    from agenttune_lib.models.tiny import build_tiny_model

    wh = Warehouse(tmp_path / "wh.duckdb")
    dep = AdapterDeployer(tmp_path / "deploy", wh)
    assert dep.current() is None
    first = dep.apply_decision(_decision(candidate="a1"), adapters["a1"])
    second = dep.apply_decision(_decision(candidate="a2"), adapters["a2"])
    assert second.previous == "a1" and second.decision_id == "d-a2" and dep.current().adapter_id == "a2"
    assert (tmp_path / "deploy" / "backups" / "a1" / "adapter_config.json").exists()
    loaded = dep.load(build_tiny_model()[0])
    assert isinstance(loaded, PeftModel)
    ref = PeftModel.from_pretrained(build_tiny_model()[0], str(adapters["a2"]))
    assert _lora_sum(loaded) == pytest.approx(_lora_sum(ref))
    back = dep.rollback()
    assert back.adapter_id == "a1" and back.action == "rollback" and dep.current().path == first.path
    rows = wh.execute("SELECT adapter_id, action FROM deployments ORDER BY created_at")
    assert [r[0] for r in rows] == ["a1", "a2", "a1"] and rows[-1][1] == "rollback"
    from agenttune_lib.evaluation.report_model import deployed_adapter_id

    assert deployed_adapter_id(wh) == "a1"


def test_refused_or_bad_input_changes_nothing(tmp_path, adapters):
    dep = AdapterDeployer(tmp_path / "deploy")
    dep.apply_decision(_decision(candidate="a1"), adapters["a1"])
    with pytest.raises(GateRefused, match="accuracy: worse"):
        dep.apply_decision(_decision(False, "a2"), adapters["a2"])
    with pytest.raises(DeployError, match="not a PEFT adapter"):
        dep.apply_decision(_decision(candidate="a3"), tmp_path)
    assert dep.current().adapter_id == "a1"


@pytest.mark.parametrize("step", [s for s in DEPLOY_STEPS if s not in ("switched", "recorded")])
def test_crash_before_the_switch_leaves_the_previous_adapter_serving(tmp_path, adapters, step):
    from agenttune_lib.models.tiny import build_tiny_model

    class Crash(Exception):
        pass

    def fault(at):
        if at == step:
            raise Crash(at)

    root = tmp_path / "deploy"
    AdapterDeployer(root).apply_decision(_decision(candidate="a1"), adapters["a1"])
    with pytest.raises(Crash):
        AdapterDeployer(root, fault=fault).apply_decision(_decision(candidate="a2"), adapters["a2"])
    dep = AdapterDeployer(root)
    assert dep.current().adapter_id == "a1"
    assert not list((root / "releases").glob(".*staging")) and not list(root.glob(".*.tmp"))
    dep.load(build_tiny_model()[0])  # still loads
    assert dep.apply_decision(_decision(candidate="a2"), adapters["a2"]).adapter_id == "a2"  # and a retry succeeds


@pytest.mark.slow
def test_process_killed_mid_deploy_leaves_previous_serving(tmp_path, adapters):
    """A hard kill (os._exit, no cleanup) right before the pointer switch."""
    root = tmp_path / "deploy"
    AdapterDeployer(root).apply_decision(_decision(candidate="a1"), adapters["a1"])
    code = textwrap.dedent(f"""
        import os
        from agenttune_lib.closed_loop.deploy import AdapterDeployer
        from agenttune_lib.closed_loop.gate import GateDecision
        d = GateDecision("d-a2", True, "a2", None, None, {{}}, [], "2026-01-01T00:00:00+00:00")
        AdapterDeployer({str(root)!r}, fault=lambda s: os._exit(9) if s == "pointer_written" else None).apply_decision(d, {str(adapters['a2'])!r})
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert AdapterDeployer(root).current().adapter_id == "a1"


# -- the gate ------------------------------------------------------------------------------------

def test_holdout_is_rebuilt_from_successful_runs_in_a_real_audit_log(tmp_path):
    path = write_kyc_audit(tmp_path / "audit.jsonl", n_loops=3, n_ok=6)
    train = [make_example(0)]
    train[0].prompt = [{"role": "user", "content": "KYC application: Ana Silva, employment salaried, documents complete, case 0"}]
    cases = build_holdout(path, exclude=train, distractors=['{"action": "request_documents"}'])
    assert len(cases) == 5  # six successes, one held back because it was trained on
    assert all(c.expected in c.candidates and '{"action": "request_documents"}' in c.candidates for c in cases)
    assert {c.trajectory_id for c in cases} == {f"ok-{i}" for i in range(1, 6)}


def _policies(cases, right_old, right_new):
    def make(k):
        return lambda case: case.expected if cases.index(case) < k else case.candidates[-1]
    return make(right_old), make(right_new)


def test_gate_needs_all_three_arms(tmp_path):
    path = write_kyc_audit(tmp_path / "audit.jsonl", n_loops=0, n_ok=6)
    cases = build_holdout(path, distractors=["WRONG"])
    old, new = _policies(cases, 2, 6)
    good_traj, worse_traj = {"TAC": 0.9, "LCF": 0.1}, {"TAC": 0.7, "LCF": 0.4}
    examples = [make_example(i, source=f"user-{i % 4}") for i in range(8)]
    gate = DeploymentGate(GateConfig(guards=()))  # the ranking, trajectory and provenance arms alone
    ok = gate.evaluate_decision(cases, old, new, examples, good_traj, good_traj, candidate="a2")
    assert ok.approved and ok.arms["accuracy"]["accuracy_old"] == pytest.approx(2 / 6) and ok.arms["accuracy"]["accuracy_new"] == 1.0
    assert not gate.evaluate_decision(cases, new, old, examples, good_traj, good_traj).approved  # worse adapter refused
    regress = gate.evaluate_decision(cases, old, new, examples, good_traj, worse_traj)
    assert not regress.approved and "trajectory" in regress.reasons[0]
    assert not gate.evaluate_decision(cases, old, new, examples).approved  # the trajectory arm must be exercised
    poisoned = examples[:7] + [make_example(99, trusted=False)]
    refused = gate.evaluate_decision(cases, old, new, poisoned, good_traj, good_traj)
    assert not refused.approved and "untrusted" in refused.arms["provenance"]["reason"]
    flooded = [make_example(i, source="one-customer") for i in range(6)] + examples[:2]
    dom = gate.evaluate_decision(cases, old, new, flooded, good_traj, good_traj)
    assert not dom.approved and "one-customer" in dom.arms["provenance"]["reason"]
    assert DeploymentGate(GateConfig(min_cases=10, guards=())).evaluate_decision(cases, old, new, examples, good_traj, good_traj).approved is False
    assert trajectory_composite({"TAC": 1.0, "LCF": 0.0, "RAD": 0.3}) == 1.0


def test_gate_decisions_round_trip_through_the_warehouse(tmp_path):
    wh = Warehouse(tmp_path / "wh.duckdb")
    d = _decision(candidate="zz")
    record_gate_decision(wh, d, run_id="run-1")
    got = load_gate_decision(wh, run_id="run-1")
    assert got.decision_id == d.decision_id and got.approved and got.candidate == "zz"
    with pytest.raises(KeyError):
        load_gate_decision(wh, decision_id="nope")
