"""bench/grpo_efficiency.py's summary never reports a speed-up when vanilla did not learn or an arm never got there."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def _run(arm, seed, curve, before=0.2):
    return {"arm": arm, "lr": 1e-3, "seed": seed, "curve": curve, "before": {"reward": before, "contract_rate": 0.0, "correct_label_rate": 0.0},
            "after": {"reward": curve[-1][2], "contract_rate": 0.5, "correct_label_rate": 0.25}, "rollout_s": [9.0, 2.0, 2.0],
            "update_s": [9.0, 1.0, 1.0], "step_s": [18.0, 3.0, 3.0], "prompts_skipped": 1, "prompts_seen": 6, "rollouts_generated": 24, "rollouts_used": 12}


def test_no_learning_means_no_speedup():
    import grpo_efficiency as g

    flat = [(0, 0.0, 0.2), (2, 10.0, 0.2), (4, 20.0, 0.2)]
    s = g.summarise([_run("vanilla", 0, flat), _run("efficient", 0, flat)], threshold=0.5)
    assert s["speedup_time_to_vanilla_best"] is None and "never beat" in s["speedup_note"]


def test_speedup_is_time_to_vanillas_best_and_excludes_warmup():
    import grpo_efficiency as g

    vanilla = [(0, 0.0, 0.2), (2, 10.0, 0.4), (4, 20.0, 0.6)]
    efficient = [(0, 0.0, 0.2), (2, 5.0, 0.6), (4, 10.0, 0.6)]
    s = g.summarise([_run("vanilla", 0, vanilla), _run("efficient", 0, efficient)], threshold=0.5)
    assert s["speedup_time_to_vanilla_best"] == 4.0  # 20 s vs 5 s to reach 0.6
    assert s["arms"]["vanilla"]["steps_to_threshold"]["values"] == [4]
    assert s["arms"]["efficient"]["rollout_s_per_step"]["mean"] == 2.0  # the first (warm-up) step is excluded
    assert s["table8_grpo"]["contract_rate"]["after"]["mean"] == 0.5


def test_an_arm_that_never_reaches_gives_no_ratio():
    import grpo_efficiency as g

    vanilla = [(0, 0.0, 0.2), (2, 10.0, 0.6)]
    efficient = [(0, 0.0, 0.2), (2, 5.0, 0.3)]
    s = g.summarise([_run("vanilla", 0, vanilla), _run("efficient", 0, efficient)], threshold=0.5)
    assert s["speedup_time_to_vanilla_best"] is None and "0/1" in s["speedup_note"]


def test_sft_warm_start_rows_use_the_rollout_prompt_and_the_gold_call():
    """The warm start trains on the exact prompt ids the rollout engine renders, and its target is a call the environment scores 1.0."""
    import grpo_efficiency as g

    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rl.environments import ToolCallEnvironment, tool_call_tasks
    from agenttune_lib.rl.rollout import RolloutConfig, TransformersRolloutEngine

    model, tok = build_tiny_model(seed=0)
    tasks = tool_call_tasks("train")[:2]
    rows = g.sft_rows(tok, tasks)
    out = TransformersRolloutEngine(model, tok, RolloutConfig(max_new_tokens=2, do_sample=False, max_length=None)).rollout(
        ["x"] * 2, environments=[ToolCallEnvironment() for _ in tasks], tasks=tasks)
    for row, prompt_ids, task in zip(rows, out["prompt_ids"], tasks):
        n = len(prompt_ids)
        assert row["input_ids"][:n] == list(prompt_ids)
        assert row["labels"][:n] == [-100] * n and set(row["token_weights"][:n]) == {0.0}
        target = tok.decode(row["input_ids"][n:], skip_special_tokens=True)
        env = ToolCallEnvironment()
        env.reset(task)
        assert env.reward([{"role": "assistant", "content": target}]) == 1.0
        assert row["token_weights"][n:] == [2.0] * (len(row["input_ids"]) - n)
