"""Five strategies against DictToolHarness with scripted models; run_episode, run_reflexion, ToT search, preference pairs."""
from __future__ import annotations

from agenttune_lib.events import EventKind
from agenttune_lib.spine import (
    DictToolHarness,
    MemoryReActStrategy,
    PlanExecuteStrategy,
    ReActStrategy,
    ReflexionStrategy,
    TreeOfThoughtsStrategy,
    preference_pairs,
    run_episode,
    run_reflexion,
)
from agenttune_lib.spine.memory import InContextMemory, MemoryItem
from agenttune_lib.spine.preferences import reflexion_hindsight_pairs
from agenttune_lib.spine.record import rejected_logs
from _spine_helpers import TASK, ByRule, Scripted, add, call, mul




def harness(**kw):
    return DictToolHarness({"add": add, "mul": mul}, **kw)


def kinds(log):
    return [e.kind for e in log]


def test_react_episode_log_and_reward():
    model = Scripted([call("add", a=2, b=3), call("mul", a=5, b=4), "The answer is 20."])
    log = run_episode(ReActStrategy(model), harness(), TASK)
    assert kinds(log)[0] is EventKind.OBSERVATION
    results = [e.payload["content"] for e in log if e.kind is EventKind.TOOL_RESULT]
    assert results == ["5", "20"]
    assert log.rewards("episode") == [1.0]
    assert kinds(log)[-1] is EventKind.TURN_COMPLETE
    assert log.metadata["strategy"] == "react" and "<tools>" in log.metadata["system_prompt"]
    # the model saw the tool result in its next turn
    assert model.seen[1][-1] == {"role": "tool", "content": "5"}
    calls = [e.payload for e in log if e.kind is EventKind.TOOL_CALL]
    assert calls[0] == {"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_0"}


def test_malformed_call_and_unknown_tool_are_error_observations():
    model = Scripted(["<tool_call>{oops</tool_call>", call("divide", a=1, b=0), call("add", a="x", b=1), "20"])
    log = run_episode(ReActStrategy(model), harness(), TASK)
    errors = [e.payload["error"] for e in log if e.is_error]
    assert [err["type"] for err in errors] == ["parse_error", "unknown_tool", "invalid_arguments"]
    assert log.rewards("step") == [-1.0, -1.0, -1.0]
    assert log.rewards("episode") == [1.0]
    assert any(e.kind is EventKind.TEXT and e.payload.get("malformed_tool_call") for e in log)


def test_raising_tool_becomes_error_result():
    def boom(x: int) -> int:
        """Fails."""
        raise ZeroDivisionError("division by zero")

    log = run_episode(ReActStrategy(Scripted([call("boom", x=1), "no"])), DictToolHarness({"boom": boom}), "t")
    err = next(e for e in log if e.is_error).payload["error"]
    assert err["exception"] == "ZeroDivisionError"
    assert log.rewards("step") == [-1.0]


def test_max_steps_truncates():
    log = run_episode(ReActStrategy(Scripted([call("add", a=1, b=1)]), max_steps=3), harness(), TASK)
    assert len(log.filter(EventKind.TOOL_CALL)) == 3
    assert log[-1].kind is EventKind.TURN_COMPLETE and log[-1].payload["truncated"] is True
    assert log.rewards("episode") == [0.0]


def test_multiple_calls_in_one_reply_run_in_order_without_extra_model_calls():
    model = Scripted([call("add", a=2, b=3) + call("mul", a=5, b=4), "20"])
    log = run_episode(ReActStrategy(model), harness(), TASK)
    assert [e.payload["name"] for e in log.filter("tool_call")] == ["add", "mul"]
    assert len(model.seen) == 2


def test_plan_execute_plans_once_then_replays():
    model = Scripted([call("add", a=2, b=3) + "\n" + call("mul", a=5, b=4), "The result is 20."])
    log = run_episode(PlanExecuteStrategy(model), harness(), TASK)
    assert len(model.seen) == 2
    assert log.metadata["plan"] == ["add", "mul"]
    assert "complete plan" in model.seen[0][0]["content"]
    assert log.rewards("episode") == [1.0]


