"""Reward functions: the 26-entry registry, the environment reward, the weighted combinator and the rule guard."""
from agenttune_lib.rl.rewards.builtin import ENVIRONMENT_REWARDS, REWARD_REGISTRY, RewardError, environment_reward
from agenttune_lib.rl.rewards.combine import call_reward, combine_rewards, resolve_reward

__all__ = ["ENVIRONMENT_REWARDS", "REWARD_REGISTRY", "RewardError", "call_reward", "combine_rewards", "environment_reward", "resolve_reward"]
