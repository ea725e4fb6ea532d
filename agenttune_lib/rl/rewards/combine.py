"""combine_rewards: several reward functions (callables or registry names) as one weighted GRPO reward."""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.rl.rewards.builtin import ENVIRONMENT_REWARDS, REWARD_REGISTRY, RewardError


def resolve_reward(func: str | Callable[..., Any]) -> Callable[..., Any]:
    """A registry name or a callable as a callable; an unknown name lists the known ones."""
    if isinstance(func, str) and ":" in func:  # package.module:attr, as for tools
        import importlib

        module_name, attr = func.split(":", 1)
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise KeyError(f"cannot import reward {func!r}: {exc}") from None
        if not callable(obj):
            raise KeyError(f"reward {func!r} is not callable")
        return obj
    if isinstance(func, str):
        if func in ENVIRONMENT_REWARDS:
            return ENVIRONMENT_REWARDS[func]
        if func not in REWARD_REGISTRY:
            raise KeyError(f"unknown reward {func!r}; registered: {sorted(REWARD_REGISTRY) + sorted(ENVIRONMENT_REWARDS)}")
        return REWARD_REGISTRY[func]
    if not callable(func):
        raise TypeError(f"a reward must be a callable or a registry name, got {type(func).__name__}")
    return func


def _calling_convention(func: Callable[..., Any]) -> tuple[str, set[str] | None]:
    """("keyword", accepted names or None for **kwargs) or ("positional", None) for ``func(completions)``."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return "keyword", None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return "keyword", None
    if "completions" in params:
        return "keyword", {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return "positional", None


def _item_label(i: int, kwargs: dict[str, Any]) -> str:
    for key in ("task_id", "trajectory_ids", "prompts"):
        col = kwargs.get(key)
        if isinstance(col, (list, tuple)) and i < len(col):
            text = str(col[i])
            return f"item {i} ({key}={text[:80]!r})"
    return f"item {i}"


def _row(kwargs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    return {k: ([v[i]] if isinstance(v, (list, tuple)) and len(v) == n else v) for k, v in kwargs.items()}


def call_reward(func: Callable[..., Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Score with TRL's keyword convention (every dataset column a function accepts reaches it), or ``func(completions)``
    for a function that takes no ``completions`` keyword. A raise is a RewardError naming the reward and the first
    failing item; the result must be one finite float per completion.
    """
    func = resolve_reward(func)
    name = getattr(func, "__name__", type(func).__name__)
    mode, accepted = _calling_convention(func)
    n = len(completions)
    if mode == "keyword":
        missing = []
        if accepted is not None:
            try:
                params = inspect.signature(func).parameters
                missing = [k for k, p in params.items() if p.default is p.empty and p.kind is not p.VAR_POSITIONAL and k != "completions" and k not in kwargs]
            except (TypeError, ValueError):
                missing = []
        if missing:
            raise RewardError(f"reward {name!r} needs column(s) {missing}; the batch carries {sorted(kwargs)}")
        passed = kwargs if accepted is None else {k: v for k, v in kwargs.items() if k in accepted}
        run = lambda comps, kw: func(completions=comps, **kw)  # noqa: E731
    else:
        passed = {}
        run = lambda comps, kw: func(comps)  # noqa: E731
    try:
        scores = run(list(completions), passed)
    except RewardError:
        raise
    except Exception as exc:
        label = "the batch"
        for i in range(n):  # name the first item that fails on its own
            try:
                run([completions[i]], _row(passed, i, n))
            except Exception:
                label = _item_label(i, kwargs)
                break
        raise RewardError(f"reward {name!r} raised on {label}: {type(exc).__name__}: {exc}") from exc
    if scores is None:
        raise RewardError(f"reward {name!r} returned None")
    scores = list(scores)
    if len(scores) != n:
        raise RewardError(f"reward {name!r} returned {len(scores)} scores for {n} completions")
    out = []
    for i, s in enumerate(scores):
        if s is None or not math.isfinite(float(s)):
            raise RewardError(f"reward {name!r} returned a non-finite score {s!r} for {_item_label(i, kwargs)}")
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
