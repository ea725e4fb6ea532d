"""Every template on its failure branches and, where it has a human review, on approve / deny / timeout."""
from __future__ import annotations

import json

import pytest

from _decide_helpers import schema_model, value_for
from agenttune_lib.decide import GraphRunner, ScriptedModel, TemplateRegistry, verify_audit

pytestmark = pytest.mark.usefixtures("platform_home")

REGISTRY = TemplateRegistry()
IDS = REGISTRY.ids()
REVIEW_IDS = [i for i in IDS if any(s["type"] == "human_review" for s in REGISTRY.get(i).stages)]


def flipped_model() -> ScriptedModel:
    """Valid replies from the opposite end of every schema (last enum, false, maximum): reaches other branches."""

    def pick(schema, name=""):
        if "enum" in schema:
            return schema["enum"][-1]
        kind = schema.get("type", "string")
        kind = kind[0] if isinstance(kind, list) else kind
        if kind == "object":
            return {k: pick(v, k) for k, v in (schema.get("properties") or {}).items()}
        if kind == "boolean":
            return False
        if kind in ("number", "integer"):
            hi = schema.get("maximum", 100)
            return hi if kind == "integer" else float(hi)
        return value_for(schema, name=name)

    def reply(request):
        if request.choices:
            return request.choices[-1]
        if request.output_schema:
            return json.dumps(pick(request.output_schema))
        return "ok"

    return ScriptedModel(reply)


def _runner(ident, tmp_path, model, **kw):
    kw.setdefault("audit", tmp_path / "audit.jsonl")
    return GraphRunner.from_template(ident, model=model, review_dir=tmp_path / "reviews", destinations=[], **kw)


@pytest.mark.parametrize("template_id", IDS)
def test_schema_failure_branch(template_id, tmp_path):
    """A model that never answers in the schema: every run still ends in a verdict through its failure routes."""
    runner = _runner(template_id, tmp_path, lambda request: "I am not able to answer in JSON.", human_review_timeout=0.0, max_retries=0)
    for example in runner.config.examples:
        state = runner.run(example)
        assert state.completed and state.verdict["label"], state.summary()
        model_stages = [s for s in state.step_history if s["stage_type"] in ("llm_call", "llm_judge") and not s.get("parent")]
        if model_stages:
            assert model_stages[0]["status"] == "error"
    assert verify_audit(tmp_path / "audit.jsonl").ok


@pytest.mark.parametrize("template_id", [i for i in IDS if any(s["type"] == "tool_call" or s.get("branches") for s in REGISTRY.get(i).stages)])
def test_tool_down_branch(template_id, tmp_path):
    """Every tool down: runs end in a verdict, the tool stage's failure is recorded, nothing crashes."""
    cfg = REGISTRY.get(template_id)
    names = {s["tool"] for stage in cfg.stages for s in [stage, *stage.get("branches", [])] if s.get("type") == "tool_call"}

    def down(**kwargs):
        """Any tool, down."""
        raise ConnectionError("service unavailable")

    runner = _runner(template_id, tmp_path, schema_model(), human_review_timeout=0.0, tools={n: down for n in names})
    reached = 0
    for example in runner.config.examples:
        state = runner.run(example)
        assert state.completed and state.verdict["label"], state.summary()
        reached += any(s["stage_type"] == "tool_call" and s["status"] == "error" for s in state.step_history)
        assert not any(s["stage_type"] == "tool_call" and s["status"] == "ok" for s in state.step_history)
    if not reached:
        pytest.skip(f"{template_id}: no bundled example reaches a tool stage with a schema-following model")


@pytest.mark.parametrize("template_id", REVIEW_IDS)
def test_review_approve_deny_and_timeout_branches(template_id, tmp_path):
    """Where a run reaches its human review: approval, denial and timeout are three decisions, and a timeout
    never approves (fails closed)."""
    parked = None
    for n, model in enumerate((schema_model(), flipped_model())):
        runner = _runner(template_id, tmp_path / f"probe-{n}", model, human_review_timeout=3600)
        for i, example in enumerate(runner.config.examples):
            if runner.run(example, run_id=f"probe-{i}").status == "suspended":
                parked = (n, model, example)
                break
        if parked:
            break
    if parked is None:
        pytest.skip(f"{template_id}: no bundled example reaches its review with a schema-following model")
    n, model, example = parked
    verdicts = {}
    for decision in ("approved", "denied", "timeout"):
        runner = _runner(template_id, tmp_path / f"decide-{decision}", model, human_review_timeout=3600)
        assert runner.run(example, run_id=f"r-{decision}").status == "suspended"
        answer = {"decision": decision} if decision == "timeout" else {"decision": decision, "reviewer": "officer-1"}
        state = runner.resume(f"r-{decision}", answer)
        assert state.completed, state.summary()
        verdicts[decision] = state.verdict["label"]
        review_out = [s for s in state.step_history if s["stage_type"] == "human_review"][-1]["output"]
        assert review_out["decision"] == decision
        assert verify_audit(tmp_path / f"decide-{decision}" / "audit.jsonl").ok
    assert verdicts["approved"] != verdicts["denied"], verdicts  # the review decides something
    review = next(s for s in REGISTRY.get(template_id).stages if s["type"] == "human_review")
    if "on_failed" not in review:
        assert verdicts["timeout"] == verdicts["denied"], verdicts  # no answer is a no (fails closed)
