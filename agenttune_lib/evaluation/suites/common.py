"""What every suite returns: per-item rows, the config they were scored under (and its hash), timing and batching."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["SuiteResult", "config_hash", "policy_stats", "decoding_of"]


def config_hash(suite: str, config: Any, item_ids: Sequence[str], extra: dict[str, Any] | None = None) -> str:
    """A short hash of the suite, its config, the exact items and prompt facts: equal hashes are comparable results."""
    body = {"suite": suite, "config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config,
            "items": sorted(str(i) for i in item_ids), "extra": extra or {}}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def decoding_of(policy: Any, decoding: Any = None) -> dict[str, Any]:
    """The decoding settings a result is hashed under: ``decoding`` when given, else what the policy declares (greedy by default).

    Pass the same ``decoding`` to compare a scripted policy with a model decoded under those settings.
    """
    if decoding is not None:
        out = dict(decoding)
        if getattr(policy, "constrained", False):
            out["constrained"] = True
        return out
    out = {k: getattr(policy, k) for k in ("max_new_tokens", "temperature", "seed") if hasattr(policy, k)}
    if getattr(policy, "constrained", False):
        out["constrained"] = True
    return out


def policy_stats(policy: Any) -> dict[str, Any]:
    """Generation counters of a batched policy (empty for scripted policies)."""
    stats = getattr(policy, "stats", None)
    if stats is None:
        return {}
    return {"calls": stats.calls, "rows": stats.rows, "new_tokens": stats.new_tokens, "prompt_tokens": stats.prompt_tokens,
            "generate_s": round(stats.seconds, 2), "tokens_per_s": round(stats.tokens_per_s, 2)}


@dataclasses.dataclass
class SuiteResult:
    """One model's run of one suite: per-item rows (item_id, category, output, score, success, excluded, error_type, metrics)."""

    suite: str
    rows: list[dict[str, Any]]
    config: dict[str, Any]
    config_hash: str
    seconds: float
    batch_sizes: list[int] = dataclasses.field(default_factory=list)
    baseline_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    logs: list[Any] = dataclasses.field(default_factory=list, repr=False)

    def mean(self, metric: str = "score", category: str | None = None, include_excluded: bool = False) -> float | None:
        """Mean of ``metric`` over counted rows (``excluded`` rows left out unless asked), optionally one category."""
        vals = []
        for r in self.rows:
            if (r.get("excluded") and not include_excluded) or (category is not None and r.get("category") != category):
                continue
            v = r.get(metric) if metric in ("score", "success") else (r.get("metrics") or {}).get(metric)
            if v is not None:
                vals.append(float(v))
        return statistics.fmean(vals) if vals else None

    @property
    def n(self) -> int:
        return sum(1 for r in self.rows if not r.get("excluded"))

    def categories(self) -> list[str]:
        return sorted({str(r.get("category") or "") for r in self.rows})
