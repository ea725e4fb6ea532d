"""GraphRunner and ConfigLoader: bad input names template and stage, loops hit the step limit, review fails closed."""
import json
import threading
import time

import pytest

from _decide_helpers import schema_model
from agenttune_lib.decide import (
    AuditReader,
    ConfigLoader,
    GraphRunner,
    ModelRequest,
    ScriptedModel,
    TemplateError,
    TemplateRegistry,
    verify_audit,
)
from agenttune_lib.decide.config import validate_identifier
from agenttune_lib.decide.interpolate import InterpolationError, interpolate, interpolate_value
from agenttune_lib.decide.stages import extract_json

# Audit keys, head checkpoints and artifacts go to a per-test $AGENTTUNE_HOME.
pytestmark = pytest.mark.usefixtures("platform_home")

OK_SCHEMA = {"type": "object", "properties": {"decision": {"type": "string", "enum": ["yes", "no"]}}, "required": ["decision"]}


def write(tmp_path, name, text):
    path = tmp_path / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def loader(tmp_path):
    write(tmp_path, "_global", "settings:\n  max_steps: 12\n  llm: {retries: 1}\n")
    return ConfigLoader(tmp_path)


SIMPLE = """
stages:
  - id: ask
    type: llm_call
    prompt: "Decide: {input_text}"
    output_schema: {type: object, properties: {decision: {type: string, enum: ["yes", "no"]}}, required: [decision]}
    next: gate
  - id: gate
    type: rules
    rules:
      - {condition: "ask.output.decision == 'yes'", goto: no_out, inject: {label: "no", reason: "model said no"}}
    next: yes_out
  - id: yes_out
    type: output
    verdict: {label: "yes", confidence: 0.9}
  - id: no_out
    type: output
    verdict: {confidence: 0.4}
"""


# -- identifiers and loading ----------------------------------------------------------

@pytest.mark.parametrize("bad", ["../etc/passwd", "bfsi/../../x", "/etc/passwd", "~root/x", "a\\b", "bfsi//x", "", "C:/x", "a/./b", "x\x00y", ".hidden"])
def test_identifier_path_tricks_are_rejected(bad):
    with pytest.raises(TemplateError, match="rejected|non-empty"):
        validate_identifier(bad)
    with pytest.raises(TemplateError):
        TemplateRegistry().get(bad)


def test_extends_target_is_validated_and_loops_are_caught(tmp_path):
    ld = loader(tmp_path)
    write(tmp_path, "evil", "extends: ../../etc/passwd\n" + SIMPLE)
    with pytest.raises(TemplateError, match="'evil'.*extends target.*'\\.\\.'"):
        ld.load("evil")
    write(tmp_path, "a", "extends: b\n")
    write(tmp_path, "b", "extends: a\n")
    with pytest.raises(TemplateError, match="extends chain loops: a -> b -> a"):
        ld.load("a")


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    write(tmp_path, "broken", "stages:\n  - id: a\n    type: [llm_call\n    prompt: x\n")
    with pytest.raises(TemplateError) as info:
        loader(tmp_path).load("broken")
    msg = str(info.value)
    assert "template 'broken'" in msg and "line" in msg and "column" in msg


