"""The gate measures what the retrain changed: DECIDE inputs replayed generatively through the template with the baseline
and the candidate; schema failures are failures; a poisoned DECIDE batch is refused by the provenance arm through the asset."""
from __future__ import annotations

import json
import warnings

import dagster as dg
import pytest

from agenttune_lib.closed_loop.criteria import SuiteCriterion

from _closed_loop_helpers import DOCS_COMPLETE, DOCS_MISSING, kyc_applicant, kyc_stage_replies
from agenttune_lib.closed_loop import ClosedLoop, DeploymentGate, FailureClassifier, FailureDetector, GateConfig, TrainingBuffer
from agenttune_lib.closed_loop.replay import replay_cases, replay_summary
from agenttune_lib.closed_loop.service import gate_replay_cases
from agenttune_lib.decide.runner import GraphRunner
from agenttune_lib.warehouse import Warehouse

warnings.simplefilter("ignore")
TEMPLATE = "kyc_triage"


def _docs_rule(request):
    return DOCS_COMPLETE if "proof_of_address" in request.prompt else DOCS_MISSING


def _runs(audit, model, applicants, reviews, served=None):
    runner = GraphRunner.from_template(TEMPLATE, model=model, audit=audit, review_dir=reviews, destinations=[],
                                       human_review_timeout=0.0, served_adapter_id=served)
    return [runner.run(a) for a in applicants]


def _prose(request):
    return "the documents look fine"


def _teacher():
    """The corrector: answers every stage by the document rule (a teacher the loop is configured with)."""
    return kyc_stage_replies(doc_check=_docs_rule)


@pytest.fixture
def kyc_log(tmp_path):
    """Six successful runs under the document rule, then six runs whose document check answers prose (a schema failure
    the template routes to its error verdict)."""
    audit = tmp_path / "audit.jsonl"
    ok = _runs(audit, kyc_stage_replies(doc_check=_docs_rule), [kyc_applicant(i) for i in range(6)], tmp_path / "r", "good")
    bad = _runs(audit, kyc_stage_replies(doc_check=_prose), [kyc_applicant(100 + i, loop=True) for i in range(6)], tmp_path / "r", "bad")
    assert all(s.status == "completed" and s.verdict["label"] == "approve" for s in ok)
    assert all(any(st["status"] == "error" for st in s.step_history) for s in bad)
    return audit


def test_a_schema_failure_routed_to_a_verdict_is_a_failure(tmp_path):
    audit = tmp_path / "audit.jsonl"
    (state,) = _runs(audit, kyc_stage_replies(doc_check=_prose), [kyc_applicant(1)], tmp_path / "r")
    read = FailureDetector().read_audit(audit, 0)
    assert len(read.runs) == 1
    (failure,) = read.failures
    assert "stage_error" in failure.signals and failure.evidence["errors"][0]["stage"] == "doc_check"
    assert FailureClassifier().classify(failure).root_cause == "hallucinated_output"
    assert read.successes == []  # never a held-out "correct" case


