"""The shared RL core: create_agentic_trainer, rollout engines, rewards, judge, efficient GRPO, distillation.

Exports resolve lazily so importing this package loads no torch, transformers, TRL or Ray.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Algorithm": "factory",
    "create_agentic_trainer": "factory",
    "split_trl_kwargs": "factory",
    "lora_config": "lora",
    "build_value_model": "factory",
    "RolloutConfig": "rollout",
    "RolloutEngine": "rollout",
    "TransformersRolloutEngine": "rollout",
    "VLLMRolloutEngine": "rollout",
    "create_rollout_engine": "engines",
    "create_rollout_fn": "rollout",
    "episode_to_eventlog": "rollout",
    "RayRolloutEngine": "ray_engine",
    "run_on_ray": "ray_engine",
    "EfficiencyConfig": "efficient",
    "PreRolloutFilter": "efficient",
    "max_variance_indices": "efficient",
    "REWARD_REGISTRY": "rewards",
    "combine_rewards": "rewards",
    "RewardError": "rewards",
    "LLMJudge": "judge",
    "RuleGuardCombinator": "judge",
    "JudgeError": "judge",
    "filter_teacher_trajectories": "distill",
    "distill": "distill",
    "preference_pairs_from_rollouts": "data",
    "bco_rows_from_rollouts": "data",
    "warehouse_sink": "lineage",
    "record_adapter": "lineage",
    "train_adapter": "train",
    "TrainConfig": "train",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f"agenttune_lib.rl.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'agenttune_lib.rl' has no attribute {name!r}")
