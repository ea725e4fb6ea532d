"""Evaluation mode (paper §3.8): a compiled template over labelled inputs, with thresholds that block the next step.

A training or deployment step calls ``evaluate_template(...).require()`` (or ``agenttune decide evaluate``, which
exits 1): below the configured accuracy, or above the configured error rate, the step does not run.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from agenttune_lib.decide.config import expected_labels
from agenttune_lib.decide.errors import DecideError

__all__ = ["DecideEvaluation", "evaluate_template", "DEFAULT_THRESHOLDS"]

#: Used when neither the caller nor the template's ``settings.evaluation`` sets a threshold.
DEFAULT_THRESHOLDS = {"min_accuracy": 0.8, "max_error_rate": 0.1}


@dataclasses.dataclass
class DecideEvaluation:
    """Accuracy of the verdict labels against the expected ones, the share of runs that errored, and the verdict
    of the thresholds (``passed``, with each failed threshold named in ``failures``)."""

    template_id: str
    n: int
    accuracy: float
    error_rate: float
    per_label: dict[str, dict[str, int]]
    thresholds: dict[str, float]
    failures: list[str]
    rows: list[dict[str, Any]]

    @property
    def passed(self) -> bool:
        return not self.failures

    def require(self) -> "DecideEvaluation":
        """Raise DecideError naming every failed threshold: what a gated training or deployment step calls first."""
        if self.failures:
            raise DecideError(f"template {self.template_id!r} evaluation blocks the next step: {'; '.join(self.failures)}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "rows"} | {"passed": self.passed}


def evaluate_template(
    runner: Any, rows: Iterable[Mapping[str, Any]], label_key: str = "expected_label", thresholds: Mapping[str, float] | None = None
) -> DecideEvaluation:
    """Run ``runner`` over labelled rows (``label_key`` holds the expected verdict label; it is removed from the
    input) and check ``min_accuracy`` / ``max_error_rate`` (caller's, else the template's ``settings.evaluation``,
    else ``DEFAULT_THRESHOLDS``). A run still waiting for a review counts as wrong."""
    limits = {**DEFAULT_THRESHOLDS, **(runner.config.settings.get("evaluation") or {}), **(thresholds or {})}
    unknown = set(limits) - set(DEFAULT_THRESHOLDS)
    if unknown:
        raise DecideError(f"unknown evaluation thresholds {sorted(unknown)}; known: {sorted(DEFAULT_THRESHOLDS)}")
    out_rows: list[dict[str, Any]] = []
    per_label: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    correct = errors = 0
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or label_key not in row:
            raise DecideError(f"evaluation row {i} has no {label_key!r} (the expected verdict label)")
        try:  # one label, or the list of labels an ambiguous row accepts
            accepted = expected_labels(row[label_key])
        except ValueError as exc:
            raise DecideError(f"evaluation row {i}: {exc}") from None
        expected = " | ".join(accepted)
        state = runner.run({k: v for k, v in row.items() if k != label_key})
        got = str(state.verdict.get("label"))
        ok = got in accepted and state.status == "completed"
        correct += ok
        errors += state.status in ("error", "step_limit")
        per_label[expected]["n"] += 1
        per_label[expected]["correct"] += ok
        out_rows.append({"run_id": state.run_id, "expected": expected, "label": got, "status": state.status, "correct": ok})
    n = len(out_rows)
    if n == 0:
        raise DecideError("evaluation needs at least one labelled row")
    accuracy, error_rate = correct / n, errors / n
    failures = []
    if accuracy < float(limits["min_accuracy"]):
        failures.append(f"accuracy {accuracy:.3f} < min_accuracy {float(limits['min_accuracy']):g} over {n} rows")
    if error_rate > float(limits["max_error_rate"]):
        failures.append(f"error rate {error_rate:.3f} > max_error_rate {float(limits['max_error_rate']):g} over {n} rows")
    return DecideEvaluation(runner.config.id, n, accuracy, error_rate, {k: dict(v) for k, v in per_label.items()},
                            {k: float(v) for k, v in limits.items()}, failures, out_rows)
