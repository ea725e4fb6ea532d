"""The listed fixes: static reference check, fail-closed sanctions screening, the kyc age gate, JSON rule semantics,
killed hung tools, U+2028 in JSONL, non-zero exits with a durable outbox, and partition replacement."""
from __future__ import annotations

import json
import os
import time

import pytest

from _decide_helpers import schema_model
from agenttune_lib.decide import ConfigLoader, GraphRunner, TemplateRegistry, evaluate_rule, read_inputs
from agenttune_lib.decide.static import undefined_references

pytestmark = pytest.mark.usefixtures("platform_home")


# -- static reference check ----------------------------------------------------------------------------------------

def test_every_bundled_template_passes_the_reference_check():
    reg = TemplateRegistry()
    assert len(reg.ids()) == 24
    for ident in reg.ids():
        assert undefined_references(reg.get(ident)) == [], ident


BROKEN = """
stages:
  - id: screen
    type: tool_call
    tool: fuzzy_match
    args: {query: "{input.name}", candidates: ["A B"], threshold: 0.9}
    on_failed: review
    next: score
  - id: score
    type: llm_call
    prompt: "Score {input_text}"
    output_schema: {type: object, properties: {risk: {type: string}}, required: [risk]}
    next: review
  - id: review
    type: human_review
    summary: "similarity {screen.output.score}, risk {score.output.risk}"
    on_approved: ok_out
    on_denied: no_out
  - {id: ok_out, type: output, verdict: {label: ok, confidence: 1}}
  - {id: no_out, type: output, verdict: {label: "{ghost.output.x}", confidence: 1}}
"""


def test_reference_check_finds_a_path_without_the_output(tmp_path):
    (tmp_path / "broken.yaml").write_text(BROKEN)
    problems = undefined_references(ConfigLoader(tmp_path).load("broken"))
    # screen's on_failed edge reaches review without screen.output (and without score.output)
    assert any("'review' reads {screen.output.score}" in p for p in problems), problems
    assert any("'review' reads {score.output.risk}" in p for p in problems), problems
    assert any("no stage 'ghost'" in p for p in problems), problems
    from typer.testing import CliRunner

    from agenttune_lib.cli import app

    out = CliRunner().invoke(app, ["decide", "validate", "broken", "--templates-dir", str(tmp_path)])
    assert out.exit_code == 1 and "screen.output.score" in out.output
    fixed = BROKEN.replace("    on_failed: review\n", "    on_failed: no_out\n").replace("{ghost.output.x}", "no")
    (tmp_path / "fixed.yaml").write_text(fixed)
    assert undefined_references(ConfigLoader(tmp_path).load("fixed")) == []
    assert CliRunner().invoke(app, ["decide", "validate", "fixed", "--templates-dir", str(tmp_path)]).exit_code == 0


# -- templates -------------------------------------------------------------------------------------------------------

def test_sanctions_screening_down_fails_closed_to_block(tmp_path):
    def fuzzy_match(query: str, candidates: list, threshold: float = 0.9) -> dict:
        """The screening provider, down."""
        raise ConnectionError("screening service unreachable")

    runner = GraphRunner.from_template("sanctions_check", model=schema_model(), tools={"fuzzy_match": fuzzy_match},
                                       audit=None, review_dir=tmp_path, destinations=[])
    for example in runner.config.examples:
        state = runner.run(example)
        assert state.verdict["label"] == "block" and "screening tool unavailable" in state.verdict["reason"]
        assert "review" not in state.visits  # nobody could clear an unscreened counterparty


