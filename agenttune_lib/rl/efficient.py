"""Efficient GRPO (tool-calling-rl-efficiency §4): online pre-rollout filtering and max-variance down-sampling.

Both are plain Python so they are testable without a trainer; ``TrlAgenticGRPO`` applies
them around TRL's generation step.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["EfficiencyConfig", "PreRolloutFilter", "max_variance_indices", "prompt_key", "EfficiencyStats"]


@dataclasses.dataclass
class EfficiencyConfig:
    """Switches and knobs for the two accelerations.

    ``k``: skip a prompt whose rollouts were all correct in each of its previous k epochs.
    ``skip_window``: epochs a skipped prompt sits out before it returns to the pool.
    ``correct_threshold``: a rollout is correct when its reward is at least this.
    ``keep_rollouts``: m, the rollouts per prompt kept for the update (None keeps all n).
    """

    pre_rollout_filter: bool = True
    k: int = 1
    skip_window: int = 1
    correct_threshold: float = 1.0
    keep_rollouts: int | None = None

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"EfficiencyConfig.k must be >= 1, got {self.k}")
        if self.skip_window < 1:
            raise ValueError(f"EfficiencyConfig.skip_window must be >= 1, got {self.skip_window}")
        if self.keep_rollouts is not None and self.keep_rollouts < 2:
            raise ValueError(f"EfficiencyConfig.keep_rollouts must be >= 2 (a group needs variance), got {self.keep_rollouts}")


def prompt_key(prompt: Any) -> str:
    """A stable identity for a prompt (text or chat messages)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


@dataclasses.dataclass
class PreRolloutFilter:
    """Online pre-rollout filter: per prompt, whether each visit (epoch) was all-correct, and skips since."""

    k: int = 1
    skip_window: int = 1
    correct_threshold: float = 1.0
    history: dict[str, list[bool]] = dataclasses.field(default_factory=dict)
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)

    def should_skip(self, key: str) -> bool:
        """True to skip generating for this prompt now; counts the skip. A prompt returns after ``skip_window`` skips."""
        hist = self.history.get(key, [])
        if len(hist) >= self.k and all(hist[-self.k :]) and self.skipped.get(key, 0) < self.skip_window:
            self.skipped[key] = self.skipped.get(key, 0) + 1
            return True
        self.skipped[key] = 0
        return False

    def record(self, key: str, rewards: Sequence[float]) -> bool:
        """Record one generated visit; returns whether every rollout was correct."""
        all_correct = bool(rewards) and all(float(r) >= self.correct_threshold for r in rewards)
        self.history.setdefault(key, []).append(all_correct)
        return all_correct


def max_variance_indices(rewards: Sequence[float], m: int) -> list[int]:
    """Indices of the m rewards with the largest variance (Xu et al. 2025): the best split of lowest i and highest m-i."""
    n = len(rewards)
    if m >= n:
        return list(range(n))
    if m < 1:
        raise ValueError(f"max_variance_indices needs m >= 1, got {m}")
    order = sorted(range(n), key=lambda i: (float(rewards[i]), i))
    best: list[int] = order[:m]
    best_var = -1.0
    for low in range(m + 1):
        pick = order[:low] + order[n - (m - low) :] if m - low > 0 else order[:low]
        values = [float(rewards[i]) for i in pick]
        var = statistics.pvariance(values) if len(values) > 1 else 0.0
        if var > best_var + 1e-12:
            best, best_var = pick, var
    return sorted(best)


@dataclasses.dataclass
class EfficiencyStats:
    """One training step's bookkeeping: prompts seen/skipped, zero-variance groups, rollouts generated/used."""

    step: int
    prompts: int
    prompts_skipped: int
    groups: int
    zero_variance_groups: int
    rollouts_generated: int
    rollouts_used: int
    mean_reward: float

    @property
    def frac_skipped(self) -> float:
        return self.prompts_skipped / self.prompts if self.prompts else 0.0

    @property
    def frac_zero_variance(self) -> float:
        return self.zero_variance_groups / self.groups if self.groups else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(frac_skipped=self.frac_skipped, frac_zero_variance=self.frac_zero_variance)
        return d
