"""One model's evaluation report (BFCL per category, τ² success, trajectory metrics) and its warehouse table."""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.evaluation.settings import EvalSettings

__all__ = [
    "EVALUATION_REPORTS_TABLE", "EvaluationConfig", "EvaluationReport", "build_report", "calibration_report", "compare_reports", "deployed_adapter_id",
    "evaluate_model", "latest_report", "write_report",
]

EVALUATION_REPORTS_TABLE = "evaluation_reports"


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
    """What to run: BFCL categories and sample size, τ² split/tasks/steps, and the seeded conditions."""

    bfcl_categories: tuple[str, ...] = ("simple_python", "multiple", "parallel", "irrelevance")
    bfcl_limit: int | None = 2
    bfcl_sample_seed: int | None = None
    tau2_split: str = "test"
    tau2_limit: int | None = 1
    tau2_max_steps: int = 4
    settings: EvalSettings = EvalSettings()

    def fingerprint(self) -> str:
        """A short hash of the whole configuration: reports with equal fingerprints are comparable."""
        body = json.dumps(dataclasses.asdict(self), sort_keys=True, default=list)
        return hashlib.sha256(body.encode()).hexdigest()[:12]


@dataclasses.dataclass
class EvaluationReport:
    """Scores of one model (a base checkpoint or an adapter on it) under one configuration."""

    report_id: str
    adapter_id: str
    model_kind: str
    base_model: str
    config_fingerprint: str
    created_at: str
    bfcl: dict[str, Any] | None
    tau2: dict[str, Any] | None
    trajectory_means: dict[str, float]
    settings: dict[str, Any]
    run_id: str | None = None
    asset_key: str | None = None

    @property
    def bfcl_overall(self) -> dict[str, Any] | None:
        return (self.bfcl or {}).get("overall")

    @property
    def tau2_success(self) -> dict[str, Any] | None:
        return (self.tau2 or {}).get("success")

    def category_rows(self) -> list[dict[str, Any]]:
        """One row per scored category (BFCL categories, then τ² success): mean, std, seeds, n."""
        rows = []
        for cat, agg in ((self.bfcl or {}).get("categories") or {}).items():
            n = (self.bfcl or {}).get("settings", {}).get("n_per_category", {}).get(cat)
            rows.append({"benchmark": "bfcl", "category": cat, "mean": agg["mean"], "std": agg["std"], "n_seeds": agg["n_seeds"], "n_items": n})
        if self.tau2_success:
            s = self.tau2_success
            rows.append({"benchmark": "tau2", "category": f"retail_{(self.tau2 or {}).get('settings', {}).get('split', '')}", "mean": s["mean"],
                         "std": s["std"], "n_seeds": s["n_seeds"], "n_items": (self.tau2 or {}).get("settings", {}).get("n_tasks")})
        return rows

    def to_row(self) -> dict[str, Any]:
        """The ``evaluation_reports`` row: headline numbers as columns, full detail as JSON."""
        overall = self.bfcl_overall or {}
        tau = self.tau2_success or {}
        return {
            "report_id": self.report_id, "adapter_id": self.adapter_id, "model_kind": self.model_kind, "base_model": self.base_model,
            "config_fingerprint": self.config_fingerprint, "created_at": dt.datetime.fromisoformat(self.created_at),
            "run_id": self.run_id, "asset_key": self.asset_key,
            "bfcl_overall_mean": overall.get("mean"), "bfcl_overall_std": overall.get("std"),
            "tau2_success_mean": tau.get("mean"), "tau2_success_std": tau.get("std"),
            "tac": self.trajectory_means.get("TAC"), "lcf": self.trajectory_means.get("LCF"),
            "template_mode": self.settings.get("template_mode"), "keep_thinking_history": self.settings.get("keep_thinking_history"),
            "system_prompt_sha256": json.dumps(self.settings.get("system_prompt_sha256", {}), sort_keys=True),
            "seeds": json.dumps(self.settings.get("seeds")),
            "trajectory_means": json.dumps(self.trajectory_means, sort_keys=True),
            "bfcl": json.dumps(self.bfcl, sort_keys=True, default=str), "tau2": json.dumps(self.tau2, sort_keys=True, default=str),
            "settings": json.dumps(self.settings, sort_keys=True, default=str),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "EvaluationReport":
        created = row["created_at"]
        return cls(
            report_id=row["report_id"], adapter_id=row["adapter_id"], model_kind=row["model_kind"], base_model=row["base_model"],
            config_fingerprint=row["config_fingerprint"], created_at=created.isoformat() if hasattr(created, "isoformat") else str(created),
            bfcl=json.loads(row["bfcl"]) if row.get("bfcl") else None, tau2=json.loads(row["tau2"]) if row.get("tau2") else None,
            trajectory_means=json.loads(row["trajectory_means"] or "{}"), settings=json.loads(row["settings"] or "{}"),
            run_id=row.get("run_id"), asset_key=row.get("asset_key"),
        )


def evaluate_model(
    generate: Callable[..., str],
    adapter_id: str,
    base_model: str,
    config: EvaluationConfig | None = None,
    model_kind: str = "adapter",
    progress: Callable[[str, int], None] | None = None,
) -> EvaluationReport:
    """BFCL and τ² under ``config`` for one model; trajectory metrics come from its τ² episodes."""
    from agenttune_lib.evaluation.bfcl.runner import run_bfcl
    from agenttune_lib.evaluation.tau2 import run_tau2

    if model_kind not in ("base", "adapter"):
        raise ValueError(f"model_kind must be 'base' or 'adapter', got {model_kind!r}")
    config = config or EvaluationConfig()
    bfcl = tau = None
    if config.bfcl_categories:
        bfcl = run_bfcl(generate, config.bfcl_categories, limit=config.bfcl_limit, settings=config.settings,
                        sample_seed=config.bfcl_sample_seed, progress=progress).to_dict()
        for item in bfcl["items"]:
            item["output"] = item["output"][:300]
    if config.tau2_limit != 0:
        tau = run_tau2(generate, split=config.tau2_split, limit=config.tau2_limit, settings=config.settings,
                       max_steps=config.tau2_max_steps, progress=progress).to_dict()
    return build_report(adapter_id, base_model, config, bfcl, tau, model_kind)


def build_report(
    adapter_id: str,
    base_model: str,
    config: EvaluationConfig,
    bfcl: dict[str, Any] | None,
    tau2: dict[str, Any] | None,
    model_kind: str = "adapter",
    source: str = "evaluation_report",
) -> EvaluationReport:
    """A report from ``BFCLResult.to_dict()`` / ``Tau2Result.to_dict()`` outputs run under ``config``; ``source`` says what ran it."""
    if model_kind not in ("base", "adapter"):
        raise ValueError(f"model_kind must be 'base' or 'adapter', got {model_kind!r}")
    traj = {k: v["mean"] for k, v in ((tau2 or {}).get("trajectory") or {}).items()}
    settings = {
        "seeds": list(config.settings.seeds), "template_mode": config.settings.template_mode,
        "keep_thinking_history": config.settings.keep_thinking_history, "temperature": config.settings.temperature,
        "max_new_tokens": config.settings.max_new_tokens,
        "system_prompt_sha256": {k: r["settings"]["system_prompt_sha256"] for k, r in (("bfcl", bfcl), ("tau2", tau2)) if r},
        "source": source,
    }
    now = dt.datetime.now(dt.timezone.utc)
    fp = config.fingerprint()
    report_id = hashlib.sha256(f"{adapter_id}|{fp}|{now.isoformat()}".encode()).hexdigest()[:16]
    return EvaluationReport(report_id=report_id, adapter_id=adapter_id, model_kind=model_kind, base_model=base_model,
                            config_fingerprint=fp, created_at=now.isoformat(), bfcl=bfcl, tau2=tau2, trajectory_means=traj, settings=settings)


def write_report(warehouse: Any, report: EvaluationReport) -> None:
    """Upsert the report into ``evaluation_reports`` (idempotent on report_id)."""
    import pyarrow as pa

    row = report.to_row()
    schema = pa.schema([
        ("report_id", pa.string()), ("adapter_id", pa.string()), ("model_kind", pa.string()), ("base_model", pa.string()),
        ("config_fingerprint", pa.string()), ("created_at", pa.timestamp("us", tz="UTC")), ("run_id", pa.string()), ("asset_key", pa.string()),
        ("bfcl_overall_mean", pa.float64()), ("bfcl_overall_std", pa.float64()), ("tau2_success_mean", pa.float64()),
        ("tau2_success_std", pa.float64()), ("tac", pa.float64()), ("lcf", pa.float64()), ("template_mode", pa.string()),
        ("keep_thinking_history", pa.bool_()), ("system_prompt_sha256", pa.string()), ("seeds", pa.string()),
        ("trajectory_means", pa.string()), ("bfcl", pa.string()), ("tau2", pa.string()), ("settings", pa.string()),
    ])
    warehouse.upsert_arrow(EVALUATION_REPORTS_TABLE, pa.Table.from_pylist([row], schema=schema), key="report_id")


def latest_report(warehouse: Any, adapter_id: str, config_fingerprint: str | None = None) -> EvaluationReport | None:
    """The newest report for ``adapter_id`` (and configuration, when given); None when there is none."""
    if not warehouse.has_table(EVALUATION_REPORTS_TABLE):
        return None
    sql = f"SELECT * FROM {EVALUATION_REPORTS_TABLE} WHERE adapter_id = ?"
    params: list[Any] = [adapter_id]
    if config_fingerprint is not None:
        sql += " AND config_fingerprint = ?"
        params.append(config_fingerprint)
    rows = warehouse.query_arrow(sql + " ORDER BY created_at DESC LIMIT 1", params).to_pylist()
    return EvaluationReport.from_row(rows[0]) if rows else None


def deployed_adapter_id(warehouse: Any) -> str | None:
    """The adapter the latest ``deployments`` row put in service; None before any deployment."""
    if not warehouse.has_table("deployments"):
        return None
    rows = warehouse.execute("SELECT adapter_id FROM deployments ORDER BY created_at DESC LIMIT 1")
    return rows[0][0] if rows else None


def compare_reports(candidate: EvaluationReport, deployed: EvaluationReport, tac_tolerance: float = 0.05, lcf_tolerance: float = 0.05) -> dict[str, Any]:
    """Regression check: TAC may not fall, nor LCF rise, by more than the tolerance against the deployed report.

    A metric missing from either report cannot regress and is listed under ``missing``.
    """
    out: dict[str, Any] = {"passed": True, "reasons": [], "missing": []}
    for metric, direction, tol in (("TAC", 1, tac_tolerance), ("LCF", -1, lcf_tolerance)):
        new, old = candidate.trajectory_means.get(metric), deployed.trajectory_means.get(metric)
        out[f"{metric}_candidate"], out[f"{metric}_deployed"] = new, old
        if new is None or old is None:
            out["missing"].append(metric)
            continue
        delta = (new - old) * direction
        if delta < -tol:
            out["passed"] = False
            out["reasons"].append(f"{metric} {'fell' if direction > 0 else 'rose'} from {old:.3f} to {new:.3f} (tolerance {tol})")
    return out


def calibration_report(warehouse: Any, base_model_id: str | None = None, min_seeds: int = 3) -> EvaluationReport | None:
    """The newest base-model report run over at least ``min_seeds`` seeds (bench/calibration.py writes these)."""
    if not warehouse.has_table(EVALUATION_REPORTS_TABLE):
        return None
    sql = f"SELECT * FROM {EVALUATION_REPORTS_TABLE} WHERE model_kind = 'base'"
    params: list[Any] = []
    if base_model_id is not None:
        sql += " AND adapter_id = ?"
        params.append(base_model_id)
    for row in warehouse.query_arrow(sql + " ORDER BY created_at DESC", params).to_pylist():
        if len(json.loads(row["seeds"] or "[]")) >= min_seeds and json.loads(row["settings"] or "{}").get("source") == "calibration":
            return EvaluationReport.from_row(row)
    return None