def test_replay_gate_approves_the_fix_and_refuses_the_regression(tmp_path, kyc_log):
    buffer = TrainingBuffer(Warehouse(tmp_path / "wh.duckdb"))
    rep = ClosedLoop(buffer, corrector_model=_teacher()).ingest_audit(kyc_log)
    assert rep.failures == 6 and rep.accepted == 6
    batch = buffer.drain(trigger="T5")
    assert {e.metadata["stage"] for e in batch.accepted} == {"doc_check"}
    assert all(e.root_cause == "hallucinated_output" and e.metadata["origin"].startswith("regenerated:") for e in batch.accepted)
    assert all(json.loads(e.chosen) == json.loads(DOCS_COMPLETE) and e.rejected == "the documents look fine" for e in batch.accepted)
    cases = gate_replay_cases([kyc_log], batch.accepted, holdout_size=4)
    assert [c.kind for c in cases].count("failure") == 6 and [c.kind for c in cases].count("holdout") == 4
    assert all(c.expected_stages == {"doc_check": json.loads(DOCS_COMPLETE)} for c in cases if c.kind == "holdout")
    fixed = replay_cases(kyc_stage_replies(doc_check=_docs_rule), cases)
    broken = replay_cases(kyc_stage_replies(doc_check=_prose), cases)
    assert replay_summary(fixed, "failure")["pass_rate"] == 1.0 and replay_summary(broken, "failure")["pass_rate"] == 0.0
    assert replay_summary(broken, "holdout")["error_rate"] == 1.0 and replay_summary(broken, "holdout")["verdict_accuracy"] == 0.0
    # guards: none here but the evaluation guard below (the default guards need suites this test does not run)
    gate = DeploymentGate(GateConfig(require_trajectory_arm=False, guards=()))
    ok = gate.evaluate_decision(examples=batch.examples, replay_old=broken, replay_new=fixed)
    assert ok.approved, ok.reasons
    assert ok.arms["replay"]["holdout_new"]["verdict_accuracy"] == 1.0
    worse = gate.evaluate_decision(examples=batch.examples, replay_old=fixed, replay_new=broken)
    assert not worse.approved and any("replay" in r for r in worse.reasons)
    assert ok.arms["targets"]["exercised"] is False  # a retrain's target is its batch: the replay arm
    # the evaluation report's paired comparisons: a guard whose interval falls below its margin refuses, naming it
    guarded = DeploymentGate(GateConfig(require_trajectory_arm=False, guards=(SuiteCriterion("tau2", "success", 0.05, 20),)))
    bad_eval = [{"suite": "tau2", "metric": "success", "n": 20, "base_mean": 0.5, "candidate_mean": 0.3, "diff": -0.2, "ci_low": -0.35, "ci_high": -0.05}]
    refused = guarded.evaluate_decision(examples=batch.examples, replay_old=broken, replay_new=fixed, comparisons=bad_eval)
    assert refused.reasons == ["guards: guard tau2/success: 0.500 -> 0.300, diff -0.200 [-0.350, -0.050], n=20; "
                               "lower bound -0.350 is below the non-inferiority margin -0.050"]
    missing = guarded.evaluate_decision(examples=batch.examples, replay_old=broken, replay_new=fixed)
    assert missing.reasons == ["guards: guard tau2/success: no paired held-out comparison for the candidate"]


def test_the_held_out_sample_has_a_fixed_size(tmp_path, kyc_log):
    buffer = TrainingBuffer(Warehouse(tmp_path / "wh.duckdb"))
    ClosedLoop(buffer, corrector_model=_teacher()).ingest_audit(kyc_log)
    batch = buffer.drain()
    first = [c.case_id for c in gate_replay_cases([kyc_log], batch.accepted, holdout_size=3) if c.kind == "holdout"]
    _runs(kyc_log, kyc_stage_replies(doc_check=_docs_rule), [kyc_applicant(200 + i) for i in range(10)], tmp_path / "r")
    again = [c.case_id for c in gate_replay_cases([kyc_log], batch.accepted, holdout_size=3) if c.kind == "holdout"]
    assert len(first) == len(again) == 3


@pytest.mark.slow
def test_a_poisoned_decide_batch_is_refused_by_the_provenance_arm_through_the_assets(tmp_path):
    from peft import LoraConfig, get_peft_model

    from agenttune_assets.defs.assets.deploy import deployed_adapter, failure_buffer, gate_decision
    from agenttune_assets.defs.resources import ClosedLoopResource, ServingResource, WarehouseResource
    from agenttune_lib.closed_loop import AdapterDeployer
    from agenttune_lib.models.tiny import build_tiny_model, save_tiny_model
    from agenttune_lib.rl.lineage import record_adapter

    audit = tmp_path / "audit.jsonl"
    _runs(audit, kyc_stage_replies(doc_check=_docs_rule), [kyc_applicant(i) for i in range(4)], tmp_path / "r")
    poisoned = [{**kyc_applicant(100 + i, loop=True), "source": "public-web-form", "trusted": False} for i in range(4)]
    _runs(audit, kyc_stage_replies(doc_check=_prose), poisoned, tmp_path / "r")
    runs = [json.loads(x) for x in audit.read_text().splitlines() if '"record_type":"run"' in x]
    assert [r["trusted"] for r in runs] == [True] * 4 + [False] * 4

    wh = Warehouse(tmp_path / "wh.duckdb")
    base = save_tiny_model(tmp_path / "base")
    resources = {"warehouse": WarehouseResource(path=wh.path),
                 "closed_loop": ClosedLoopResource(audit_paths=[str(audit)], gate_holdout_size=2, gate_require_trajectory_arm=False),
                 "serving": ServingResource(deploy_root=str(tmp_path / "dep"), base_checkpoint=str(base))}
    assert dg.materialize([failure_buffer], resources=resources).success
    buffer = TrainingBuffer(wh)
    # corrections regenerated by the served (tiny) model: accepted or not, each example carries its input's provenance
    assert len(buffer.examples()) == 4
    assert all(not e.trusted and e.source == "public-web-form" and e.metadata["origin"].startswith("regenerated:") for e in buffer.examples())
    batch = buffer.drain(trigger="T5")
    model, _ = build_tiny_model()
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "cand")
    record_adapter(wh, "cand-1", str(tmp_path / "cand"), str(base), "dpo", [e.trajectory_id for e in batch.accepted], run_id="train")
    res = dg.materialize([gate_decision, deployed_adapter], resources=resources, tags={"agenttune/retrain_batch": batch.batch_id})
    assert res.success
    meta = res.asset_materializations_for_node("gate_decision")[0].metadata
    assert meta["approved"].value is False
    prov = meta["provenance_arm"].value
    assert not prov["passed"] and len(prov["untrusted_examples"]) == 4 and "untrusted" in prov["reason"]
    assert meta["held_out_cases"].value == 2  # the fixed-size held-out sample
    assert AdapterDeployer(tmp_path / "dep").current() is None
    (row,) = [b for b in buffer.batches() if b["batch_id"] == batch.batch_id]
    assert row["status"] == "refused"
    stored = wh.execute("SELECT approved, arms FROM gate_decisions")
    assert stored[0][0] is False and "provenance" in json.loads(stored[0][1])


