"""τ² tasks whose gold state is the initial state (doing nothing scores 1.0) stay out of RL unless asked for, then flagged (issue 29)."""
from __future__ import annotations

import pytest

from test_rl_environments import ScriptedEngine

NOOP_TRAIN = ["10", "24", "25", "50", "57", "67", "105"]  # the real tau2-retail train split's 7 (of 11 in all 114)


def test_noop_tasks_are_left_out_of_the_rl_task_list_by_default():
    from agenttune_lib.rl.environments import tau2_tasks
    from agenttune_lib.spine.tau2 import load_tau2_tasks

    all_train = [t.id for t in load_tau2_tasks("train")]
    kept = [t["task_id"] for t in tau2_tasks("train")]
    assert len(all_train) == 74 and len(kept) == 67
    assert sorted(set(all_train) - set(kept), key=int) == NOOP_TRAIN
    assert [t["task_id"] for t in tau2_tasks("train", include_noop_tasks=True)] == all_train


def test_a_noop_task_is_refused_by_the_environment_and_admitted_flagged_on_request(tiny_model):
    from agenttune_lib.rl.environments import Tau2Environment

    _, tok = tiny_model
    with pytest.raises(ValueError, match=r"tau2_retail task '10': its gold database equals the initial one, so an episode that does nothing scores 1.0"):
        Tau2Environment().reset({"task_id": "10"})
    idle = ScriptedEngine(tok, ["Done."], max_tool_turns=1)
    out = idle.rollout(["x", "x"], environments=[Tau2Environment(include_noop_tasks=True) for _ in range(2)],
                       tasks=[{"task_id": "10"}, {"task_id": "0"}])
    assert out["env_reward"] == [1.0, 0.0]  # doing nothing passes the no-op task: why it is excluded by default
    flags = [log.metadata["gold_equals_initial"] for log in out["trajectories"]]
    assert flags == [True, False]  # every τ² episode says whether it was a no-op task


def test_train_config_rows_follow_the_flag():
    from agenttune_lib.rl.train import TrainConfig, environment_task_rows

    rows, envs = environment_task_rows(TrainConfig(algorithm="grpo", environment="tau2_retail", max_trajectories=200))
    assert len(rows) == 67 and not {r["trajectory_id"] for r in rows} & {f"tau2_retail:{i}" for i in NOOP_TRAIN}
    assert envs["tau2_retail"]().include_noop_tasks is False
    rows, envs = environment_task_rows(TrainConfig(algorithm="grpo", environment="tau2_retail", max_trajectories=200, tau2_include_noop_tasks=True))
    assert len(rows) == 74 and envs["tau2_retail"]().include_noop_tasks is True
