"""The compiled callables under the installed TRL's GRPOTrainer on tiny models: one real step, attribution in the warehouse."""
from __future__ import annotations

import math

import pytest

from _rl_helpers import lora_changed, lora_snapshot

from agenttune_lib.events import EventKind

pytest.importorskip("trl")


def solver_chars(log):
    """A judge whose score varies between sampled completions (test signal only)."""
    return sum(len(e.payload.get("content", "")) for e in log.events if e.kind is EventKind.TEXT and e.author == "solver") / 20.0


class FakeJudgeModel:
    """Test double for an LLM judge's model: a fixed absolute verdict."""

    def __init__(self, score: int = 6) -> None:
        self.score, self.prompts = score, []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return f"SCORE: {self.score}"


def _dataset(n: int = 2):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "answer": str(2 * i)} for i in range(n)])


def test_compiled_callables_drive_trl_grpotrainer_one_step(warehouse, tmp_path):
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.multi_agent import AgentTuneGraph, RewardJudge
    from agenttune_lib.rl.lineage import warehouse_sink
    from agenttune_lib.rl.rollout import RolloutConfig
    from agenttune_lib.warehouse import Provenance

    model, tok = build_tiny_model(seed=3)
    sink = warehouse_sink(warehouse, Provenance(run_id="grpo-ma", asset_key="test"), source="multi_agent")
    graph = AgentTuneGraph(aggregate="mean", sink=sink, task_metadata={"What is 1+1?": {"answer": "2"}})
    graph.add_rollout("solver", None, config=RolloutConfig(max_new_tokens=8, max_tool_turns=0), trainable=True)
    graph.add_judge("length", solver_chars).add_judge("correct", RewardJudge("reward_correct_answer"))
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4, num_generations=2, max_completion_length=8,
        learning_rate=5e-2, beta=0.0, use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tok, args=args, train_dataset=_dataset(),
        reward_funcs=[graph.compile_grpo_reward()], rollout_func=graph.compile_rollout(),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    before = lora_snapshot(trainer.model)
    result = trainer.train()
    assert math.isfinite(result.training_loss) and trainer.state.global_step == 1
    assert lora_changed(before, trainer.model)
    # The reward GRPO logged is the panel's mean over the batch's completions.
    h = graph.history[0]
    logged = next(x for x in trainer.state.log_history if "reward" in x)
    assert logged["reward"] == pytest.approx(sum(h["judge_rewards"]) / 4, rel=1e-5)
    assert "judge/length" in logged
    logs = warehouse.read_logs(source="multi_agent")
    assert len(logs) == 4 and {log.tier for log in logs} == {"full"}
    score = graph.compile_reward()
    for log in logs:
        assert [e.author for e in log.filter(EventKind.REWARD)] == ["length", "correct", "judge_panel"]
        assert {e.author for e in log.events if e.kind is EventKind.TEXT} == {"solver"}
        # The scorer used outside training gives the panel reward recorded during training.
        assert score(log) == pytest.approx(log.rewards("episode")[-1])
        # Token spans are the ones GRPO trained on: the solver's text lies inside the log's token ids.
        text = log.filter(EventKind.TEXT)[0]
        assert text.token_span is not None and text.token_span[1] <= len(log.token_ids)


@pytest.mark.slow
def test_two_tiny_policies_and_a_two_judge_panel_through_one_grpo_step(warehouse, tmp_path):
    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.multi_agent import AgentTuneGraph
    from agenttune_lib.multi_agent.train import attribution
    from agenttune_lib.rl import create_agentic_trainer
    from agenttune_lib.rl.judge import LLMJudge
    from agenttune_lib.rl.lineage import warehouse_sink
    from agenttune_lib.rl.rollout import RolloutConfig, TransformersRolloutEngine
    from agenttune_lib.warehouse import Provenance

    policy, tok = build_tiny_model(seed=1)
    planner_model, planner_tok = build_tiny_model(arch="llama", seed=2)
    planner = TransformersRolloutEngine(planner_model, planner_tok, RolloutConfig(max_new_tokens=6, max_tool_turns=0))

    def handoff(prompts, planner):
        return [[{"role": "user", "content": p[-1]["content"] + "\nPlan: " + r}] for p, r in zip(prompts, planner["responses"])]

    judge_model = FakeJudgeModel(6)
    graph = AgentTuneGraph(aggregate="weighted", sink=warehouse_sink(warehouse, Provenance(run_id="two-policies"), source="multi_agent"))
    graph.add_rollout("planner", planner)
    graph.add_node("handoff", handoff)
    graph.add_rollout("solver", None, inputs={"prompts": "handoff"}, config=RolloutConfig(max_new_tokens=8, max_tool_turns=0), trainable=True)
    graph.add_judge("llm", LLMJudge(judge_model), weight=1.0).add_judge("length", solver_chars, weight=2.0)
    trainer = create_agentic_trainer(
        "grpo", model=policy, tokenizer=tok, train_dataset=_dataset(), reward_funcs=[graph.compile_grpo_reward()],
        rollout_func=graph.compile_rollout(), lora={"r": 4, "lora_alpha": 8}, max_steps=1, per_device_train_batch_size=4,
        num_generations=2, max_completion_length=8, learning_rate=5e-2, beta=0.0, output_dir=str(tmp_path / "out"),
    )
    before = lora_snapshot(trainer.model)
    trainer.train()
    assert lora_changed(before, trainer.model)
    assert len(judge_model.prompts) == 4
    attr = attribution(warehouse, run_id="two-policies")
    assert set(attr["agents"]) == {"planner", "solver"}
    assert attr["agents"]["planner"]["text"] == 4 and attr["agents"]["solver"]["text"] == 4
    assert attr["judges"]["llm"]["mean"] == pytest.approx(0.6)
    for log in warehouse.read_logs(run_id="two-policies"):
        by = {e.author: e.payload["value"] for e in log.filter(EventKind.REWARD)}
        assert by["judge_panel"] == pytest.approx((by["llm"] + 2 * by["length"]) / 3)
        planner_text = next(e for e in log.events if e.author == "planner")
        assert planner_text.token_span is None  # only the trained agent's tokens are the log's token ids
        obs = [e.payload["content"] for e in log.filter(EventKind.OBSERVATION)]
        assert len(obs) == 2 and "Plan: " in obs[1]
