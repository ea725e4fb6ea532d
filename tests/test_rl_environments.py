"""RL environments (contract 5): τ² retail DB-state reward, QA search over a real BM25 index, single-call AST match,
and the trainer picking each row's environment."""
from __future__ import annotations

import json

import pytest

from agenttune_lib.rl.rollout import RolloutConfig, RolloutEngine


class ScriptedEngine(RolloutEngine):
    """Test double for the model only: replies from a per-turn script (ids = the real tiny tokenizer's rendering)."""

    def __init__(self, tokenizer, script, max_tool_turns=6):
        self.tokenizer, self.config, self.script, self.turn = tokenizer, RolloutConfig(max_tool_turns=max_tool_turns, max_length=None), script, 0
        self.prompts = []

    def generate_texts(self, prompt_ids):
        self.prompts.extend(prompt_ids)
        out = [self.script[min(self.turn, len(self.script) - 1)]] * len(prompt_ids)
        self.turn += 1
        return out


def _call(name, args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def test_tau2_reward_is_the_database_state(tiny_model):
    from agenttune_lib.rl.environments import Tau2Environment, tau2_tasks
    from agenttune_lib.spine.tau2 import load_tau2_tasks

    _, tok = tiny_model
    task = next(t for t in load_tau2_tasks("train") if any(a["name"].startswith(("cancel", "modify", "return", "exchange")) for a in t.actions))
    good = ScriptedEngine(tok, [_call(a["name"], a["arguments"]) for a in task.actions] + ["Done."], max_tool_turns=len(task.actions) + 1)
    out = good.rollout(["x"], environments=[Tau2Environment()], tasks=[{"task_id": task.id}])
    assert out["env_reward"] == [1.0] and out["env_success"] == [True]
    assert out["env_metrics"][0]["tool_calls_executed"] == len(task.actions)
    # The policy was shown the retail tools it can execute.
    shown = tok.decode(good.prompts[0])
    assert "find_user_id_by_name_zip" in shown and "cancel_pending_order" in shown
    lookups_only = [a for a in task.actions if a["name"].startswith(("find", "get"))]
    partial = ScriptedEngine(tok, [_call(a["name"], a["arguments"]) for a in lookups_only] + ["Done."], max_tool_turns=len(lookups_only) + 1)
    out = partial.rollout(["x"], environments=[Tau2Environment()], tasks=[{"task_id": task.id}])
    assert out["env_reward"] == [0.0] and out["env_success"] == [False]
    assert {"task_id": task.id} in tau2_tasks("train")


def test_qa_search_environment_over_a_real_index(tiny_model, tmp_path):
    from _rag_helpers import licensed_documents

    from agenttune_lib.rag.backends import BM25Backend, build_index
    from agenttune_lib.rag.chunking import chunk_documents
    from agenttune_lib.rl.environments import QASearchEnvironment

    _, tok = tiny_model
    chunks, _ = chunk_documents(licensed_documents())
    build_index(chunks, tmp_path / "idx", kinds=("bm25",))
    backend = BM25Backend(tmp_path / "idx")
    task = {"qa_id": "q1", "question": "Which product does the WinRAR license cover?", "answer": "WinRAR"}
    eng = ScriptedEngine(tok, [_call("search_corpus", {"query": "WinRAR license"}), "WinRAR"])
    out = eng.rollout(["x"], environments=[QASearchEnvironment(backend)], tasks=[task])
    assert out["env_reward"] == [1.0] and out["env_metrics"][0]["searches"] == 1
    tool_msg = out["completions"][0][1]
    assert tool_msg["role"] == "tool" and "chunk_id" in tool_msg["content"]
    wrong = ScriptedEngine(tok, ["Xming"])
    out = wrong.rollout(["x"], environments=[QASearchEnvironment(backend)], tasks=[task])
    assert out["env_reward"] == [0.0] and out["env_metrics"][0]["searches"] == 0
    with pytest.raises(ValueError, match="backend"):
        QASearchEnvironment()


def test_tool_call_environment_scores_the_single_call(tiny_model):
    from agenttune_lib.rl.environments import ToolCallEnvironment, call_match, tool_call_tasks

    _, tok = tiny_model
    tasks = tool_call_tasks("train")
    held = tool_call_tasks("test")
    assert tasks and held and not {t["task_id"] for t in tasks} & {t["task_id"] for t in held}
    task = tasks[0]
    exp = task["expected"]
    exact = ScriptedEngine(tok, [_call(exp["name"], exp["arguments"])])
    out = exact.rollout(["x"], environments=[ToolCallEnvironment()], tasks=[task])
    assert out["env_reward"] == [1.0] and out["env_success"] == [True]
    assert out["tool_call_counts"] == [1] and all(m["role"] == "assistant" for m in out["completions"][0])  # scored, not executed
    wrong_args = {k: "nobody" for k in exp["arguments"]}
    out = ScriptedEngine(tok, [_call(exp["name"], wrong_args)]).rollout(["x"], environments=[ToolCallEnvironment()], tasks=[task])
    assert out["env_reward"] == [0.5] and out["env_success"] == [False]
    out = ScriptedEngine(tok, ["I cannot help."]).rollout(["x"], environments=[ToolCallEnvironment()], tasks=[task])
    assert out["env_reward"] == [0.0]
    assert call_match(exp, [{"role": "assistant", "content": _call("get_user_details", {"user_id": "x"})}]) == (False, 0.0, False)


def test_trainer_runs_each_row_in_its_environment(monkeypatch):
    from datasets import Dataset

    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl import create_agentic_trainer
    from agenttune_lib.rl.environments import ToolCallEnvironment, environment_factories, environment_rows, tool_call_tasks

    model, tok = build_tiny_model(seed=2)
    rows = environment_rows(ToolCallEnvironment(), tool_call_tasks("train", limit=2))
    seen = []

    def spy(completions, env_reward=None, **kw):
        seen.append(list(env_reward))
        return [float(r) for r in env_reward]

    trainer = create_agentic_trainer(
        "grpo", model=model, tokenizer=tok, train_dataset=Dataset.from_list(rows), reward_funcs=[spy, "environment_reward"],
        environments=environment_factories(["tool_call"]), max_steps=1, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=6, learning_rate=1e-3,
    )
    trainer.train()
    assert seen and len(seen[0]) == 4 and all(r == 0.0 for r in seen[0])  # an untrained tiny model makes no valid call
    logs = trainer.agenttune_rollout_func.history
    assert logs and logs[0]["n"] == 4
    bad = Dataset.from_list([{**rows[0], "environment": "nowhere"}] * 2)
    trainer = create_agentic_trainer(
        "grpo", model=build_tiny_model(seed=2)[0], tokenizer=tok, train_dataset=bad, reward_funcs=["environment_reward"],
        environments=environment_factories(["tool_call"]), max_steps=1, per_device_train_batch_size=2, num_generations=2, max_completion_length=4,
    )
    with pytest.raises(ValueError, match="'nowhere'"):
        trainer.train()


def test_environment_reward_without_an_environment_is_an_error():
    from agenttune_lib.rl.rewards import RewardError, combine_rewards

    with pytest.raises(RewardError, match="environment_reward"):
        combine_rewards(["environment_reward"])(["x"], env_reward=[None])
