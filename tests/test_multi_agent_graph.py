"""AgentTuneGraph with plain-function nodes: wiring errors, plan, router, authored episodes, judge panel, the three callables."""
from __future__ import annotations

import statistics
from typing import TypedDict

import pytest

from agenttune_lib.events import EventKind, EventLog
from agenttune_lib.multi_agent import AgentTuneGraph, GraphCompileError, RewardJudge, aggregate_scores


def planner(prompts):
    return {"responses": [f"plan: look up {p}" for p in prompts]}


def handoff(prompts, planner):
    return [f"{p} (plan: {r})" for p, r in zip(prompts, planner["responses"])]


def solver(handoff):
    n = len(handoff)
    return {
        "responses": [f"answer to {h}" for h in handoff],
        "prompt_ids": [[1, 2, 3]] * n,
        "completion_ids": [[4, 5]] * n,
        "logprobs": [[-0.5, -0.7]] * n,
        "env_mask": [[1, 0]] * n,
    }


def words(log):
    return float(len(" ".join(e.payload.get("content", "") for e in log.filter("text")).split()))


class Half:
    """A judge exposing evaluate_trajectory (the duck-typed judge protocol)."""

    def evaluate_trajectory(self, trajectory):
        return 0.5


def _graph(**kw):
    g = AgentTuneGraph(**kw)
    g.add_rollout("planner", planner).add_node("handoff", handoff).add_rollout("solver", solver, trainable=True)
    g.add_judge("length", words, weight=3.0).add_judge("half", Half(), weight=1.0)
    return g


def test_plan_follows_parameter_names():
    g = _graph()
    assert g.plan == ["planner", "handoff", "solver", "__episode__", "length", "half", "__panel__"]
    assert g.wiring()["handoff"] == {"prompts": "<graph input>", "planner": "planner"}
    assert g.wiring()["solver"] == {"handoff": "handoff"}


def test_two_producers_of_one_name_is_a_compile_error_naming_node_and_key():
    g = AgentTuneGraph()
    g.add_rollout("planner", planner)
    g.add_node("a", lambda prompts: {"x": 1}, outputs=["shared"])
    g.add_node("b", lambda prompts: {"x": 2}, outputs=["shared"])
    with pytest.raises(GraphCompileError, match=r"node 'b' produces 'shared', which 'a' already produces"):
        g.compile()


def test_output_colliding_with_a_builtin_key_is_a_compile_error():
    g = AgentTuneGraph().add_rollout("planner", planner)
    g.add_node("mine", lambda prompts: [], outputs=["judge_rewards"])
    with pytest.raises(GraphCompileError, match=r"node 'mine' produces 'judge_rewards'"):
        g.compile()


def test_consumer_without_producer_names_node_and_parameter():
    g = AgentTuneGraph().add_rollout("planner", planner)
    g.add_node("critic", lambda planner, plan_notes: 0)
    with pytest.raises(GraphCompileError, match=r"node 'critic': parameter 'plan_notes' .* has no producer"):
        g.compile()
    # A parameter with a default is optional: unresolved, it keeps its default.
    ok = AgentTuneGraph().add_rollout("planner", planner).add_node("critic", lambda planner, plan_notes=None: 0)
    assert "critic" in ok.plan


def test_renamed_input_is_wired_and_checked():
    g = AgentTuneGraph().add_rollout("planner", planner)
    g.add_rollout("solver", solver, inputs={"handoff": "missing_key"})
    with pytest.raises(GraphCompileError, match=r"node 'solver': parameter 'handoff' \(state key 'missing_key'\)"):
        g.compile()
    with pytest.raises(GraphCompileError, match=r"inputs maps 'nope'"):
        AgentTuneGraph().add_rollout("s", solver, inputs={"nope": "prompts"})


def test_cycle_and_reserved_names_and_no_rollout_are_errors():
    g = AgentTuneGraph().add_rollout("planner", planner)
    g.add_node("a", lambda b: 1).add_node("b", lambda a: 2)
    with pytest.raises(GraphCompileError, match="cycle"):
        g.compile()
    with pytest.raises(GraphCompileError, match="reserved"):
        AgentTuneGraph().add_node("trajectories", lambda prompts: 1)
    with pytest.raises(GraphCompileError, match="no rollout node"):
        AgentTuneGraph().add_node("f", lambda prompts: 1).compile()
    with pytest.raises(GraphCompileError, match="judge node"):
        AgentTuneGraph().add_rollout("planner", planner).compile_grpo_reward()