@pytest.mark.parametrize(
    "body,pattern",
    [
        ("stages:\n  - {id: a, type: teleport, next: b}\n  - {id: b, type: output}\n", r"stage 'a'.*unknown stage type 'teleport'"),
        ("stages:\n  - {id: a, type: rules, rules: [{condition: 'true', goto: b}], next: nowhere}\n  - {id: b, type: output}\n",
         r"stage 'a'.*next points at 'nowhere', which is no stage"),
        ("stages:\n  - {id: a, type: rules, rules: [{condition: 'true', goto: b}], next: b}\n"
         "  - {id: b, type: rules, rules: [{condition: 'true', goto: a}], next: a}\n  - {id: c, type: output}\n",
         r"unreachable|cycle with no exit"),
        ("entry: a\nstages:\n  - {id: z, type: output}\n  - {id: a, type: rules, rules: [{condition: 'true', goto: b}], next: b}\n"
         "  - {id: b, type: rules, rules: [{condition: 'true', goto: a}], next: a}\n",
         r"cycle with no exit \(a -> b -> a|b -> a -> b"),
        ("stages:\n  - {id: a, type: rules, rules: [{condition: \"open('/etc/passwd') == 1\", goto: b}], next: b}\n  - {id: b, type: output}\n",
         r"stage 'a'.*function calls are not allowed"),
        ("stages:\n  - {id: a, type: rules, rules: [{condition: 'input._secret == 1', goto: b}], next: b}\n  - {id: b, type: output}\n",
         r"stage 'a'.*private name '_secret'"),
        ("stages:\n  - {id: a, type: router, conditions: [{when: 'x.y()', result: r}], on_result: {r: b}}\n  - {id: b, type: output}\n",
         r"stage 'a'.*function calls"),
        ("stages:\n  - {id: a, type: human_review, on_approved: b}\n  - {id: b, type: output}\n", r"stage 'a'.*on_denied"),
        ("stages:\n  - {id: a, type: llm_call, prompt: p, output_schema: {type: 12}}\n  - {id: b, type: output}\n", r"stage 'a'.*not a valid JSON schema"),
        ("stages:\n  - {id: a, type: llm_call, prompt: p}\n", r"stage 'a'.*last stage must be an output"),
        ("stages: []\n", r"non-empty list"),
        ("stages:\n  - {id: input, type: output}\n", r"invalid id 'input'"),
        ("stages:\n  - {id: a, type: parallel, branches: [{id: r, type: rules, rules: ['true']}]}\n  - {id: b, type: output}\n",
         r"stage 'r'.*parallel branch"),
    ],
)
def test_bad_templates_fail_with_template_and_stage_named(tmp_path, body, pattern):
    write(tmp_path, "bad", body)
    with pytest.raises(TemplateError, match=pattern) as info:
        loader(tmp_path).load("bad")
    assert "template 'bad'" in str(info.value)


def test_global_config_merges_and_edges_are_generated(tmp_path):
    write(tmp_path, "simple", SIMPLE)
    cfg = loader(tmp_path).load("simple")
    assert cfg.max_steps == 12 and cfg.settings["llm"]["retries"] == 1
    assert {(e["source"], e["target"]) for e in cfg.edges} == {("ask", "gate"), ("gate", "no_out"), ("gate", "yes_out")}
    assert cfg.entry == "ask"


# -- running ------------------------------------------------------------------------------

def runner_for(tmp_path, body, model, **kw):
    write(tmp_path, "t", body)
    cfg = loader(tmp_path).load("t")
    kw.setdefault("audit", tmp_path / "audit.jsonl")
    kw.setdefault("review_dir", tmp_path / "reviews")
    return GraphRunner(cfg, model=model, **kw)


def test_llm_call_rules_inject_and_both_branches(tmp_path):
    yes = runner_for(tmp_path, SIMPLE, ScriptedModel({"ask": '{"decision": "yes"}'})).run("sell?")
    assert yes.verdict == {"label": "yes", "confidence": 0.9, "reason": None}
    assert [s["stage_id"] for s in yes.step_history] == ["ask", "gate", "yes_out"]
    no = runner_for(tmp_path, SIMPLE, ScriptedModel({"ask": 'Sure. {"decision": "no"} done'})).run("sell?")
    assert no.verdict == {"label": "no", "confidence": 0.4, "reason": "model said no"}
    assert no.stage_outputs["gate"]["failed_rule"] == "0"


