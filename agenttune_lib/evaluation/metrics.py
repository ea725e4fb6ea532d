"""Text metrics behind one interface: ``Metric.compute(predictions, references) -> dict`` and ``safe_compute``."""
from __future__ import annotations

import importlib
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["BleuMetric", "ExactMatchMetric", "Metric", "MetricDependencyError", "RougeMetric", "require"]


class MetricDependencyError(ImportError):
    """A metric's library is missing; the message carries the install command."""


def require(module: str, pip_name: str, metric: str) -> Any:
    """Import ``module`` for ``metric`` or raise with the install hint (never fall back to a zero)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MetricDependencyError(f"{metric} needs {module!r}: pip install {pip_name}  ({exc})") from exc


class Metric:
    """Subclass and implement ``compute``; ``safe_compute`` turns a failed batch into an explicit error metric."""

    name: str = "metric"

    def compute(self, predictions: Sequence[str], references: Sequence[Any]) -> dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} must implement compute(predictions, references)")

    def safe_compute(self, predictions: Sequence[str], references: Sequence[Any]) -> dict[str, Any]:
        """``compute``'s dict, or ``{"<name>_error": message, "<name>_failed": 1.0}`` when the batch fails.

        A missing library still raises: that is a setup error, not a property of the batch.
        """
        try:
            return self.compute(predictions, references)
        except MetricDependencyError:
            raise
        except Exception as exc:  # a user metric may fail in any way; report it, never a silent zero
            return {f"{self.name}_error": f"{type(exc).__name__}: {exc}", f"{self.name}_failed": 1.0}

    @staticmethod
    def _check(predictions: Sequence[Any], references: Sequence[Any]) -> None:
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
        if not predictions:
            raise ValueError("no predictions to score")


def _refs(ref: Any) -> list[str]:
    return [str(r) for r in ref] if isinstance(ref, (list, tuple)) else [str(ref)]


class RougeMetric(Metric):
    """ROUGE-1/2/L F-measure (``rouge-score``), best over each item's references, averaged."""

    name = "rouge"

    def __init__(self, types: Sequence[str] = ("rouge1", "rouge2", "rougeL"), use_stemmer: bool = True) -> None:
        self.types = tuple(types)
        self.use_stemmer = use_stemmer

    def compute(self, predictions: Sequence[str], references: Sequence[Any]) -> dict[str, float]:
        rouge_scorer = require("rouge_score.rouge_scorer", "rouge-score", "RougeMetric")
        self._check(predictions, references)
        scorer = rouge_scorer.RougeScorer(list(self.types), use_stemmer=self.use_stemmer)
        out = {}
        for t in self.types:
            vals = [max(scorer.score(r, str(p))[t].fmeasure for r in _refs(ref)) for p, ref in zip(predictions, references)]
            out[t] = statistics.fmean(vals)
        return out


class BleuMetric(Metric):
    """Corpus BLEU (``sacrebleu``) on the 0-100 scale, with each item's references."""

    name = "bleu"

    def compute(self, predictions: Sequence[str], references: Sequence[Any]) -> dict[str, float]:
        sacrebleu = require("sacrebleu", "sacrebleu", "BleuMetric")
        self._check(predictions, references)
        refs = [_refs(r) for r in references]
        width = max(len(r) for r in refs)
        streams = [[r[i] if i < len(r) else r[0] for r in refs] for i in range(width)]
        return {"bleu": float(sacrebleu.corpus_bleu([str(p) for p in predictions], streams).score)}


class ExactMatchMetric(Metric):
    """Share of predictions equal to a reference after stripping and case-folding."""

    name = "exact_match"

    def compute(self, predictions: Sequence[str], references: Sequence[Any]) -> dict[str, float]:
        self._check(predictions, references)
        hits = [str(p).strip().casefold() in {r.strip().casefold() for r in _refs(ref)} for p, ref in zip(predictions, references)]
        return {"exact_match": sum(hits) / len(hits)}