def test_episode_events_carry_agent_authors_and_judge_rewards():
    g = _graph(aggregate="weighted")
    state = g.invoke(["q1", "q2"])
    log = state["trajectories"][1]
    texts = log.filter(EventKind.TEXT)
    assert [e.author for e in texts] == ["planner", "solver"]
    assert texts[0].payload["content"] == "plan: look up q2"
    # Responses-only nodes show no prompt: the log opens with the task, which no agent authored.
    assert [(e.author, e.payload["content"]) for e in log.filter(EventKind.OBSERVATION)] == [(None, "q2")]
    rewards = log.filter(EventKind.REWARD)
    assert [e.author for e in rewards] == ["length", "half", "judge_panel"]
    length = words(log)
    assert rewards[0].payload["value"] == length and rewards[1].payload["value"] == 0.5
    assert rewards[2].payload["value"] == pytest.approx((3 * length + 0.5) / 4)
    assert log.rewards("episode")[-1] == state["judge_rewards"][1]
    assert log.metadata["agents"] == ["planner", "solver"] and log.metadata["token_agent"] == "solver"


def test_compile_rollout_is_a_grpo_rollout_func_forwarding_judge_rewards():
    g = _graph()
    captured = []
    g.sink = captured.extend
    out = g.compile_rollout()(["q1", "q2", "q3"], None)
    assert out["prompt_ids"] == [[1, 2, 3]] * 3 and out["completion_ids"] == [[4, 5]] * 3
    assert out["logprobs"] == [[-0.5, -0.7]] * 3 and out["env_mask"] == [[1, 0]] * 3
    assert out["agent"] == ["solver"] * 3 and len(out["judge_rewards"]) == 3
    assert [log.id for log in captured] == out["trajectory_ids"]
    reward = g.compile_grpo_reward()
    # Under GRPO, TRL forwards judge_rewards to the reward function: one score per completion.
    assert reward(completions=["x"] * 3, prompts=["q1", "q2", "q3"], judge_rewards=out["judge_rewards"], judge_scores=out["judge_scores"]) == out["judge_rewards"]


def test_grpo_reward_without_forwarded_scores_runs_the_panel_per_completion():
    g = _graph(aggregate="mean")
    reward = g.compile_grpo_reward()
    scores = reward(completions=["one two", "one two three four"], prompts=["q", "q"])
    assert scores == [pytest.approx((2 + 0.5) / 2), pytest.approx((4 + 0.5) / 2)]


def test_compile_reward_scores_one_trajectory_outside_training():
    g = _graph(aggregate="median")
    score = g.compile_reward()
    log = g.invoke(["q"])["trajectories"][0]
    assert score(log) == pytest.approx(statistics.median([words(log), 0.5]))
    assert score("a b c") == pytest.approx(statistics.median([3.0, 0.5]))
    assert score([{"role": "assistant", "content": "a b"}]) == pytest.approx(statistics.median([2.0, 0.5]))
    with pytest.raises(TypeError, match="EventLog"):
        score(42)


def test_router_runs_one_rollout_node_per_batch():
    calls = []

    def fast(prompts):
        calls.append("fast")
        return {"responses": ["f"] * len(prompts), "prompt_ids": [[1]] * len(prompts), "completion_ids": [[2]] * len(prompts), "logprobs": [[0.0]] * len(prompts)}

    def slow(prompts):
        calls.append("slow")
        return {"responses": ["s s"] * len(prompts), "prompt_ids": [[1]] * len(prompts), "completion_ids": [[3]] * len(prompts), "logprobs": [[0.0]] * len(prompts)}

    g = AgentTuneGraph().add_rollout("fast", fast).add_rollout("slow", slow).add_judge("length", words)
    g.set_router(lambda prompts: "slow" if len(prompts) > 1 else "fast")
    ro = g.compile_rollout()
    assert g.plan[:3] == ["__route__", "fast", "slow"]
    out1 = ro(["a"])
    out2 = ro(["a", "b"])
    assert calls == ["fast", "slow"]
    assert out1["agent"] == ["fast"] and out1["completion_ids"] == [[2]]
    assert out2["agent"] == ["slow", "slow"] and out2["judge_rewards"] == [2.0, 2.0]
    assert [h["route"] for h in g.history] == ["fast", "slow"]
    g.set_router(lambda prompts: "nobody")
    with pytest.raises(RuntimeError, match=r"router returned 'nobody'"):
        g.compile_rollout()(["a"])