def _risk(level):
    """Stage replies under the document rule with a fixed risk level (``high`` routes to the template's human review)."""
    from agenttune_lib.decide import ScriptedModel

    scripted = kyc_stage_replies(doc_check=_docs_rule)

    def reply(request):
        if request.stage_id == "risk":
            return json.dumps({"risk_level": level, "confidence": 0.8, "reason": f"{level} risk profile"})
        return scripted.generate(request)

    return ScriptedModel(reply)


def test_a_replay_that_reaches_human_review_is_scored_by_its_route_not_as_an_error(tmp_path):
    # Production: a high-risk applicant parked at review, then approved by an officer (the recorded run went through review).
    audit = tmp_path / "audit.jsonl"
    runner = GraphRunner.from_template(TEMPLATE, model=_risk("high"), audit=audit, review_dir=tmp_path / "r", destinations=[])
    parked = runner.run(kyc_applicant(7))
    assert parked.status == "suspended"
    wait = runner.waiting_review(parked.run_id)
    done = runner.resume(parked.run_id, {"review_id": wait["review_id"], "decision": "approved", "reviewer": "officer-1"})
    assert done.status == "completed" and done.verdict["label"] == "approve"
    (case,) = gate_replay_cases([audit], [], holdout_size=5)
    assert case.kind == "holdout" and case.expected_review == "review" and case.expected_label == "approve"

    routed, skipped = replay_cases(_risk("high"), [case]) + replay_cases(_risk("low"), [case])
    # The replay cannot wait for the officer: parking at the same review is the right outcome, not an error.
    assert routed["routed_to_review"] == "review" and routed["status"] == "suspended"
    assert routed["error"] is False and routed["verdict_correct"] is True and routed["passed"] is True
    # Approving without the officer the recorded run needed is a different route: wrong, though the label matches.
    assert skipped["routed_to_review"] is None and skipped["label"] == "approve"
    assert skipped["verdict_correct"] is False and skipped["passed"] is False
    assert replay_summary([routed], "holdout")["error_rate"] == 0.0


def _always_complete(request):
    return DOCS_COMPLETE


def test_held_out_verdicts_are_scored_against_the_inputs_expected_label_not_the_recorded_run(tmp_path):
    """The recorded model calls a passport-only file complete; the author's answer is request_documents. A candidate
    that corrects it is right and one that repeats the recorded mistake is wrong; without an expected label the
    recorded verdict stays the reference."""
    audit = tmp_path / "audit.jsonl"
    runner = GraphRunner.from_template(TEMPLATE, model=kyc_stage_replies(doc_check=_always_complete), audit=audit,
                                       review_dir=tmp_path / "r", destinations=[])
    labelled = runner.run(kyc_applicant(1, documents=("passport",)), expected_label="request_documents")
    unlabelled = runner.run(kyc_applicant(2, documents=("passport",)))
    assert labelled.verdict["label"] == unlabelled.verdict["label"] == "approve"  # the recorded model's mistake
    run_lines = [json.loads(line) for line in audit.read_text().splitlines() if '"record_type": "run"' in line or '"record_type":"run"' in line]
    assert [line.get("expected_label") for line in run_lines] == [["request_documents"], None]
    assert all("request_documents" not in json.dumps(line) for line in map(json.loads, audit.read_text().splitlines())
               if line.get("record_type") == "stage")  # no stage saw the answer

    cases = {c.trajectory_id: c for c in gate_replay_cases([audit], [], holdout_size=5)}
    case, plain = cases[labelled.run_id], cases[unlabelled.run_id]
    assert case.accepted_labels == ("request_documents",) and plain.accepted_labels is None
    (fixed,) = replay_cases(kyc_stage_replies(doc_check=_docs_rule), [case])
    (repeated,) = replay_cases(kyc_stage_replies(doc_check=_always_complete), [case])
    assert fixed["label"] == "request_documents" and fixed["verdict_correct"] is True
    assert repeated["label"] == "approve" and repeated["verdict_correct"] is False
    (plain_fixed,) = replay_cases(kyc_stage_replies(doc_check=_docs_rule), [plain])
    assert plain_fixed["verdict_correct"] is False  # no author's answer: agreement with the recorded run