def test_invalid_reply_is_retried_then_fails_the_stage_with_a_clear_error(tmp_path):
    model = ScriptedModel({"ask": ["not json at all", '{"decision": "maybe"}']})
    state = runner_for(tmp_path, SIMPLE, model).run("x")
    assert state.status == "error" and state.verdict["label"] == "error"
    assert "template 't', stage 'ask'" in state.error and "rejected after 2 attempt" in state.error
    assert "output_schema" in state.error
    assert len(model.calls) == 2 and "previous reply was rejected" in model.calls[1].prompt
    assert verify_audit(tmp_path / "audit.jsonl").ok
    stage = [r for r in AuditReader(tmp_path / "audit.jsonl").records() if r.get("stage_id") == "ask"][0]
    assert stage["status"] == "error" and [a["reply"] for a in stage["attempts"]] == ["not json at all", '{"decision": "maybe"}']
    run = AuditReader(tmp_path / "audit.jsonl").records()[-1]
    assert run["record_type"] == "run" and run["status"] == "error"


def test_retry_recovers_and_on_failed_routes(tmp_path):
    ok = runner_for(tmp_path, SIMPLE, ScriptedModel({"ask": ["oops", '{"decision": "yes"}']})).run("x")
    assert ok.status == "completed" and ok.verdict["label"] == "yes"
    body = SIMPLE.replace("    next: gate", "    next: gate\n    on_failed: yes_out")
    routed = runner_for(tmp_path, body, ScriptedModel({"ask": "never json"})).run("x")
    assert routed.status == "completed" and [s["stage_id"] for s in routed.step_history] == ["ask", "yes_out"]
    unlabelled = runner_for(tmp_path, body.replace("on_failed: yes_out", "on_failed: no_out"), ScriptedModel({"ask": "never json"})).run("x")
    assert unlabelled.status == "error" and "stage 'no_out'" in unlabelled.error and "without a verdict label" in unlabelled.error
    assert routed.step_history[0]["status"] == "error"


def test_model_backend_exception_is_a_stage_failure(tmp_path):
    def boom(request):
        raise ConnectionError("endpoint down")

    state = runner_for(tmp_path, SIMPLE, boom).run("x")
    assert state.status == "error" and "endpoint down" in state.error and "stage 'ask'" in state.error


def test_graphs_compile_without_a_model_and_a_missing_model_or_tool_fails_before_running(tmp_path):
    write(tmp_path, "t", SIMPLE)
    runner = GraphRunner(loader(tmp_path).load("t"), audit=tmp_path / "audit.jsonl")
    assert {"ask", "gate", "yes_out", "no_out"} <= set(runner.graph.get_graph().nodes)
    with pytest.raises(Exception, match="stage 'ask'.*needs model 'default'"):
        runner.run("x")
    assert not (tmp_path / "audit.jsonl").exists()
    write(tmp_path, "t2", "stages:\n  - {id: a, type: tool_call, tool: no_such_tool}\n  - {id: b, type: output, verdict: {label: x}}\n")
    with pytest.raises(Exception, match="stage 'a'.*tool 'no_such_tool' is not registered"):
        GraphRunner(loader(tmp_path).load("t2")).run("x")
    for ident in TemplateRegistry().ids():
        assert GraphRunner.from_template(ident).compile() is not None


TOOL_T = """
stages:
  - id: call
    type: tool_call
    tool: slow
    timeout_seconds: 0.2
    args: {x: "{input.n}", label: "n={input.n}"}
    on_failed: failed_out
    next: done_out
  - id: done_out
    type: output
    verdict: {label: "{call.output.y}", confidence: 1}
  - id: failed_out
    type: output
    verdict: {label: tool_failed, confidence: 0}
"""


def test_tool_call_interpolates_typed_args_and_times_out(tmp_path):
    calls = []

    def slow(x: int, label: str) -> dict:
        """Echo.

        Args:
            x: number.
            label: text.
        """
        calls.append((x, label))
        if x > 5:
            time.sleep(1.0)
        return {"y": x * 2}

    runner = runner_for(tmp_path, TOOL_T, None, tools={"slow": slow})
    fast = runner.run({"n": 3})
    assert calls[0] == (3, "n=3") and fast.verdict["label"] == "6"
    assert fast.step_history[0]["tool"] == "slow" and fast.step_history[0]["args"] == {"x": 3, "label": "n=3"}
    started = time.perf_counter()
    timed = runner.run({"n": 9})
    assert time.perf_counter() - started < 0.9
    step = timed.step_history[0]
    assert step["status"] == "error" and step["error"]["type"] == "timeout" and "timed out after 0.2s" in step["error"]["message"]
    assert step["error"]["stage"] == "call" and step["error"]["template"] == "t" and step["args"] == {"x": 9, "label": "n=9"}
    assert timed.verdict["label"] == "tool_failed"
    assert verify_audit(tmp_path / "audit.jsonl").ok


