"""Seeded score aggregation: every reported score is a mean and spread over seeds, with the conditions recorded."""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["aggregate_seeds"]


def aggregate_seeds(per_seed: Mapping[int, Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """``{metric: {"mean", "std", "min", "max", "n_seeds", "per_seed"}}`` from ``{seed: {metric: value}}``.

    ``std`` is the sample standard deviation (0.0 for one seed). A metric missing for some seed
    is aggregated over the seeds that have it and ``n_seeds`` says how many.
    """
    if not per_seed:
        raise ValueError("aggregate_seeds needs at least one seed's scores")
    metrics: list[str] = []
    for scores in per_seed.values():
        metrics += [m for m in scores if m not in metrics]
    out: dict[str, dict[str, Any]] = {}
    for metric in metrics:
        vals = {s: float(sc[metric]) for s, sc in per_seed.items() if sc.get(metric) is not None}
        if not vals:
            continue
        xs: Sequence[float] = list(vals.values())
        out[metric] = {
            "mean": statistics.fmean(xs),
            "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs),
            "max": max(xs),
            "n_seeds": len(xs),
            "per_seed": {str(s): v for s, v in vals.items()},
        }
    return out
