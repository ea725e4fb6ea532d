"""What the DeploymentGate asks of a candidate: superiority on its target suites, non-inferiority on its guards.

A candidate is judged on what it was trained for (its *target* suites: QA for a QA-distilled adapter, the
replayed DECIDE failures for a retrain) with a superiority test on the paired held-out interval, and on
*guard* suites (BFCL irrelevance and simple, DECIDE verdicts, the trajectory composite) with a
non-inferiority margin each. Every criterion names its suite, metric, margin and the items it needs.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SuiteCriterion", "judge_criterion", "lower_bound", "DEFAULT_TARGETS", "DEFAULT_GUARDS", "criteria_from_specs"]


@dataclasses.dataclass(frozen=True)
class SuiteCriterion:
    """One suite/metric of the paired held-out comparison: a target must beat the baseline by more than
    ``margin`` (interval's lower bound), a guard must not fall behind it by more than ``margin``."""

    suite: str
    metric: str
    margin: float = 0.0
    min_n: int = 20

    def __post_init__(self) -> None:
        if not self.suite or not self.metric:
            raise ValueError(f"a gate criterion needs a suite and a metric, got {self.suite!r}/{self.metric!r}")
        if not (math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"criterion {self.key}: margin must be a finite number >= 0, got {self.margin!r}")
        if self.min_n < 2:
            raise ValueError(f"criterion {self.key}: min_n must be >= 2, got {self.min_n}")

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.metric}"


def criteria_from_specs(specs: Sequence[str | Mapping[str, Any]], default_margin: float, default_min_n: int) -> tuple[SuiteCriterion, ...]:
    """Criteria from ``"suite/metric"`` strings (optionally ``"suite/metric@margin"``) or mappings with those keys."""
    out = []
    for spec in specs:
        if isinstance(spec, Mapping):
            out.append(SuiteCriterion(str(spec["suite"]), str(spec["metric"]), float(spec.get("margin", default_margin)),
                                      int(spec.get("min_n", default_min_n))))
            continue
        text, _, margin = str(spec).partition("@")
        suite, sep, metric = text.partition("/")
        if not sep:
            raise ValueError(f"gate criterion {spec!r} is not 'suite/metric' (e.g. 'qa/valid_call' or 'bfcl_platform/score:irrelevance@0.1')")
        try:
            m = float(margin) if margin else default_margin
        except ValueError:
            raise ValueError(f"gate criterion {spec!r}: the margin after '@' is not a number") from None
        out.append(SuiteCriterion(suite, metric, m, default_min_n))
    return tuple(out)


#: What each kind of candidate is trained for. A retrain batch's own target is the replay arm (its failures fixed).
DEFAULT_TARGETS: Mapping[str, tuple[SuiteCriterion, ...]] = {
    "distill": (SuiteCriterion("qa", "valid_call", 0.0, 20),),
}

#: Guards every candidate must not regress (beyond each margin). The DECIDE verdict guard is the gate's own replay.
DEFAULT_GUARDS: tuple[SuiteCriterion, ...] = (
    SuiteCriterion("bfcl_platform", "score:irrelevance", 0.15, 20),
    SuiteCriterion("bfcl_platform", "score:simple_python", 0.15, 20),
    SuiteCriterion("decide", "verdict_accuracy", 0.25, 10),
)


def lower_bound(row: Mapping[str, Any]) -> float | None:
    """The paired difference's lower 95 % bound, oriented so that higher is better.

    Where every item moved alike the bootstrap interval collapses to a point; the bound is then the
    difference less 3/n (the "rule of three": no discordant item among n bounds their rate by about 3/n),
    so a handful of agreeing items cannot clear a margin by themselves.
    """
    diff, n = row.get("diff"), int(row.get("n") or 0)
    higher = row.get("higher_is_better") is not False
    if diff is None or n < 1:
        return None
    low = row.get("ci_low") if higher else (None if row.get("ci_high") is None else -float(row["ci_high"]))
    d = float(diff) if higher else -float(diff)
    degenerate = row.get("ci_low") is not None and row.get("ci_high") is not None and float(row["ci_low"]) == float(row["ci_high"])
    if low is None or degenerate:
        return d - 3.0 / n
    return float(low)


def judge_criterion(criterion: SuiteCriterion, row: Mapping[str, Any] | None, role: str) -> dict[str, Any]:
    """Pass/fail of one target (``role="target"``: lower bound > margin) or guard (lower bound >= -margin)."""
    if role not in ("target", "guard"):
        raise ValueError(f"role must be 'target' or 'guard', got {role!r}")
    out: dict[str, Any] = {"criterion": criterion.key, "role": role, "margin": criterion.margin, "min_n": criterion.min_n}
    if row is None:
        return {**out, "passed": False, "reason": f"{role} {criterion.key}: no paired held-out comparison for the candidate"}
    n = int(row.get("n") or 0)
    low = lower_bound(row)
    out.update({"n": n, "base": row.get("base_mean"), "candidate": row.get("candidate_mean"), "diff": row.get("diff"),
                "ci_low": row.get("ci_low"), "ci_high": row.get("ci_high"), "lower_bound": low, "report_id": row.get("report_id")})
    figures = (f"{_f(row.get('base_mean'))} -> {_f(row.get('candidate_mean'))}, diff {_f(row.get('diff'), '+')} "
               f"[{_f(row.get('ci_low'), '+')}, {_f(row.get('ci_high'), '+')}], n={n}")
    if n < criterion.min_n:
        return {**out, "passed": False, "reason": f"{role} {criterion.key}: only {n} held-out items (need {criterion.min_n}); {figures}"}
    if low is None:
        return {**out, "passed": False, "reason": f"{role} {criterion.key}: no interval; {figures}"}
    if role == "target":
        passed = low > criterion.margin
        why = f"target {criterion.key}: {figures}; lower bound {low:+.3f} does not exceed the superiority margin {criterion.margin:+.3f}"
    else:
        passed = low >= -criterion.margin
        why = f"guard {criterion.key}: {figures}; lower bound {low:+.3f} is below the non-inferiority margin -{criterion.margin:.3f}"
    return {**out, "passed": passed, "reason": None if passed else why}


def _f(x: Any, sign: str = "") -> str:
    return "-" if x is None else f"{float(x):{sign}.3f}"