def test_kyc_age_gate_reads_the_applications_age(tmp_path):
    def runner(age_reply):
        return GraphRunner.from_template("kyc_triage", model=schema_model(overrides={"age": age_reply}), audit=None,
                                         review_dir=tmp_path, human_review_timeout=0.0, destinations=[])
    minor, adult = TemplateRegistry().get("kyc_triage").examples[1], TemplateRegistry().get("kyc_triage").examples[0]
    assert minor["age"] == 16 and adult["age"] == 37
    # the model misreads the age either way; the gate still follows the application
    assert runner(40).run(minor).verdict == {"label": "decline", "confidence": 1.0, "reason": "applicant is under 18"}
    assert runner(10).run(adult).verdict["label"] != "decline"
    no_age = {k: v for k, v in adult.items() if k != "age"}
    state = runner(40).run(no_age)
    assert state.verdict["label"] == "manual_processing"  # fails closed, not "adult by default"


def test_support_escalation_legal_review_decides(tmp_path):
    runner = GraphRunner.from_template("support_escalation", model=schema_model(), audit=None, review_dir=tmp_path / "r", destinations=[])
    legal = runner.config.examples[1]
    first = runner.run(legal, run_id="s-approve")
    assert first.status == "suspended"
    assert runner.resume("s-approve", {"decision": "approved", "reviewer": "legal-1"}).verdict["label"] == "legal_escalation"
    runner.run(legal, run_id="s-deny")
    denied = runner.resume("s-deny", {"decision": "denied", "reviewer": "legal-1"})
    assert denied.verdict["label"] in ("priority_queue", "standard_queue")  # back to the support queue
    runner.run(legal, run_id="s-timeout")
    assert runner.resume("s-timeout", {"decision": "timeout"}).verdict["label"] == "legal_escalation"  # fails closed


# -- rules ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "rule, expected",
    [("a.one == true", False), ("a.t == 1", False), ("a.zero == false", False), ("a.one != true", True),
     ("a.one == 1.0", True), ("a.t == true", True), ("a.l == [1, true]", True), ("a.l == [true, true]", False),
     ("a.o == {'k': 1}", True), ("a.o == {'k': true}", False), ("a.n == null", True), ("a.s == 'x'", True)],
)
def test_rules_compare_with_json_semantics(rule, expected):
    ns = {"a": {"one": 1, "zero": 0, "t": True, "l": [1, True], "o": {"k": 1}, "n": None, "s": "x"}}
    assert evaluate_rule(rule, ns) is expected


# -- tools ------------------------------------------------------------------------------------------------------------

HUNG = """
settings:
  tools: {isolation: process}
stages:
  - id: slow
    type: tool_call
    tool: hang
    args: {pid_file: "{input.pid_file}"}
    timeout_seconds: 0.5
    on_failed: down_out
    next: ok_out
  - {id: ok_out, type: output, verdict: {label: ok, confidence: 1}}
  - {id: down_out, type: output, verdict: {label: tool_down, confidence: 0}}
"""


def test_a_hung_tool_is_killed_not_left_running(tmp_path):
    def hang(pid_file: str) -> str:
        """Write our pid, then never return."""
        with open(pid_file, "w") as fh:
            fh.write(str(os.getpid()))
        while True:
            time.sleep(1)

    (tmp_path / "t.yaml").write_text(HUNG)
    runner = GraphRunner(ConfigLoader(tmp_path).load("t"), tools={"hang": hang}, audit=tmp_path / "audit.jsonl", review_dir=tmp_path)
    started = time.perf_counter()
    state = runner.run({"pid_file": str(tmp_path / "pid")})
    assert time.perf_counter() - started < 30
    assert state.verdict["label"] == "tool_down"
    assert state.step_history[0]["error"]["type"] == "timeout" and "killed" in state.step_history[0]["error"]["message"]
    pid = int((tmp_path / "pid").read_text())
    assert pid != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_tool_result_comes_back_from_its_process(tmp_path):
    body = HUNG.replace("tool: hang", "tool: echo").replace("timeout_seconds: 0.5", "timeout_seconds: 20")

    def echo(pid_file: str) -> dict:
        """Echo."""
        return {"got": pid_file, "pid": os.getpid()}

    (tmp_path / "t.yaml").write_text(body)
    state = GraphRunner(ConfigLoader(tmp_path).load("t"), tools={"echo": echo}, audit=None, review_dir=tmp_path).run({"pid_file": "x"})
    assert state.verdict["label"] == "ok" and state.stage_outputs["slow"]["got"] == "x"
    assert state.stage_outputs["slow"]["pid"] != os.getpid()


