"""combine_rewards: several reward functions (callables or registry names) as one weighted GRPO reward."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.rl.rewards.builtin import REWARD_REGISTRY, RewardError


def resolve_reward(func: str | Callable[..., Any]) -> Callable[..., Any]:
    """A registry name or a callable as a callable; an unknown name lists the known ones."""
    if isinstance(func, str):
        if func not in REWARD_REGISTRY:
            raise KeyError(f"unknown reward {func!r}; registered: {sorted(REWARD_REGISTRY)}")
        return REWARD_REGISTRY[func]
    if not callable(func):
        raise TypeError(f"a reward must be a callable or a registry name, got {type(func).__name__}")
    return func


def call_reward(func: Callable[..., Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Score with TRL's keyword convention, else the positional ``func(completions)`` one; raise if both fail.

    The result must be one finite float per completion.
    """
    func = resolve_reward(func)
    name = getattr(func, "__name__", type(func).__name__)
    try:
        scores = func(completions=completions, **kwargs)
    except Exception as first:
        try:
            scores = func(completions)
        except Exception as second:
            raise RewardError(
                f"reward {name!r} failed under both calling conventions: "
                f"keyword ({type(first).__name__}: {first}); positional ({type(second).__name__}: {second})"
            ) from second
    if scores is None:
        raise RewardError(f"reward {name!r} returned None")
    scores = list(scores)
    if len(scores) != len(completions):
        raise RewardError(f"reward {name!r} returned {len(scores)} scores for {len(completions)} completions")
    out = []
    for s in scores:
        if s is None or not math.isfinite(float(s)):
            raise RewardError(f"reward {name!r} returned a non-finite score {s!r}")
        out.append(float(s))
    return out


def combine_rewards(reward_funcs: Sequence[str | Callable[..., Any]] | str | Callable[..., Any], weights: Sequence[float] | None = None) -> Callable[..., list[float]]:
    """One GRPO-compatible reward: the weighted sum of ``reward_funcs`` with weights renormalized to sum to one."""
    funcs = [reward_funcs] if isinstance(reward_funcs, str) or callable(reward_funcs) else list(reward_funcs)
    if not funcs:
        raise ValueError("combine_rewards needs at least one reward function")
    resolved = [resolve_reward(f) for f in funcs]
    w = [1.0] * len(resolved) if weights is None else [float(x) for x in weights]
    if len(w) != len(resolved):
        raise ValueError(f"combine_rewards: {len(w)} weights for {len(resolved)} reward functions")
    if any(x < 0 or not math.isfinite(x) for x in w) or sum(w) <= 0:
        raise ValueError(f"combine_rewards: weights must be finite, non-negative and not all zero, got {w}")
    total = sum(w)
    norm = [x / total for x in w]

    def combined_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
        # Agentic rollouts forward their structured completions (messages incl. tool turns).
        structured = kwargs.pop("agent_completions", None)
        if structured is not None and len(structured) == len(completions):
            completions = structured
        acc = [0.0] * len(completions)
        for func, weight in zip(resolved, norm):
            for i, s in enumerate(call_reward(func, completions, **kwargs)):
                acc[i] += weight * s
        return acc

    combined_reward.__name__ = "combined_reward"
    combined_reward.weights = dict(zip([getattr(f, "__name__", repr(f)) for f in resolved], norm))  # type: ignore[attr-defined]
    return combined_reward