def test_router_rejects_nodes_that_read_a_routed_rollout():
    g = AgentTuneGraph().add_rollout("planner", planner).add_node("handoff", handoff).add_rollout("solver", solver)
    g.set_router(lambda prompts: "planner")
    with pytest.raises(GraphCompileError, match=r"node 'handoff': parameter 'planner' reads rollout node 'planner'"):
        g.compile()


class FakeJudgeModel:
    """Test double for a judge model: scores by answer length, ranks longer first."""

    def __call__(self, prompt):
        if "RANKING" in prompt:
            return "RANKING: 2 > 1"
        return "SCORE: 7"


def test_llm_judge_absolute_and_relative_through_the_adapter():
    from agenttune_lib.rl.judge import LLMJudge

    g = AgentTuneGraph().add_rollout("planner", planner)
    g.add_judge("llm", LLMJudge(FakeJudgeModel()))
    g.add_judge("rank", LLMJudge(FakeJudgeModel()), mode="relative")
    state = g.invoke(["same task", "same task"])
    assert state["judge_scores"] == [{"llm": 0.7, "rank": 0.0}, {"llm": 0.7, "rank": 1.0}]
    with pytest.raises(ValueError, match="relative"):
        AgentTuneGraph().add_judge("x", words, mode="relative")
    with pytest.raises(TypeError, match="is not a judge"):
        AgentTuneGraph().add_judge("x", 3)


def test_failing_or_non_finite_judge_names_itself():
    g = AgentTuneGraph().add_rollout("planner", planner).add_judge("bad", lambda log: float("nan"))
    with pytest.raises(Exception, match=r"judge 'bad' returned a non-finite score"):
        g.invoke(["q"])

    def boom(log):
        raise KeyError("no answer")

    g2 = AgentTuneGraph().add_rollout("planner", planner).add_judge("boom", boom)
    with pytest.raises(Exception, match=r"judge 'boom' failed: KeyError"):
        g2.invoke(["q"])


def test_reward_judge_reads_answer_from_episode_metadata():
    g = AgentTuneGraph(task_metadata={"What is 2+2?": {"answer": "4"}})
    g.add_rollout("solver", lambda prompts: {"responses": ["The answer is 4."] * len(prompts)})
    g.add_judge("correct", RewardJudge("reward_correct_answer"))
    state = g.invoke(["What is 2+2?"])
    assert state["judge_rewards"][0] > 0
    assert state["trajectories"][0].metadata["answer"] == "4"


def test_aggregate_scores_modes_and_errors():
    scores = {"a": [1.0, 0.0], "b": [0.0, 0.0], "c": [0.5, 1.0]}
    assert aggregate_scores(scores, "mean") == [pytest.approx(0.5), pytest.approx(1 / 3)]
    assert aggregate_scores(scores, "median") == [0.5, 0.0]
    assert aggregate_scores(scores, "weighted", {"a": 2, "b": 0, "c": 2}) == [pytest.approx(0.75), pytest.approx(0.5)]
    with pytest.raises(ValueError, match=r"no weight for judge\(s\) \['c'\]"):
        aggregate_scores(scores, "weighted", {"a": 1, "b": 1})
    with pytest.raises(ValueError, match="aggregate must be one of"):
        aggregate_scores(scores, "max")


def test_attribution_is_readable_from_the_warehouse(warehouse):
    from agenttune_lib.multi_agent.train import attribution
    from agenttune_lib.rl.lineage import warehouse_sink
    from agenttune_lib.warehouse import Provenance

    g = _graph(sink=warehouse_sink(warehouse, Provenance(run_id="ma-run", asset_key="multi_agent_adapter"), source="multi_agent"))
    out = g.compile_rollout()(["q1", "q2"])
    logs = warehouse.read_logs(ids=out["trajectory_ids"])
    assert len(logs) == 2
    for log in logs:
        by_author = {e.author: e.payload["value"] for e in log.filter(EventKind.REWARD)}
        assert set(by_author) == {"length", "half", "judge_panel"}
        assert {e.author for e in log.filter(EventKind.TEXT)} == {"planner", "solver"}
    rows = warehouse.execute("SELECT DISTINCT author FROM events WHERE kind = 'reward' ORDER BY 1")
    assert rows == [("half",), ("judge_panel",), ("length",)]
    attr = attribution(warehouse, run_id="ma-run")
    assert attr["agents"] == {"planner": {"text": 2}, "solver": {"text": 2}}
    assert attr["judges"]["half"] == {"n": 2, "mean": 0.5, "min": 0.5, "max": 0.5}
    panel = warehouse.execute("SELECT reward_episode FROM trajectories WHERE source = 'multi_agent' ORDER BY id")
    assert sorted(r[0] for r in panel) == sorted(out["judge_rewards"])


