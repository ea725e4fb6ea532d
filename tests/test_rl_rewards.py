"""REWARD_REGISTRY, combine_rewards, LLMJudge and RuleGuardCombinator."""
from __future__ import annotations

import pytest

from agenttune_lib.rl.judge import JudgeError, LLMJudge, RuleGuardCombinator
from agenttune_lib.rl.rewards import REWARD_REGISTRY, RewardError, combine_rewards

CALL = '<tool_call>{"name": "calc", "arguments": {"expression": "2+2"}}</tool_call>'
AGENT = [
    {"role": "assistant", "content": CALL},
    {"role": "tool", "name": "calc", "content": "4"},
    {"role": "assistant", "content": "Answer: 4"},
]


def test_registry_has_the_26_named_functions():
    assert len(REWARD_REGISTRY) == 26
    for name in ("correctness_reward", "structure_reward", "query_reward", "reward_correct_answer", "reward_tool_used",
                 "reward_concise_answer", "hybrid_prm_reward", "distilled_judge_reward", "finqa_answer_correctness_reward"):
        assert name in REWARD_REGISTRY


def test_every_reward_returns_one_float_per_completion():
    comps = [CALL, "The answer is yes", AGENT]
    kwargs = dict(answer=["yes", "yes", "4"], placeholders=[["x"]] * 3, expected_tools=[["calc"]] * 3, judge=lambda t: [0.5] * len(t))
    for name, fn in REWARD_REGISTRY.items():
        out = fn(comps, **kwargs)
        assert len(out) == 3 and all(isinstance(x, float) for x in out), name


def test_table14_tiers_are_all_reachable():
    f = REWARD_REGISTRY["correctness_reward"]
    assert f(["Yes it is", "no", "maybe"], answer=["yes", "yes", "yes"]) == [0.6, -1.0, -0.5]
    g = REWARD_REGISTRY["reward_correct_answer"]
    assert g(["42", "42.3", "50"], answer=["42", "42", "42"]) == [1.5, 0.5, 0.0]
    assert REWARD_REGISTRY["reward_tool_used"]([AGENT, "x"]) == [1.0, 0.0]
    assert REWARD_REGISTRY["reward_concise_answer"](["short", "w " * 81]) == [0.3, 0.0]
    s = REWARD_REGISTRY["structure_reward"]
    assert s([AGENT]) == [pytest.approx(0.15)]
    assert s([CALL]) == [pytest.approx(-0.15)]


def test_structure_and_format_tell_wellformed_malformed_and_missing_calls_apart():
    bad = '<tool_call>{"name": "calc", "arguments": </tool_call>'
    for name in ("structure_reward", "format_reward"):
        good, broken, none = REWARD_REGISTRY[name]([AGENT if name == "structure_reward" else CALL, bad, "plain text"])
        assert len({good, broken, none}) == 3, name


def test_process_reward_does_not_penalize_a_successful_tool_call():
    prm = REWARD_REGISTRY["hybrid_prm_reward"]
    err = [{"role": "assistant", "content": CALL}, {"role": "tool", "content": "error: boom"}, {"role": "assistant", "content": "4"}]
    ok, failed = prm([AGENT, err])
    assert ok > 0 > failed


def test_distilled_judge_raises_instead_of_zeros():
    f = REWARD_REGISTRY["distilled_judge_reward"]
    with pytest.raises(RewardError):
        f(["x"])
    with pytest.raises(RewardError):
        f(["x"], judge=lambda texts: 1 / 0)


def test_combine_renormalizes_and_accepts_names():
    comb = combine_rewards(["reward_tool_used", lambda completions, **kw: [1.0] * len(completions)], weights=[2, 2])
    assert comb([AGENT, "x"]) == [pytest.approx(1.0), pytest.approx(0.5)]
    assert comb.weights == {"reward_tool_used": 0.5, "<lambda>": 0.5}


def test_combine_raises_naming_the_reward_and_item():
    def broken(*args, **kwargs):
        raise RuntimeError("dead")

    with pytest.raises(RewardError, match="'broken' raised on item 0"):
        combine_rewards([broken])(["x"])
    with pytest.raises(RewardError, match="answer"):
        combine_rewards(["correctness_reward"])(["yes"])
    with pytest.raises(KeyError, match="unknown reward"):
        combine_rewards(["nope"])


def test_judge_absolute_relative_cache_and_rotation():
    prompts_seen = []

    def model(prompt: str) -> str:
        prompts_seen.append(prompt)
        return "RANKING: 2 > 1 > 3" if "RANKING" in prompt else "SCORE: 7"

    judge = LLMJudge(model, seed=1)
    assert judge.evaluate("task", "answer") == pytest.approx(0.7)
    assert judge.evaluate("task", "answer") == pytest.approx(0.7)
    assert judge.calls == 1  # cached
    scores = judge.evaluate_batch("task", ["a", "b", "c"], mode="relative")
    assert scores == [0.5, 1.0, 0.0]
    for i in range(12):
        judge.evaluate("task", f"other {i}")
    assert len({p.split("\n")[0] for p in prompts_seen}) > 1  # prompt rotation


def test_judge_failure_raises_and_over_retrieval_clamps():
    with pytest.raises(JudgeError):
        LLMJudge(lambda p: "no idea").evaluate("t", "a")
    with pytest.raises(JudgeError):
        LLMJudge(lambda p: "RANKING: 1 > 1").evaluate_batch("t", ["a", "b"], mode="relative")
    many = [{"role": "assistant", "content": CALL * 4}]
    assert LLMJudge(lambda p: "SCORE: 9", max_retrievals=2, over_retrieval_cap=0.3).evaluate("t", many) == pytest.approx(0.3)


def test_rule_guard_clamps_ungrounded_answers():
    guard = RuleGuardCombinator(lambda completions, **kw: [0.9] * len(completions))
    grounded = [{"role": "tool", "content": "termination requires thirty days notice"}, {"role": "assistant", "content": "Thirty days notice."}]
    ungrounded = [{"role": "tool", "content": "termination requires thirty days notice"}, {"role": "assistant", "content": "Bananas."}]
    assert guard([grounded, ungrounded]) == [0.9, 0.2]


def test_judge_reuses_a_loaded_engine(tiny_model):
    from agenttune_lib.rl.rollout import RolloutConfig, TransformersRolloutEngine

    model, tok = tiny_model
    judge = LLMJudge.from_engine(TransformersRolloutEngine(model, tok, RolloutConfig(max_new_tokens=4)))
    with pytest.raises(JudgeError, match="SCORE"):  # a random tiny model does not answer in the judge's format
        judge.evaluate("t", "a")
    assert judge.calls == 1
