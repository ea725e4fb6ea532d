"""Summary rows in ``evaluation_reports`` for readers of the older per-model report (the closed loop's TAC/LCF arm).

The paired per-item tables are the source of truth; this writes each freshly evaluated model's
trajectory means (TAC, LCF over its QA and τ² episodes) and τ² success as one report row.
"""
from __future__ import annotations

import datetime as dt
import statistics
from typing import Any

from agenttune_lib.evaluation.report_model import EvaluationReport, write_report

__all__ = ["write_legacy_reports"]


def _means(results: list[Any], key: str) -> float | None:
    vals = [float(r["metrics"][key]) for res in results for r in res.rows if (r.get("metrics") or {}).get(key) is not None]
    return statistics.fmean(vals) if vals else None


def write_legacy_reports(warehouse: Any, report: Any, config: Any, run_id: str | None = None, asset_key: str | None = None) -> list[EvaluationReport]:
    """One ``evaluation_reports`` row per model evaluated in this run (reused base rows are not re-reported)."""
    out = []
    for label, model_id, kind in (("base", report.base_id, "base"), ("candidate", report.candidate_id, "adapter")):
        if model_id is None:
            continue
        results = [pair[label] for suite, pair in report.results.items()
                   if pair.get(label) is not None and "+" not in suite and not suite.startswith("bfcl")
                   and suite not in (report.reused if label == "base" else {})]
        if not results:
            continue
        traj = {k: v for k, v in (("TAC", _means(results, "TAC")), ("LCF", _means(results, "LCF"))) if v is not None}
        tau = next((pair[label] for s, pair in report.results.items() if s == "tau2" and pair.get(label) is not None), None)
        tau2 = None
        if tau is not None:
            tau2 = {"success": {"mean": tau.mean("success"), "std": 0.0, "n_seeds": 1}, "settings": {"split": "test", "n_tasks": tau.n},
                    "config_hash": tau.config_hash}
        rep = EvaluationReport(
            report_id=f"{report.report_id}:{label}", adapter_id=model_id, model_kind=kind, base_model=report.base_id,
            config_fingerprint=config.fingerprint(), created_at=dt.datetime.now(dt.timezone.utc).isoformat(), bfcl=None, tau2=tau2,
            trajectory_means=traj, settings={"source": "evaluation_report", "paired_report_id": report.report_id, "decoding": config.decoding(),
                                             "seeds": [config.seed], "template_mode": "native", "keep_thinking_history": True},
            run_id=run_id, asset_key=asset_key,
        )
        write_report(warehouse, rep)
        out.append(rep)
    return out