def test_rollout_node_output_is_validated():
    g = AgentTuneGraph().add_rollout("bad", lambda prompts: {"other": 1})
    with pytest.raises(Exception, match=r"rollout node 'bad' returned neither 'trajectories' nor 'responses'"):
        g.invoke(["q"])
    g2 = AgentTuneGraph().add_rollout("short", lambda prompts: {"responses": ["x"]})
    with pytest.raises(Exception, match=r"1 trajectories for 2 prompts"):
        g2.invoke(["a", "b"])
    g3 = AgentTuneGraph().add_rollout("textonly", lambda prompts: {"responses": ["x"] * len(prompts)}).add_judge("j", words)
    with pytest.raises(RuntimeError, match=r"'textonly' supplies GRPO's token rows but returned no"):
        g3.compile_rollout()(["q"])


def test_episode_log_round_trips_through_eventlog_json():
    log = _graph().invoke(["q"])["trajectories"][0]
    again = EventLog.from_json(log.to_json())
    assert again == log


def test_overlap_judge_scores_task_and_teammate_use():
    from agenttune_lib.multi_agent import OverlapJudge

    g = AgentTuneGraph()
    g.add_rollout("planner", lambda prompts: {"responses": ["check the termination clause notice"] * len(prompts)})
    g.add_rollout("solver", lambda prompts: {"responses": ["termination needs thirty days notice", "bananas"]}, trainable=True)
    g.add_judge("on_task", OverlapJudge("task")).add_judge("uses_plan", OverlapJudge("planner"))
    state = g.invoke(["When does termination need notice?", "When does termination need notice?"])
    first, second = state["judge_scores"]
    assert 0 < first["on_task"] <= 1 and 0 < first["uses_plan"] <= 1
    assert second == {"on_task": 0.0, "uses_plan": 0.0}


def test_spec_router_builds_a_routed_graph_over_tiny_policies(tiny_model):
    from types import SimpleNamespace

    from agenttune_lib.multi_agent import build_graph, load_graph_spec

    spec = load_graph_spec({
        "name": "routed",
        "policies": [{"name": "alpha", "model": "tiny-llama", "max_new_tokens": 3},
                     {"name": "beta", "model": "tiny", "trainable": True, "max_new_tokens": 3}],
        "judges": [{"name": "on_task", "kind": "overlap"}],
        "router": {"kind": "round_robin"},
    })
    graph = build_graph(spec)
    assert graph.plan[:3] == ["__route__", "alpha", "beta"]
    model, tok = tiny_model
    trainer = SimpleNamespace(model=model, processing_class=tok)
    ro = graph.compile_rollout()
    first, second = ro(["What is 2+2?"], trainer), ro(["What is 3+3?"], trainer)
    assert first["agent"] == ["alpha"] and second["agent"] == ["beta"]
    assert len(second["logprobs"][0]) == len(second["completion_ids"][0])
    assert [h["route"] for h in graph.history] == ["alpha", "beta"]


class Notes(TypedDict):
    notes: str
    n_words: int


class ScriptedEngine:
    """Test double for a policy: replies from a script per turn (a RolloutEngine subclass over the real tiny tokenizer)."""

    def __new__(cls, tokenizer, script):
        from agenttune_lib.rl.rollout import RolloutConfig, RolloutEngine

        class _Engine(RolloutEngine):
            def __init__(self):
                self.tokenizer, self.config, self.script, self.turn = tokenizer, RolloutConfig(max_tool_turns=1), script, 0

            def generate_texts(self, prompt_ids):
                out = [self.script[min(self.turn, len(self.script) - 1)]] * len(prompt_ids)
                self.turn += 1
                return out

        return _Engine()


