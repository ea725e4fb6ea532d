"""Reward functions: the 26-entry registry, the weighted combinator and the rule guard."""
from agenttune_lib.rl.rewards.builtin import REWARD_REGISTRY, RewardError
from agenttune_lib.rl.rewards.combine import call_reward, combine_rewards, resolve_reward

__all__ = ["REWARD_REGISTRY", "RewardError", "call_reward", "combine_rewards", "resolve_reward"]