# -- inputs, exits, outbox, partitions ----------------------------------------------------------------------------------

def test_jsonl_with_u2028_in_a_string_reads(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [{"text": "line one\u2028still line one\u2029and\x1cthis"}, {"text": "second"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert read_inputs(path) == rows


def test_decide_run_exits_non_zero_on_failed_destination_and_the_outbox_delivers_later(tmp_path):
    from typer.testing import CliRunner

    from agenttune_lib.cli import app
    from agenttune_lib.decide.destinations import Outbox

    templates = tmp_path / "templates"
    templates.mkdir()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder should be")  # the file destination cannot write under it
    (templates / "t.yaml").write_text(f"""
stages:
  - id: out
    type: output
    verdict: {{label: done, confidence: 1}}
    destinations: [{{type: file, path: "{blocked}/decisions.jsonl"}}]
""")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"x": 1}\n')
    home = os.environ["AGENTTUNE_HOME"]
    args = ["decide", "run", "t", "--input", str(rows), "--templates-dir", str(templates), "--replies", str(tmp_path / "r.json"),
            "--audit", str(tmp_path / "logs" / "audit.jsonl")]
    (tmp_path / "r.json").write_text("{}")
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 1 and "destination file failed" in out.output
    outbox = Outbox(os.path.join(home, "artifacts", "decide", "outbox.jsonl"))
    assert len(outbox.entries()) == 1 and outbox.entries()[0]["record"]["label"] == "done"
    blocked.unlink()  # the destination comes back
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "1 earlier decision(s) delivered" in again.output
    assert outbox.entries() == []
    assert len((blocked / "decisions.jsonl").read_text().splitlines()) == 2  # the outboxed one and the new one


def test_decide_run_exits_non_zero_when_a_run_errors(tmp_path):
    from typer.testing import CliRunner

    from agenttune_lib.cli import app

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "hello"}\n')
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "c.yaml").write_text("""
stages:
  - id: classify
    type: llm_call
    prompt: "Classify {input_text}"
    output_schema: {type: object, properties: {label: {type: string}}, required: [label]}
    next: out
  - {id: out, type: output, verdict: {label: "{classify.output.label}", confidence: 1}}
""")
    (tmp_path / "r.json").write_text(json.dumps({"classify": "not json at all"}))
    out = CliRunner().invoke(app, ["decide", "run", "c", "--templates-dir", str(templates), "--input", str(rows),
                                   "--replies", str(tmp_path / "r.json"), "--audit", str(tmp_path / "logs" / "audit.jsonl")])
    assert out.exit_code == 1, out.output
    assert "ended in error" in out.output


def test_rematerializing_a_partition_replaces_its_eventlogs(tmp_path):
    import dagster as dg

    from agenttune_assets.defs.assets.decide import decide_runs
    from agenttune_assets.defs.resources import ArtifactsResource, DecideModelResource, ModelsResource, ServingResource, WarehouseResource
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.warehouse import Warehouse

    checkpoint = save_tiny_model(tmp_path / "tiny")
    home = tmp_path / "home"
    resources = {
        "warehouse": WarehouseResource(path=str(home / "warehouse.duckdb")), "models": ModelsResource(path=str(home / "models")),
        "artifacts": ArtifactsResource(path=str(home / "artifacts")),
        "decide_model": DecideModelResource(backend="transformers", checkpoint=str(checkpoint)),
        "serving": ServingResource(deploy_root=str(home / "deployed")),
    }
    for _ in range(2):
        result = dg.materialize([decide_runs], partition_key="bfsi/kyc_triage", resources=resources,
                                run_config={"ops": {"decide_runs": {"config": {"limit": 1}}}})
        assert result.success
    wh = Warehouse(home / "warehouse.duckdb")
    assert len(wh.read_logs(source="decide")) == 1
    assert result.asset_materializations_for_node("decide_runs")[0].metadata["eventlogs_replaced"].value == 1
    assert wh.execute("SELECT count(*) FROM events WHERE trajectory_id NOT IN (SELECT id FROM trajectories)")[0][0] == 0