def test_create_rollout_fn_output_is_a_rollout_node_with_tool_events(tiny_tokenizer):
    from agenttune_lib.rl.rollout import create_rollout_fn

    from _rl_helpers import calculator

    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    fn = create_rollout_fn(ScriptedEngine(tiny_tokenizer, [call, "It is 42."]), tools=[calculator])
    seen = []
    g = AgentTuneGraph(sink=seen.extend).add_node("solver", fn).add_judge("j", lambda log: 1.0)
    assert g.rollout_nodes == ["solver"]
    out = g.compile_rollout()(["What is 6*7?"])
    kinds = [(e.kind.value, e.author) for e in seen[0].events]
    assert kinds[:4] == [("observation", None), ("tool_call", "solver"), ("tool_result", "solver"), ("text", "solver")]
    assert seen[0].filter("tool_call")[0].payload["arguments"] == {"expression": "6*7"}
    assert 0 in out["env_mask"][0] and 1 in out["env_mask"][0]  # tool-result tokens carry no loss


def test_engine_node_keeps_token_spans_of_the_trained_agent(tiny_tokenizer):
    g = AgentTuneGraph().add_rollout("solver", ScriptedEngine(tiny_tokenizer, ["The answer is 4."])).add_judge("j", lambda log: 0.0)
    state = g.invoke(["What is 2+2?"])
    log = state["trajectories"][0]
    text = log.filter(EventKind.TEXT)[0]
    assert text.author == "solver" and text.token_span is not None
    obs = log.filter(EventKind.OBSERVATION)
    assert len(obs) == 1 and obs[0].author == "solver" and obs[0].token_span == (0, len(state["solver"]["prompt_ids"][0]))
    rows = state["solver"]
    assert list(log.token_ids) == rows["prompt_ids"][0] + rows["completion_ids"][0]


def test_duck_typed_variants_task_aware_judge_state_router_typed_outputs():
    def annotate(planner) -> Notes:
        return {"notes": planner["responses"][0], "n_words": len(planner["responses"][0].split())}

    class TaskJudge:
        def evaluate_trajectory(self, task, trajectory):
            return float(task in trajectory.filter("observation")[0].payload["content"])

    g = AgentTuneGraph(router=lambda state: 0)
    g.add_rollout("planner", planner).add_rollout("other", planner)
    g.add_node("annotate_episodes", lambda trajectories, n_words=None: len(trajectories))
    g.add_judge("task", TaskJudge())
    state = g.invoke(["q"])
    assert state["route"] == "planner" and state["judge_rewards"] == [1.0]
    g2 = AgentTuneGraph().add_rollout("planner", planner).add_node("annotate", annotate)
    g2.add_node("use", lambda notes, n_words: f"{n_words}:{notes}")
    assert g2.invoke(["q"])["use"] == "4:plan: look up q"
    g3 = AgentTuneGraph().add_node("p", planner, kind="rollout")
    assert g3.rollout_nodes == ["p"]
    with pytest.raises(ValueError, match="kind must be"):
        AgentTuneGraph().add_node("p", planner, kind="agent")


def test_attribution_problems_flag_unauthored_events_and_missing_judge_rewards():
    from agenttune_lib.events import Event
    from agenttune_lib.multi_agent import attribution_problems

    log = _graph().invoke(["q"])["trajectories"][0]
    assert attribution_problems([log]) == []
    stripped = EventLog([Event(e.kind, e.payload, scope=e.scope, author=None if e.kind is EventKind.TEXT else e.author) for e in log.events
                         if not (e.kind is EventKind.REWARD and e.author == "half")], metadata=log.metadata)
    problems = [p["problem"] for p in attribution_problems([stripped])]
    assert sum("authored by None" in p for p in problems) == 2
    assert any("judge 'half'" in p for p in problems)


def test_nodes_can_be_given_to_the_constructor():
    g = AgentTuneGraph(
        rollouts={"planner": planner, "solver": solver}, nodes={"handoff": handoff},
        judges=[Half(), words], weights={"judge_0": 1.0, "judge_1": 0.0}, aggregate="weighted",
    )
    assert g.rollout_nodes == ["planner", "solver"] and g.judge_nodes == ["judge_0", "judge_1"]
    assert g.invoke(["q"])["judge_rewards"] == [0.5]
