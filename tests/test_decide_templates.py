"""All 24 bundled templates: they load, branch, carry the intended-use header, and run to a verdict."""
import collections
import json

import pytest

from _decide_helpers import schema_model
from agenttune_lib.decide import STAGE_TYPES, GraphRunner, TemplateRegistry, verify_audit
from agenttune_lib.events import EventKind, EventLog

# Audit keys, head checkpoints and artifacts go to a per-test $AGENTTUNE_HOME.
pytestmark = pytest.mark.usefixtures("platform_home")

REGISTRY = TemplateRegistry()
IDS = REGISTRY.ids()


def test_registry_has_24_templates_in_three_families():
    assert len(IDS) == 24
    families = collections.Counter(i.split("/")[0] for i in IDS)
    assert families == {"bfsi": 12, "generic": 10, "custom": 2}
    names = {i.split("/")[1] for i in IDS}
    for required in ("kyc_triage", "fraud_detection", "loan_approval", "sanctions_check", "card_decline", "claims_triage",
                     "account_opening", "customer_risk_rating", "loan_prequalification", "regulatory_filing",
                     "trade_finance_review", "transaction_monitoring", "classification", "sentiment", "summarization",
                     "entity_extraction", "multi_judge_scoring", "qa", "anomaly_flag", "iterative_refinement",
                     "document_classification", "synthetic_data_generation"):
        assert required in names


def test_bare_names_resolve_and_tricks_are_rejected():
    assert REGISTRY.resolve_id("kyc_triage") == "bfsi/kyc_triage"
    assert "kyc_triage" in REGISTRY and "nope" not in REGISTRY


@pytest.mark.parametrize("template_id", IDS)
def test_template_header_branching_and_disclaimer(template_id):
    cfg = REGISTRY.get(template_id)
    text = cfg.path.read_text().lower()
    assert text.startswith("#") and "plausible" in text
    if template_id.startswith("bfsi/"):
        assert "not regulator-approved" in text
    types = [s["type"] for s in cfg.stages]
    assert "rules" in types or "router" in types, "every template branches with rules or a router"
    assert sum(1 for s in cfg.stages if s["type"] == "output") >= 2, "more than one possible outcome"
    assert len({e["source"] for e in cfg.edges if len(cfg.targets(e["source"])) > 1}) >= 1
    assert cfg.description and cfg.examples


def test_all_eight_stage_types_are_used_across_templates():
    used = set()
    for ident in IDS:
        for stage in REGISTRY.get(ident).stages:
            used.add(stage["type"])
            used.update(b["type"] for b in stage.get("branches", []))
    assert used == set(STAGE_TYPES)


@pytest.mark.parametrize("template_id", IDS)
def test_every_template_compiles_and_runs_to_a_verdict(template_id, tmp_path):
    runner = GraphRunner.from_template(
        template_id, model=schema_model(), audit=tmp_path / "audit.jsonl", review_dir=tmp_path, human_review_timeout=0.0,
        destinations=[],
    )
    graph = runner.compile()
    assert set(runner.config.stage_map) <= set(graph.get_graph().nodes)
    for example in runner.config.examples:
        state = runner.run(example)
        assert state.status == "completed", state.error
        assert state.verdict["label"] and 0.0 <= state.verdict["confidence"] <= 1.0
        log = EventLog.from_pipeline_state(state)
        assert log.events[-1].kind is EventKind.TURN_COMPLETE
        assert json.loads(log.to_json())["metadata"]["template_id"] == runner.config.id
    check = verify_audit(tmp_path / "audit.jsonl")
    assert check.ok, check.problems
    runs = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert sum(r["record_type"] == "run" for r in runs) == len(runner.config.examples)


def test_custom_template_extends_and_overrides_by_stage_id():
    base = REGISTRY.get("bfsi/kyc_triage")
    strict = REGISTRY.get("custom/kyc_triage_strict")
    assert strict.chain == ["_base/bfsi", "bfsi/kyc_triage", "custom/kyc_triage_strict"]
    assert [s["id"] for s in strict.stages] == [s["id"] for s in base.stages]
    assert strict.stage_map["risk_router"]["on_result"]["medium"] == "review"
    assert base.stage_map["risk_router"]["on_result"]["medium"] == "approve_out"
    assert strict.stage_map["sanctions"]["args"]["threshold"] == 0.75
    assert strict.stage_map["sanctions"]["args"]["candidates"] == base.stage_map["sanctions"]["args"]["candidates"]
    assert strict.settings["llm"]["retries"] == 1  # from _global.yaml
    assert "compliance analyst" in strict.settings["llm"]["system"]  # from _base/bfsi.yaml
