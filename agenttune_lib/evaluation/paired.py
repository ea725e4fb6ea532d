"""Paired base-vs-candidate comparison on the same items: mean difference, bootstrap interval, detectable effect.

The interval is scipy's paired bootstrap (BCa); the minimum detectable effect and the sample size
needed for a configured minimum gain come from statsmodels' power analysis of a paired t-test on
the per-item differences. Nothing here is hand-rolled statistics.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["PairedComparison", "paired_comparison", "ConfigMismatchError"]


class ConfigMismatchError(ValueError):
    """Two score sets were made under different evaluation configs, so a difference between them means nothing."""


@dataclasses.dataclass(frozen=True)
class PairedComparison:
    """Candidate minus base on ``n`` shared items, with a ``confidence`` interval and what this n can detect."""

    metric: str
    n: int
    base_mean: float
    candidate_mean: float
    diff: float
    ci_low: float
    ci_high: float
    confidence: float
    mde: float
    min_gain: float
    n_required: int | None
    sd_diff: float
    sd_source: str
    method: str

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly above or below 0 (a detected difference)."""
        return self.ci_low > 0 or self.ci_high < 0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "excludes_zero": self.excludes_zero}


def _as_floats(name: str, xs: Sequence[Any]) -> list[float]:
    out = []
    for i, x in enumerate(xs):
        if x is None:
            raise ValueError(f"{name}[{i}] is None: every paired item needs a score from both models")
        try:
            v = float(x)
        except (TypeError, ValueError):
            raise ValueError(f"{name}[{i}] = {x!r} is not a number") from None
        if math.isnan(v):
            raise ValueError(f"{name}[{i}] is NaN: every paired item needs a score from both models")
        out.append(v)
    return out


def _planning_sd(diffs: Any, base: Any, cand: Any) -> tuple[float, str]:
    """The sd of per-item differences; when it is 0 (identical outputs) the unpaired sd, else 0.5 (a 0/1 score's largest sd)."""
    import numpy as np

    sd = float(np.std(diffs, ddof=1))
    if sd > 0:
        return sd, "observed"
    sd = float(math.sqrt(np.var(base, ddof=1) + np.var(cand, ddof=1)))
    if sd > 0:
        return sd, "unpaired"
    return 0.5, "assumed_binary_max"


def paired_comparison(
    base_scores: Sequence[Any],
    candidate_scores: Sequence[Any],
    metric: str = "score",
    confidence: float = 0.95,
    min_gain: float = 0.05,
    alpha: float = 0.05,
    power: float = 0.8,
    n_resamples: int = 2000,
    seed: int = 0,
) -> PairedComparison:
    """Mean paired difference (candidate - base) with scipy's paired bootstrap interval, the MDE at this n, and the n for ``min_gain``.

    Scores are per item and aligned (item i of both lists is the same item). The MDE is the
    smallest true difference a two-sided paired t-test at ``alpha`` detects with ``power``
    given the per-item spread; ``n_required`` is the item count that detects ``min_gain``.
    """
    import numpy as np
    from scipy import stats
    from statsmodels.stats.power import TTestPower

    base = np.asarray(_as_floats("base_scores", base_scores))
    cand = np.asarray(_as_floats("candidate_scores", candidate_scores))
    if len(base) != len(cand):
        raise ValueError(f"paired comparison needs the same items for both models: {len(base)} base vs {len(cand)} candidate scores")
    if len(base) < 2:
        raise ValueError(f"paired comparison of {metric!r} needs at least 2 items, got {len(base)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if min_gain <= 0:
        raise ValueError(f"min_gain must be > 0, got {min_gain}")
    diffs = cand - base
    diff = float(diffs.mean())

    def stat(b: Any, c: Any, axis: int = -1) -> Any:
        return np.mean(c - b, axis=axis)

    method = "BCa"
    if np.all(diffs == diffs[0]):
        # Every resample has the same mean: the interval is that point (BCa is undefined there).
        low = high = diff
        method = "degenerate"
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = stats.bootstrap((base, cand), stat, paired=True, vectorized=True, confidence_level=confidence,
                                  n_resamples=n_resamples, method="BCa", rng=np.random.default_rng(seed))
            low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
            if not (math.isfinite(low) and math.isfinite(high)):
                method = "percentile"
                res = stats.bootstrap((base, cand), stat, paired=True, vectorized=True, confidence_level=confidence,
                                      n_resamples=n_resamples, method="percentile", rng=np.random.default_rng(seed))
                low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    sd, sd_source = _planning_sd(diffs, base, cand)
    analysis = TTestPower()
    effect = float(analysis.solve_power(effect_size=None, nobs=len(diffs), alpha=alpha, power=power, alternative="two-sided"))
    try:
        n_req = int(math.ceil(float(analysis.solve_power(effect_size=min_gain / sd, nobs=None, alpha=alpha, power=power, alternative="two-sided"))))
    except (ValueError, RuntimeError):
        n_req = None
    return PairedComparison(
        metric=metric, n=int(len(diffs)), base_mean=float(base.mean()), candidate_mean=float(cand.mean()), diff=diff,
        ci_low=low, ci_high=high, confidence=confidence, mde=effect * sd, min_gain=min_gain, n_required=n_req,
        sd_diff=sd, sd_source=sd_source, method=method,
    )