def test_tool_crash_is_a_structured_error_in_the_audit(tmp_path):
    def slow(x: int, label: str) -> dict:
        """Crash."""
        raise RuntimeError("database gone")

    runner_for(tmp_path, TOOL_T, None, tools={"slow": slow}).run({"n": 1})
    rec = [r for r in AuditReader(tmp_path / "audit.jsonl").records() if r.get("stage_id") == "call"][0]
    assert rec["status"] == "error" and rec["error"]["type"] == "exception" and "database gone" in rec["error"]["message"]


PARALLEL_T = """
stages:
  - id: fan
    type: parallel
    branches:
      - {id: left, type: tool_call, tool: nap, args: {who: left}}
      - {id: right, type: tool_call, tool: nap, args: {who: right}}
      - {id: think, type: llm_call, prompt: "hi {input_text}", output_schema: {type: object, properties: {decision: {type: string}}, required: [decision]}}
    next: merge
  - id: merge
    type: router
    conditions: [{when: "left.output.who == 'left' and right.output.who == 'right' and think.output.decision == 'yes'", result: both}]
    default: other
    on_result: {both: ok_out, other: bad_out}
  - {id: ok_out, type: output, verdict: {label: merged, confidence: 1}}
  - {id: bad_out, type: output, verdict: {label: not_merged, confidence: 0}}
"""


def test_parallel_branches_run_concurrently_and_merge_by_branch_id(tmp_path):
    spans = {}

    def nap(who: str) -> dict:
        """Sleep then echo."""
        start = time.perf_counter()
        time.sleep(0.4)
        spans[who] = (start, time.perf_counter())
        return {"who": who, "thread": threading.get_ident()}

    runner = runner_for(tmp_path, PARALLEL_T, ScriptedModel({"think": '{"decision": "yes"}'}), tools={"nap": nap})
    state = runner.run("x")
    assert state.verdict["label"] == "merged"
    # concurrent: each branch started before the other finished (timing-robust on a busy machine)
    (l0, l1), (r0, r1) = spans["left"], spans["right"]
    assert l0 < r1 and r0 < l1, f"branches ran sequentially: {spans}"
    assert state.stage_outputs["fan"]["left"]["who"] == "left"
    assert state.stage_outputs["left"]["thread"] != state.stage_outputs["right"]["thread"]
    assert [s["stage_id"] for s in state.step_history][:4] == ["left", "right", "think", "fan"]


def test_parallel_branch_failure_fails_the_stage(tmp_path):
    def nap(who: str) -> dict:
        """Fail on the right."""
        if who == "right":
            raise ValueError("right broke")
        return {"who": who}

    state = runner_for(tmp_path, PARALLEL_T, ScriptedModel({"think": '{"decision": "yes"}'}), tools={"nap": nap}).run("x")
    assert state.status == "error" and "stage 'fan'" in state.error and "right" in state.error
    assert {s["stage_id"]: s["status"] for s in state.step_history}["right"] == "error"


def test_llm_router_and_rules_router(tmp_path):
    body = """
stages:
  - id: pick
    type: router
    model: default
    prompt: "Route {input_text}"
    on_result: {alpha: a_out, beta: b_out}
    on_failed: err_out
  - {id: a_out, type: output, verdict: {label: A, confidence: 1}}
  - {id: b_out, type: output, verdict: {label: B, confidence: 1}}
  - {id: err_out, type: output, verdict: {label: E, confidence: 0}}
"""
    model = ScriptedModel(lambda r: '{"route": "Beta"}')
    assert runner_for(tmp_path, body, model).run("x").verdict["label"] == "B"
    assert model.calls[0].choices == ("alpha", "beta") and "alpha, beta" in model.calls[0].prompt
    assert runner_for(tmp_path, body, ScriptedModel(lambda r: "alpha.")).run("x").verdict["label"] == "A"
    assert runner_for(tmp_path, body, ScriptedModel(lambda r: "gamma")).run("x").verdict["label"] == "E"


