"""Collection: runs become EventLogs in the warehouse with provenance; DPO pairs and BCO labels come from real audit logs."""
import json

from _decide_helpers import schema_model
from agenttune_lib.decide import AuditReader, CollectRunner, DecideToTrainerBridge, GraphRunner, ScriptedModel, TemplateRegistry
from agenttune_lib.events import EventKind
from agenttune_lib.warehouse import Provenance, Warehouse
import pytest

# Audit keys, head checkpoints and artifacts go to a per-test $AGENTTUNE_HOME.
pytestmark = pytest.mark.usefixtures("platform_home")


def test_collect_runner_writes_eventlogs_with_provenance(tmp_path):
    wh = Warehouse(tmp_path / "wh.duckdb")
    runner = GraphRunner.from_template("bfsi/fraud_detection", model=schema_model(), audit=tmp_path / "audit.jsonl", destinations=[])
    rows = TemplateRegistry().get("bfsi/fraud_detection").examples
    prov = Provenance(run_id="dagster-run-1", asset_key="decide_runs", partition="bfsi/fraud_detection", model_version="scripted")
    result = CollectRunner(runner, warehouse=wh, provenance=prov).collect(rows)
    assert result.written == len(rows) and sum(result.verdict_counts.values()) == len(rows)
    logs = wh.read_logs(run_id="dagster-run-1")
    assert sorted(l.id for l in logs) == sorted(s.run_id for s in result.states)
    log = wh.get_log(result.states[0].run_id)
    kinds = [e.kind for e in log.events]
    assert kinds[0] is EventKind.OBSERVATION and EventKind.TOOL_CALL in kinds and kinds[-1] is EventKind.TURN_COMPLETE
    assert log.metadata["template_id"] == "bfsi/fraud_detection"
    traj = wh.execute("SELECT source, partition, model_version FROM trajectories WHERE id = ?", [log.id])[0]
    assert traj == ("decide", "bfsi/fraud_detection", "scripted")
    for value in ("Ann Smith", "4111-0000"):
        assert value not in log.to_json()
    assert result.sample_trace()["path"][0] == "hard_rules"


def _extract_script(good: bool):
    """kyc_triage replies: the extract stage fails validation once, then answers; risk is high (review) when not good."""
    def reply(request):
        if request.stage_id == "extract":
            if request.attempt == 1:
                return "The applicant seems fine."
            return json.dumps({"age": 40, "nationality": "ES", "source_of_funds_stated": True, "income_band": "medium"})
        if request.stage_id == "risk":
            return json.dumps({"risk_level": "low" if good else "high", "confidence": 0.8, "reason": "r"})
        return schema_model().generate(request)

    return reply


def test_dpo_pairs_and_bco_labels_from_a_real_audit_log(tmp_path):
    path = tmp_path / "audit.jsonl"
    example = TemplateRegistry().get("kyc_triage").examples[0]
    good = GraphRunner.from_template("kyc_triage", model=_extract_script(True), audit=path, review_dir=tmp_path, human_review_timeout=0.0)
    bad = GraphRunner.from_template("kyc_triage", model=_extract_script(False), audit=path, review_dir=tmp_path, human_review_timeout=0.0)
    good_state, bad_state = good.run(example), bad.run(example)
    assert good_state.verdict["label"] == "approve" and bad_state.verdict["label"] == "decline"
    reader = AuditReader(path)
    pairs = reader.extract_dpo_pairs()
    retry = [p for p in pairs if p["source"] == "retry"]
    assert len(retry) == 2 and all(p["rejected"] == "The applicant seems fine." and p["stage_id"] == "extract" for p in retry)
    assert all('"income_band": "medium"' in p["chosen"] and "Extract the KYC facts" in p["prompt"] for p in retry)
    cross = [p for p in pairs if p["source"] == "cross_run"]
    assert cross and all(p["chosen_run_id"] == good_state.run_id and p["rejected_run_id"] == bad_state.run_id for p in cross)
    assert {p["stage_id"] for p in cross} == {"risk"}
    assert '"low"' in cross[0]["chosen"] and '"high"' in cross[0]["rejected"]
    labels = reader.extract_bco_labels()
    by_run = {}
    for row in labels:
        by_run.setdefault(row["run_id"], []).append(row)
    assert any(r["label"] for r in by_run[good_state.run_id])
    assert not any(r["label"] for r in by_run[bad_state.run_id])
    assert [r["label"] for r in by_run[good_state.run_id] if r["stage_id"] == "extract"] == [False, True]
    for row in labels + pairs:
        assert "Maria Lopez" not in json.dumps(row)
    bridge = DecideToTrainerBridge(path)
    assert bridge.dataset_rows("dpo") == [{"prompt": p["prompt"], "chosen": p["chosen"], "rejected": p["rejected"]} for p in pairs]
    assert {tuple(sorted(r)) for r in bridge.dataset_rows("bco")} == {("completion", "label", "prompt")}
    curated = DecideToTrainerBridge(path, curate=lambda r: r.get("run_id") != bad_state.run_id)
    assert all(p["rejected_run_id"] != bad_state.run_id for p in curated.extract_dpo_pairs())


def test_extraction_from_an_empty_or_all_good_log(tmp_path):
    path = tmp_path / "audit.jsonl"
    GraphRunner.from_template("generic/sentiment", model=schema_model(), audit=path, destinations=[]).run({"text": "good"})
    reader = AuditReader(path)
    assert reader.extract_dpo_pairs() == []
    assert [r["label"] for r in reader.extract_bco_labels()] == [True]


def test_scripted_model_lists_advance_per_stage():
    model = ScriptedModel({"a": ["one", "two"], "b": "fixed"})
    from agenttune_lib.decide import ModelRequest

    got = [model.generate(ModelRequest(prompt="", stage_id=s)) for s in ("a", "a", "a", "b")]
    assert got == ["one", "two", "two", "fixed"]