def test_reflexion_retries_with_critique_and_keeps_failed_attempts():
    def rule(messages):
        system = messages[0]["content"]
        if system.startswith("You review a failed attempt"):
            return "I answered without computing; use the tools first."
        if "Lessons from your earlier failed attempts" in system:
            last = messages[-1]
            if last["role"] == "user":
                return call("add", a=2, b=3)
            if last["content"] == "5":
                return call("mul", a=5, b=4)
            return "It is 20."
        return "It is 19."

    strategy = ReflexionStrategy(ByRule(rule), max_attempts=3)
    log = run_reflexion(strategy, harness(), TASK)
    info = log.metadata["reflexion"]
    assert (info["attempts"], info["succeeded"], info["critiques"]) == (2, True, ["I answered without computing; use the tools first."])
    assert info["critique_turns"][0]["text"] == "I answered without computing; use the tools first."
    assert len(log.metadata["rejected_attempts"]) == 1
    assert log.rewards("episode") == [1.0]
    # The failed attempt is its own log, generated without the critique written after it, linked to the episode.
    failed = rejected_logs(log)[0]
    assert failed.metadata["branch_of"] == log.id and failed.metadata["branch"]["kind"] == "reflexion"
    assert "Lessons from your earlier failed attempts" not in failed.metadata["system_prompt"]
    assert "Lessons from your earlier failed attempts" in log.metadata["system_prompt"]
    # The success was generated with the critique in its prompt: no same-context pair exists.
    assert preference_pairs(log) == []
    hindsight = reflexion_hindsight_pairs(log)
    assert len(hindsight) == 1 and hindsight[0]["same_context"] is False
    assert hindsight[0]["prompt"] == [{"role": "system", "content": failed.metadata["system_prompt"]}, {"role": "user", "content": TASK["prompt"]}]
    assert hindsight[0]["rejected"] == [{"role": "assistant", "content": "It is 19."}]
    # chosen is multi-turn with the tool results the successful attempt saw
    assert [m["role"] for m in hindsight[0]["chosen"]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert hindsight[0]["chosen"][3] == {"role": "tool", "content": "20"}


def test_reflexion_gives_up_after_max_attempts():
    strategy = ReflexionStrategy(Scripted(["wrong"]), max_attempts=2)
    log = run_reflexion(strategy, harness(), TASK)
    assert log.metadata["reflexion"]["attempts"] == 2 and not log.metadata["reflexion"]["succeeded"]
    assert preference_pairs(log) == []


def test_memory_react_recalls_and_stores_with_memory_ops():
    memory = InContextMemory()
    memory.add(MemoryItem("mul(a, b) multiplies; add first, then multiply."))
    model = Scripted([call("add", a=2, b=3), call("mul", a=5, b=4), "20"])
    log = run_episode(MemoryReActStrategy(model, memory, k=2), harness(), TASK)
    ops = [e.payload for e in log if e.kind is EventKind.MEMORY_OP]
    assert ops[0]["op"] == "recall" and "multiplies" in ops[0]["content"]
    assert [o["op"] for o in ops[1:]] == ["store", "store"]
    assert len(memory) == 3
    assert any("Relevant memory" in m["content"] for m in model.seen[0])
    # the next episode recalls what this one stored
    recalled = memory.recall("anything", k=1)
    assert recalled[0].content.startswith('mul({"a": 5, "b": 4}) -> 20')
    rows = log.to_eval_dict()["steps"]
    assert any(r["kind"] == "memory_op" for r in rows)


def test_tree_of_thoughts_greedy_picks_best_candidate_and_keeps_rejected():
    replies = iter([call("nope"), call("add", a=2, b=3), call("mul", a=5, b=4), call("mul", a=5, b=4), "20", "20"])
    model = lambda messages: next(replies)  # noqa: E731
    log = run_episode(TreeOfThoughtsStrategy(model, n_candidates=2), harness(), TASK)
    assert [e.payload["name"] for e in log.filter("tool_call")] == ["add", "mul"]
    rejected = log.metadata["rejected_branches"]
    assert rejected[0]["rejected"]["name"] == "nope" and rejected[0]["chosen"]["name"] == "add"
    pairs = preference_pairs(log)
    assert pairs and pairs[0]["source"] == "tree_of_thoughts" and '"nope"' in pairs[0]["rejected"][0]["content"]
    assert rejected_logs(log)[0].events[-1].payload["name"] == "nope"  # its own log: context + the rejected call
    assert pairs[0]["prompt"][-1]["role"] == "user"


def test_tree_of_thoughts_search_backtracks_over_snapshots():
    # Both first moves score the same and mul comes first; its path ends wrong, so search must back up.
    def rule(messages):
        last = messages[-1]
        if last["role"] == "user":
            return rule.first.pop(0) if rule.first else call("add", a=2, b=3)
        if last["content"] == "6":
            return "It is 6."
        if last["content"] == "5":
            return call("mul", a=5, b=4)
        if last["content"] == "20":
            return "It is 20."
        return "?"

    rule.first = [call("mul", a=2, b=3), call("add", a=2, b=3)]
    strategy = TreeOfThoughtsStrategy(ByRule(rule), n_candidates=2, max_steps=4)
    h = harness()
    log = strategy.search(h, TASK)
    assert log.rewards("episode") == [1.0]
    assert [e.payload["name"] for e in log.filter("tool_call")] == ["add", "mul"]
    backtracked = [b for b in log.metadata["rejected_branches"] if b["reason"] == "backtracked"]
    assert any(b["rejected"].get("name") == "mul" for b in backtracked)
    assert any(b["rejected"].get("text") == "It is 6." for b in backtracked)
    pairs = preference_pairs(log, conversational=False)
    assert any('"mul"' in p["rejected"] and '"add"' in p["chosen"] for p in pairs)
    # "It is 6." was generated after mul(2, 3), a context the kept path never had: it is stored, never paired.
    assert any(b.metadata["branch"]["reason"] == "backtracked" and b.events[-1].kind is EventKind.TURN_COMPLETE for b in rejected_logs(log))
    assert not any("It is 6." in p["rejected"] for p in pairs)
    for branch in rejected_logs(log):
        assert branch.metadata["branch_of"] == log.id


def test_prompt_input_format_passes_a_string():
    model = Scripted(["20"])
    run_episode(ReActStrategy(model, input_format="prompt"), harness(), TASK)
    assert isinstance(model.seen[0], str) and model.seen[0].endswith("ASSISTANT:")


def test_memory_ops_after_the_last_step_stay_before_the_closing_events():
    memory = InContextMemory()
    log = run_episode(MemoryReActStrategy(Scripted([call("add", a=2, b=3)]), memory, max_steps=5), harness(max_steps=1), TASK)
    assert [e.kind for e in log][-3:] == [EventKind.MEMORY_OP, EventKind.REWARD, EventKind.TURN_COMPLETE]


def test_negative_or_zero_max_steps_and_nan_scores_are_clear_errors():
    import math

    import pytest

    for bad in (-1, 0, 2.5):
        with pytest.raises(ValueError, match="max_steps must be a positive integer"):
            ReActStrategy(Scripted(["x"]), max_steps=bad)
        with pytest.raises(ValueError, match="max_steps must be a positive integer or None"):
            harness(max_steps=bad)
    strategy = TreeOfThoughtsStrategy(Scripted([call("add", a=1, b=2)]), n_candidates=1, scorer=lambda s, a: math.nan)
    with pytest.raises(ValueError, match="scorer returned NaN"):
        run_episode(strategy, harness(), TASK)
    nan_reward = DictToolHarness({"add": add}, reward_fn=lambda text, task: math.nan)
    with pytest.raises(ValueError, match="returned NaN"):
        run_episode(ReActStrategy(Scripted(["done"])), nan_reward, TASK)