def test_judge_scores_route_and_reach_the_step_history(tmp_path):
    body = """
stages:
  - {id: judge, type: llm_judge, prompt: "Rate {input_text}", threshold: 0.7, on_pass: good_out, on_fail: bad_out}
  - {id: good_out, type: output, verdict: {label: good, confidence: "{judge.output.score}"}}
  - {id: bad_out, type: output, verdict: {label: bad, confidence: "{judge.output.score}"}}
"""
    low = runner_for(tmp_path, body, ScriptedModel({"judge": '{"score": 0.2, "reason": "weak"}'})).run("x")
    assert low.verdict == {"label": "bad", "confidence": 0.2, "reason": None}
    assert low.step_history[0]["score"] == 0.2
    high = runner_for(tmp_path, body, ScriptedModel({"judge": '{"score": 0.9}'})).run("x")
    assert high.verdict["label"] == "good"
    assert runner_for(tmp_path, body, ScriptedModel({"judge": '{"score": 7}'})).run("x").status == "error"


# -- loops and the step limit ---------------------------------------------------------------

def test_kyc_document_loop_rechecks_resubmissions_then_requests_documents(tmp_path):
    """The loop re-checks only a resubmitted file, at most three checks, then ends in "request_documents"."""
    model = schema_model(by_stage={"doc_check": {"documents_complete": False, "missing": ["proof_of_address"]}})
    runner = GraphRunner.from_template("kyc_triage", model=model, audit=tmp_path / "audit.jsonl", review_dir=tmp_path, human_review_timeout=0.01)
    example = runner.config.examples[0]
    state = runner.run(example)
    assert state.status == "completed" and state.verdict["label"] == "request_documents"
    assert state.visits["doc_check"] == 3 and state.visits["request_docs"] == 3
    records = AuditReader(tmp_path / "audit.jsonl").records()
    visits = [r["visit"] for r in records if r.get("stage_id") == "doc_check"]
    assert visits == [1, 2, 3]
    no_resubmission = schema_model(by_stage={
        "doc_check": {"documents_complete": False, "missing": ["proof_of_address"]},
        "request_docs": {"request": "please send a utility bill", "resubmitted": False},
    })
    once = GraphRunner.from_template("kyc_triage", model=no_resubmission, audit=None, review_dir=tmp_path).run(example)
    assert once.verdict["label"] == "request_documents" and once.visits["doc_check"] == 1
    # the same input with a model that finds the documents complete does not loop
    assert GraphRunner.from_template("kyc_triage", model=schema_model(), audit=tmp_path / "a2.jsonl", review_dir=tmp_path,
                                     human_review_timeout=0.01).run(example).status == "completed"


def test_step_limit_override_and_recursion_guard(tmp_path):
    model = schema_model(by_stage={"doc_check": {"documents_complete": False, "missing": []}})
    state = GraphRunner.from_template("kyc_triage", model=model, max_steps=5, audit=None, review_dir=tmp_path).run(
        TemplateRegistry().get("kyc_triage").examples[0]
    )
    assert state.status == "step_limit" and state.steps == 5


# -- human review -------------------------------------------------------------------------------

REVIEW_T = """
stages:
  - id: review
    type: human_review
    summary: "Review case {input.case}"
    timeout_seconds: 5
    poll_seconds: 0.02
    on_approved: ok_out
    on_denied: denied_out
  - {id: ok_out, type: output, verdict: {label: approved, confidence: 1}}
  - {id: denied_out, type: output, verdict: {label: denied, confidence: 1}}
"""