def test_a_bad_expected_label_is_refused_with_the_input_named(tmp_path):
    from agenttune_lib.decide.errors import DecideError

    runner = GraphRunner.from_template(TEMPLATE, model=kyc_stage_replies(doc_check=_docs_rule), audit=tmp_path / "a.jsonl",
                                       review_dir=tmp_path / "r", destinations=[])
    with pytest.raises(DecideError, match="expected_label must be a verdict label or a non-empty list"):
        runner.run(kyc_applicant(1), expected_label=[])
    assert not (tmp_path / "a.jsonl").exists() or "A-2001" not in (tmp_path / "a.jsonl").read_text()


def test_the_held_out_sample_depends_on_inputs_not_on_trajectory_ids():
    """Two fresh homes run the same DECIDE inputs under new random trajectory ids: the held-out cases, their order and
    the paired bootstrap interval of the DECIDE guard must come out the same."""
    import uuid

    from agenttune_lib.closed_loop.gate import decide_verdict_row
    from agenttune_lib.closed_loop.replay import holdout_cases
    from agenttune_lib.closed_loop.types import Run

    inputs = [f"applicant {i}" for i in range(12)]

    def home():
        return [Run(uuid.uuid4().hex, [], input=text, output={"label": "approve"}, template="bfsi/kyc_triage", succeeded=True)
                for text in inputs]

    first, second = holdout_cases(home(), [], [], 8), holdout_cases(home(), [], [], 8)
    assert [c.input for c in first] == [c.input for c in second] and len(first) == 8
    assert len({c.input for c in first}) == 8
    correct = {text: i % 3 != 0 for i, text in enumerate(inputs)}  # the candidate loses a third of the verdicts

    def row(cases):
        old = [{"kind": "holdout", "verdict_correct": True} for _ in cases]
        new = [{"kind": "holdout", "verdict_correct": correct[c.input]} for c in cases]
        return decide_verdict_row(old, new)

    assert row(first) == row(second)


def test_the_default_profile_replays_enough_held_out_verdicts_that_one_flip_stays_within_the_guard():
    """The default run's DECIDE guard: every labelled input of its templates reaches the held-out sample, and one
    verdict the candidate loses among the ~85 % of them that succeed keeps the paired bound within the margin,
    where 17 held-out verdicts (the 22 inputs before) put it past the margin."""
    from agenttune_assets.defs.resources import ClosedLoopResource
    from agenttune_assets.profiles import PROFILES
    from agenttune_lib.closed_loop.criteria import DEFAULT_GUARDS, lower_bound
    from agenttune_lib.closed_loop.gate import decide_verdict_row
    from agenttune_lib.decide.registry import TemplateRegistry

    default = PROFILES["default"]
    limit = default["ops"]["decide_runs"]["config"]["limit"]
    templates = TemplateRegistry()
    per_template = [len(templates.get(t).labelled_examples) for t in default["partitions"]["decide_runs"]]
    assert all(n <= limit for n in per_template), "decide_runs' limit would leave labelled inputs unrun"
    n_inputs = sum(per_template)
    assert n_inputs >= 44 and ClosedLoopResource().gate_holdout_size >= n_inputs  # the sample cuts none of them
    margin = next(c.margin for c in DEFAULT_GUARDS if (c.suite, c.metric) == ("decide", "verdict_accuracy"))

    def one_flip(n):
        old = [{"kind": "holdout", "verdict_correct": True} for _ in range(n)]
        new = [{"kind": "holdout", "verdict_correct": i != n // 2} for i in range(n)]
        return lower_bound(decide_verdict_row(old, new))

    assert one_flip(int(0.85 * n_inputs)) >= -margin
    assert one_flip(17) < -margin