# -- evaluation mode -------------------------------------------------------------------------------------------------

def test_evaluation_mode_blocks_below_threshold(tmp_path):
    from agenttune_lib.decide import DecideError
    from agenttune_lib.decide.evaluate import evaluate_template

    cfg = TemplateRegistry().get("kyc_triage")
    adult, minor = cfg.examples[:2]
    labelled = [{**adult, "expected_label": "approve"}, {**minor, "expected_label": "decline"}]
    good = GraphRunner(cfg, model=schema_model(by_stage={"risk": {"risk_level": "low", "confidence": 0.9, "reason": "r"}}),
                       audit=None, destinations=[], human_review_timeout=0.0, checkpointer=None, review_dir=tmp_path)
    result = evaluate_template(good, labelled)
    assert result.passed and result.accuracy == 1.0 and result.require() is result
    bad = GraphRunner(cfg, model=schema_model(by_stage={"risk": {"risk_level": "high", "confidence": 0.9, "reason": "r"}}),
                      audit=None, destinations=[], human_review_timeout=0.0, checkpointer=None, review_dir=tmp_path)
    blocked = evaluate_template(bad, labelled)
    assert blocked.accuracy == 0.5 and not blocked.passed and "min_accuracy" in blocked.failures[0]
    with pytest.raises(DecideError, match="blocks the next step"):
        blocked.require()
    assert evaluate_template(bad, labelled, thresholds={"min_accuracy": 0.5}).passed

    from typer.testing import CliRunner

    from agenttune_lib.cli import app

    rows = tmp_path / "labelled.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in labelled))
    (tmp_path / "r.json").write_text(json.dumps({
        "extract": {"age": 30, "nationality": "ES", "source_of_funds_stated": True, "income_band": "low"},
        "doc_check": {"documents_complete": True, "missing": []},
        "risk": {"risk_level": "high", "confidence": 0.9, "reason": "r"},
    }))
    out = CliRunner().invoke(app, ["decide", "evaluate", "kyc_triage", "--input", str(rows), "--replies", str(tmp_path / "r.json")])
    assert out.exit_code == 1 and "BLOCKED" in out.output
    ok = CliRunner().invoke(app, ["decide", "evaluate", "kyc_triage", "--input", str(rows), "--replies", str(tmp_path / "r.json"),
                                  "--min-accuracy", "0.5"])
    assert ok.exit_code == 0, ok.output


def test_template_examples_keep_their_expected_label_out_of_the_input(tmp_path):
    import shutil

    from agenttune_lib.decide.config import ConfigLoader, default_templates_dir
    from agenttune_lib.decide.errors import TemplateError

    kyc = TemplateRegistry().get("bfsi/kyc_triage")
    assert [e for _, e in kyc.labelled_examples][:6] == [("approve",), ("decline",), ("request_documents",), ("approve",),
                                                         ("approve",), ("request_documents",)]
    assert all("expected_label" not in row for row in kyc.examples) and kyc.examples[0]["applicant_id"] == "A-1001"

    root = tmp_path / "templates"
    shutil.copytree(default_templates_dir(), root)
    path = root / "bfsi" / "kyc_triage.yaml"
    text = path.read_text()
    path.write_text(text.replace("expected_label: decline}", "expected_label: declined}"))
    with pytest.raises(TemplateError, match=r"example 1: expected_label \['declined'\] is no verdict this template can give"):
        ConfigLoader(root).load("bfsi/kyc_triage")
    path.write_text(text.replace("expected_label: decline}", "expected_label: []}"))
    with pytest.raises(TemplateError, match="example 1: expected_label must be a verdict label or a non-empty list"):
        ConfigLoader(root).load("bfsi/kyc_triage")
