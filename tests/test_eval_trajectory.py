"""Trajectory metrics (Table 7) on hand-built logs with known answers."""
import pytest

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.evaluation.trajectory import JudgeRubric, TrajectoryEvaluator

SEARCH = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"], "additionalProperties": False}
CALC = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}


def call(name, **args):
    return Event(EventKind.TOOL_CALL, {"name": name, "arguments": args})


def result(name, content, error=None):
    payload = {"name": name, "content": content}
    if error:
        payload["error"] = error
    return Event(EventKind.TOOL_RESULT, payload)


def think(text):
    return Event(EventKind.REASONING, {"content": text})


def log(*events, plan=None):
    meta = {"task": "t"}
    if plan is not None:
        meta["plan"] = plan
    return EventLog(list(events), metadata=meta)


@pytest.fixture
def ev():
    return TrajectoryEvaluator({"search": SEARCH, "calculator": CALC})


def test_tac_counts_schema_valid_calls(ev):
    lg = log(call("search", query="a"), call("search", q="wrong"), call("calculator", expression="1+1"), call("unknown", x=1))
    assert ev.evaluate(lg)["TAC"] == pytest.approx(2 / 4)


def test_tac_edge_cases():
    assert TrajectoryEvaluator({"search": SEARCH}).evaluate(log(think("x")))["TAC"] is None  # no calls
    assert TrajectoryEvaluator().evaluate(log(call("search", query="a")))["TAC"] is None  # no schemas


def test_tac_accepts_openai_style_tool_specs():
    ev = TrajectoryEvaluator([{"type": "function", "function": {"name": "search", "parameters": SEARCH}}])
    assert ev.evaluate(log(call("search", query="a"), call("search", query=3)))["TAC"] == 0.5


def test_arr_duplicates_over_total(ev):
    lg = log(call("search", query="a"), call("search", query="a"), call("search", query="b"), call("search", query="a"))
    assert ev.evaluate(lg)["ARR"] == pytest.approx(2 / 4)
    assert ev.evaluate(log())["ARR"] == 0.0


def test_scsr_recovered_errors(ev):
    lg = log(
        call("search", query="a"), result("search", "", error="timeout"),
        call("search", query="a"), result("search", "ok"),
        call("calculator", expression="1/0"), result("calculator", "", error="div by zero"),
    )
    # search error recovered, trailing calculator error not
    assert ev.evaluate(lg)["SCSR"] == pytest.approx(0.5)
    assert ev.evaluate(log(call("search", query="a"), result("search", "ok")))["SCSR"] is None


def test_scsr_success_of_another_tool_is_not_recovery(ev):
    lg = log(call("search", query="a"), result("search", "", error="x"), call("calculator", expression="1"), result("calculator", "1"))
    assert ev.evaluate(lg)["SCSR"] == 0.0


def test_rad_character_proxy(ev):
    c = call("search", query="a")  # canonical 'search({"query":"a"})' = 21 chars
    lg = log(think("x" * 21), c)
    assert ev.evaluate(lg)["RAD"] == pytest.approx(0.5)
    assert ev.evaluate(log(c))["RAD"] == 0.0
    assert ev.evaluate(log())["RAD"] is None


def test_lcf_three_identical_consecutive_calls(ev):
    a = call("search", query="a")
    assert ev.evaluate(log(a, result("search", "r"), a, think("again"), a))["LCF"] == 1.0
    assert ev.evaluate(log(a, a, call("search", query="b"), a))["LCF"] == 0.0  # only two in a row
    assert ev.evaluate(log())["LCF"] == 0.0
    assert TrajectoryEvaluator(loop_min_run=2).evaluate(log(a, a))["LCF"] == 1.0


def test_pas_plan_adherence(ev):
    lg = log(call("search", query="a"), call("calculator", expression="1"), plan=["search", "search", "calculator", "answer"])
    assert ev.evaluate(lg)["PAS"] == pytest.approx(2 / 4)  # second 'search' and 'answer' missing
    assert ev.evaluate(log(call("search", query="a"), plan="search -> calculator"))["PAS"] == 0.5
    assert ev.evaluate(log(call("search", query="a"), plan=[{"tool": "search"}]))["PAS"] == 1.0
    assert ev.evaluate(log(call("search", query="a")))["PAS"] is None


def test_ter_unique_outputs(ev):
    lg = log(result("search", "r1"), result("search", "r1"), result("search", "r2"), result("search", "", error="e"))
    assert ev.evaluate(lg)["TER"] == pytest.approx(3 / 4)
    assert ev.evaluate(log(call("search", query="a")))["TER"] is None


def test_pmed_and_ase_against_golden(ev):
    agent = log(call("search", query="a"), call("search", query="a"), call("calculator", expression="2"))
    golden = log(call("search", query="a"), call("calculator", expression="1"))
    m = ev.evaluate(agent, golden=golden)
    assert m["PMED"] == pytest.approx(1 / 3)  # one insertion over length 3
    assert m["ASE"] == pytest.approx(1 / 3)  # only search(a) was a golden action
    same = ev.evaluate(golden, golden=golden)
    assert same["PMED"] == 0.0 and same["ASE"] == 1.0
    assert ev.evaluate(log(), golden=[])["ASE"] == 1.0
    assert ev.evaluate(log(), golden=["search"])["ASE"] == 0.0
    assert ev.evaluate(log(), golden=["search"])["PMED"] == 1.0
    assert "PMED" not in ev.evaluate(agent)


def test_works_on_to_eval_dict_and_batch_means(ev):
    a = log(call("search", query="a"), call("search", query="a"), call("search", query="a"))
    b = log(call("search", query="b"))
    batch = ev.evaluate_batch([a.to_eval_dict(), b])
    assert batch["n"] == 2
    assert batch["mean"]["LCF"] == 0.5
    assert batch["mean"]["ARR"] == pytest.approx((2 / 3 + 0) / 2)
    assert batch["mean"]["SCSR"] is None  # undefined everywhere


def test_judge_rubric_injected_and_strict():
    ev = TrajectoryEvaluator()
    replies = {"goal_completion": '{"score": 1, "reason": "done"}', "grounding": "0.5", "safety": 'ok {"score": 0.25}'}

    def judge(prompt):
        crit = prompt.split(".")[0].split(": ")[1]
        return replies[crit]

    out = ev.evaluate_batch([log(call("search", query="a"))], judge=judge)
    assert out["per_log"][0]["judge_goal_completion"] == 1.0
    assert out["mean"]["judge_grounding"] == 0.5 and out["mean"]["judge_safety"] == 0.25
    with pytest.raises(ValueError, match="goal_completion"):
        JudgeRubric().score(lambda p: "great job", log().to_eval_dict())
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        JudgeRubric().score(lambda p: "7", log().to_eval_dict())


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="EventLog"):
        TrajectoryEvaluator().evaluate(42)
    with pytest.raises(ValueError, match="tool_calls"):
        TrajectoryEvaluator().evaluate({"foo": 1})