def test_human_review_timeout_fails_closed(tmp_path):
    """A review that may not wait (timeout 0) is denied at once; ``on_failed`` takes precedence when set.
    Parking, resuming and deadlines are in tests/test_decide_review.py."""
    runner = runner_for(tmp_path, REVIEW_T, None, human_review_timeout=0.0)
    state = runner.run({"case": "C-1"})
    assert state.verdict["label"] == "denied"
    assert state.stage_outputs["review"]["decision"] == "timeout" and state.step_history[0]["status"] == "error"
    pending = json.loads(next((tmp_path / "reviews" / "pending_reviews").glob("*.json")).read_text())
    assert pending["status"] == "timeout" and pending["summary"] == "Review case C-1"
    with_failed = REVIEW_T.replace("    on_denied: denied_out", "    on_denied: denied_out\n    on_failed: failed_out") + (
        "  - {id: failed_out, type: output, verdict: {label: review_failed, confidence: 0}}\n"
    )
    runner2 = runner_for(tmp_path, with_failed, None, human_review_timeout=0.0)
    assert runner2.run({"case": "C-2"}).verdict["label"] == "review_failed"


# -- interpolation and parsing ----------------------------------------------------------------

def test_interpolation_rules():
    ns = {"input_text": "hello", "extract": {"output": {"age": 3, "tags": ["a"]}}}
    assert interpolate("{input_text} is {extract.output.age}; json {\"k\": 1} {{literal}}", ns) == 'hello is 3; json {"k": 1} {literal}'
    assert interpolate("{extract.output.tags}", ns) == '["a"]'
    assert interpolate_value({"n": "{extract.output.age}", "s": "n={extract.output.age}"}, ns) == {"n": 3, "s": "n=3"}
    with pytest.raises(InterpolationError, match="nope"):
        interpolate("{nope.output.x}", ns)


def test_unknown_reference_fails_the_stage_naming_it(tmp_path):
    body = SIMPLE.replace("Decide: {input_text}", "Decide: {ghost.output.x}")
    state = runner_for(tmp_path, body, ScriptedModel({"ask": '{"decision": "yes"}'})).run("x")
    assert state.status == "error" and "stage 'ask'" in state.error and "{ghost.output.x}" in state.error


def test_extract_json_variants():
    assert extract_json('```json\n{"a": 1}\n```') == {"a": 1}
    assert extract_json('Here: {"a": {"b": 2}} thanks') == {"a": {"b": 2}}
    with pytest.raises(ValueError, match="not JSON"):
        extract_json("no braces here")


def test_model_request_carries_schema_and_system(tmp_path):
    model = ScriptedModel({"ask": '{"decision": "yes"}'})
    runner_for(tmp_path, SIMPLE, model).run("x")
    req: ModelRequest = model.calls[0]
    assert req.output_schema == OK_SCHEMA and req.stage_id == "ask" and req.template_id == "t"
    assert '{"decision": <"yes" | "no">}' in req.prompt and req.messages()[-1]["role"] == "user"


def test_schema_shape_and_raw_schema_formats(tmp_path):
    from agenttune_lib.decide.stages.llm import schema_shape

    shape = schema_shape({"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 120}, "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}}, "score": {"type": "number", "minimum": 0}}})
    assert shape == '{"age": <integer 0-120>, "ok": <true or false>, "tags": [<string>, ...], "score": <number >= 0>}'
    model = ScriptedModel({"ask": '{"decision": "yes"}'})
    body = "settings: {llm: {schema_format: json_schema}}\n" + SIMPLE
    runner_for(tmp_path, body, model).run("x")
    assert '"enum": ["yes", "no"]' in model.calls[0].prompt


def test_a_plain_prompt_function_is_a_model(tmp_path):
    seen = []

    def fn(prompt):
        seen.append(prompt)
        return '{"decision": "yes"}' if "Decide:" in prompt else "?"

    state = runner_for(tmp_path, SIMPLE, fn).run(input_text="ship it?")
    assert state.verdict["label"] == "yes" and seen[0].startswith("Decide: ship it?") and seen[0].stage_id == "ask"
