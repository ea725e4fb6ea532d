"""Offline training rows derived from rollouts: reward-ranked DPO pairs and labelled BCO rows."""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["preference_pairs_from_rollouts", "bco_rows_from_rollouts"]


def _assistant_text(completion: list[dict[str, Any]]) -> str:
    return "\n".join(m["content"] for m in completion if m.get("role") == "assistant")


def _as_chat(prompt: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def _sample(engine: Any, prompts: Sequence[Any], n: int, tools: Any, reward_fn: Any, sink: Any, **reward_kwargs: Any) -> list[tuple[Any, list[Any], list[float], list[str]]]:
    if n < 2:
        raise ValueError(f"need at least 2 rollouts per prompt to rank them, got n={n}")
    repeated = [p for p in prompts for _ in range(n)]
    cols = {k: [v for v in vals for _ in range(n)] for k, vals in reward_kwargs.items()}
    out = engine.rollout(repeated, tools=tools, reward_fn=reward_fn, **cols)
    if sink is not None:
        sink(out["trajectories"])
    groups = []
    for i, prompt in enumerate(prompts):
        sl = slice(i * n, (i + 1) * n)
        groups.append((prompt, out["completions"][sl], out["rewards"][sl], [t.id for t in out["trajectories"][sl]]))
    return groups


def preference_pairs_from_rollouts(
    engine: Any,
    prompts: Sequence[Any],
    reward_fn: Callable[..., Any] | str | Sequence[Any],
    n: int = 4,
    tools: Any = None,
    min_margin: float = 1e-6,
    sink: Callable[[list[Any]], None] | None = None,
    **reward_kwargs: Any,
) -> list[dict[str, Any]]:
    """DPO rows: per prompt, the best- vs worst-rewarded of n rollouts; ties (no margin) give no pair."""
    rows = []
    for prompt, comps, rewards, ids in _sample(engine, prompts, n, tools, reward_fn, sink, **reward_kwargs):
        hi = max(range(n), key=lambda j: rewards[j])
        lo = min(range(n), key=lambda j: rewards[j])
        if rewards[hi] - rewards[lo] < min_margin:
            continue
        rows.append(
            {
                "prompt": _as_chat(prompt),
                "chosen": [{"role": "assistant", "content": _assistant_text(comps[hi])}],
                "rejected": [{"role": "assistant", "content": _assistant_text(comps[lo])}],
                "chosen_trajectory_id": ids[hi],
                "rejected_trajectory_id": ids[lo],
                "margin": rewards[hi] - rewards[lo],
            }
        )
    return rows


def bco_rows_from_rollouts(
    engine: Any,
    prompts: Sequence[Any],
    reward_fn: Callable[..., Any] | str | Sequence[Any],
    n: int = 4,
    tools: Any = None,
    threshold: float | None = None,
    sink: Callable[[list[Any]], None] | None = None,
    **reward_kwargs: Any,
) -> list[dict[str, Any]]:
    """BCO rows: every rollout labelled desirable when its reward beats ``threshold`` (default: the batch median)."""
    groups = _sample(engine, prompts, n, tools, reward_fn, sink, **reward_kwargs)
    all_rewards = [r for _, _, rs, _ in groups for r in rs]
    cut = statistics.median(all_rewards) if threshold is None else threshold
    rows = []
    for prompt, comps, rewards, ids in groups:
        for comp, r, tid in zip(comps, rewards, ids):
            rows.append(
                {
                    "prompt": _as_chat(prompt),
                    "completion": [{"role": "assistant", "content": _assistant_text(comp)}],
                    "label": bool(r > cut),
                    "trajectory_id": tid,
                    "reward": r,
                }
            )
    return rows
