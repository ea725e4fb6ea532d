"""Per-item evaluation results and paired comparisons in the warehouse (TEAM contract 2).

``evaluation_items``: one row per (report, suite, item, model label) with the output, score,
verdict, error type, metrics and the suite's config hash. ``evaluation_comparisons``: one row per
(report, suite, metric) with the paired difference, its bootstrap interval, n and the MDE.
Comparing items scored under different config hashes raises ``ConfigMismatchError``.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agenttune_lib.evaluation.paired import ConfigMismatchError, PairedComparison, paired_comparison

__all__ = [
    "EVALUATION_ITEMS_TABLE", "EVALUATION_COMPARISONS_TABLE", "ConfigMismatchError", "write_items", "load_items",
    "compare_items", "write_comparisons", "latest_comparisons", "find_items_report", "latest_category_scores", "write_config",
]

EVALUATION_ITEMS_TABLE = "evaluation_items"
EVALUATION_COMPARISONS_TABLE = "evaluation_comparisons"
EVALUATION_CONFIGS_TABLE = "evaluation_configs"


def write_config(warehouse: Any, suite: str, config_hash: str, config: Mapping[str, Any]) -> None:
    """Record what a config hash stands for (suite config, items, decoding, prompt settings), keyed by the hash."""
    import pyarrow as pa

    body = {k: v for k, v in config.items() if k != "policy"}
    table = pa.Table.from_pylist([{"config_hash": config_hash, "suite": suite, "config": json.dumps(body, sort_keys=True, default=str),
                                   "created_at": dt.datetime.now(dt.timezone.utc)}],
                                 schema=pa.schema([("config_hash", pa.string()), ("suite", pa.string()), ("config", pa.string()),
                                                   ("created_at", pa.timestamp("us", tz="UTC"))]))
    warehouse.upsert_arrow(EVALUATION_CONFIGS_TABLE, table, key="config_hash")


def _items_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("report_id", pa.string()), ("suite", pa.string()), ("item_id", pa.string()), ("model_label", pa.string()),
        ("adapter_id", pa.string()), ("category", pa.string()), ("output", pa.string()), ("score", pa.float64()),
        ("success", pa.bool_()), ("excluded", pa.bool_()), ("error_type", pa.string()), ("metrics", pa.string()),
        ("config_hash", pa.string()), ("created_at", pa.timestamp("us", tz="UTC")),
    ])


def _comparisons_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("report_id", pa.string()), ("suite", pa.string()), ("metric", pa.string()), ("n", pa.int64()),
        ("base_mean", pa.float64()), ("candidate_mean", pa.float64()), ("diff", pa.float64()), ("ci_low", pa.float64()),
        ("ci_high", pa.float64()), ("mde", pa.float64()), ("min_gain", pa.float64()), ("n_required", pa.int64()),
        ("excludes_zero", pa.bool_()), ("base_label", pa.string()), ("base_id", pa.string()), ("config_hash", pa.string()),
        ("adapter_id", pa.string()), ("created_at", pa.timestamp("us", tz="UTC")), ("headline", pa.bool_()), ("higher_is_better", pa.bool_()),
    ])


#: Metrics where a rise is not an improvement (searches per question: fewer is cheaper, not worse).
NOT_HIGHER_IS_BETTER = frozenset({"searches"})


def write_items(
    warehouse: Any, report_id: str, suite: str, model_label: str, adapter_id: str, rows: Sequence[Mapping[str, Any]], config_hash: str,
    max_output_chars: int = 2000,
) -> int:
    """Upsert one model's per-item rows of one suite (keyed by report, suite, item, label); returns rows written."""
    import pyarrow as pa

    if not rows:
        raise ValueError(f"no {suite} item rows to write for {model_label} in report {report_id}")
    now = dt.datetime.now(dt.timezone.utc)
    data = [{
        "report_id": report_id, "suite": suite, "item_id": str(r["item_id"]), "model_label": model_label, "adapter_id": adapter_id,
        "category": str(r.get("category") or ""), "output": str(r.get("output") or "")[:max_output_chars],
        "score": None if r.get("score") is None else float(r["score"]), "success": None if r.get("success") is None else bool(r["success"]),
        "excluded": bool(r.get("excluded", False)), "error_type": str(r.get("error_type") or ""),
        "metrics": json.dumps(r.get("metrics") or {}, sort_keys=True, default=str), "config_hash": config_hash, "created_at": now,
    } for r in rows]
    table = pa.Table.from_pylist(data, schema=_items_schema())
    return warehouse.upsert_arrow(EVALUATION_ITEMS_TABLE, table, key=["report_id", "suite", "item_id", "model_label"])


def load_items(warehouse: Any, report_id: str, suite: str, model_label: str) -> list[dict[str, Any]]:
    """One model's rows of one suite in one report, metrics decoded, ordered by item id."""
    if not warehouse.has_table(EVALUATION_ITEMS_TABLE):
        return []
    rows = warehouse.query_arrow(
        f"SELECT * FROM {EVALUATION_ITEMS_TABLE} WHERE report_id = ? AND suite = ? AND model_label = ? ORDER BY item_id",
        [report_id, suite, model_label],
    ).to_pylist()
    for r in rows:
        r["metrics"] = json.loads(r["metrics"] or "{}")
    return rows


def find_items_report(warehouse: Any, suite: str, adapter_id: str, config_hash: str) -> tuple[str, str] | None:
    """(report_id, model_label) of the newest stored run of ``adapter_id`` on ``suite`` under ``config_hash``; None if none."""
    if not warehouse.has_table(EVALUATION_ITEMS_TABLE):
        return None
    rows = warehouse.execute(
        f"SELECT report_id, model_label FROM {EVALUATION_ITEMS_TABLE} WHERE suite = ? AND adapter_id = ? AND config_hash = ? "
        "ORDER BY created_at DESC LIMIT 1",
        [suite, adapter_id, config_hash],
    )
    return (rows[0][0], rows[0][1]) if rows else None


def _metric_value(row: Mapping[str, Any], metric: str) -> float | None:
    if metric == "score":
        return row.get("score")
    if metric == "success":
        return None if row.get("success") is None else float(row["success"])
    value = (row.get("metrics") or {}).get(metric)
    return None if value is None else float(value)


def compare_items(
    base_rows: Sequence[Mapping[str, Any]],
    candidate_rows: Sequence[Mapping[str, Any]],
    metrics: Sequence[str] = ("score",),
    by_category: bool = False,
    **paired_kwargs: Any,
) -> list[PairedComparison]:
    """Paired comparisons of two models' rows of one suite: per metric, and per category when asked.

    Both sides must carry one config hash, the same one, and the same item ids; rows marked
    ``excluded`` (e.g. τ² tasks fixed by construction) are left out; an item without a value for
    a metric on either side is left out of that metric's comparison.
    """
    for side, rows in (("base", base_rows), ("candidate", candidate_rows)):
        if not rows:
            raise ValueError(f"no {side} rows to compare")
        hashes = {r["config_hash"] for r in rows}
        if len(hashes) != 1:
            raise ConfigMismatchError(f"{side} rows mix evaluation configs {sorted(hashes)}")
    bh, ch = base_rows[0]["config_hash"], candidate_rows[0]["config_hash"]
    if bh != ch:
        raise ConfigMismatchError(
            f"base rows were scored under evaluation config {bh} and candidate rows under {ch}: results under different configs "
            "(items, steps, decoding, prompts) are not comparable; re-run both under one config"
        )
    base = {r["item_id"]: r for r in base_rows}
    cand = {r["item_id"]: r for r in candidate_rows}
    if set(base) != set(cand):
        only_b, only_c = sorted(set(base) - set(cand))[:5], sorted(set(cand) - set(base))[:5]
        raise ValueError(f"paired comparison needs the same items: only in base {only_b}, only in candidate {only_c}")
    ids = sorted(i for i in base if not base[i].get("excluded") and not cand[i].get("excluded"))
    groups: list[tuple[str, list[str]]] = [("", ids)]
    if by_category:
        cats = sorted({str(base[i].get("category") or "") for i in ids})
        groups = [(c, [i for i in ids if str(base[i].get("category") or "") == c]) for c in cats]
    out = []
    for cat, group in groups:
        for metric in metrics:
            pairs = [(_metric_value(base[i], metric), _metric_value(cand[i], metric)) for i in group]
            pairs = [(b, c) for b, c in pairs if b is not None and c is not None]
            if len(pairs) < 2:
                continue
            name = f"{metric}:{cat}" if cat else metric
            out.append(paired_comparison([b for b, _ in pairs], [c for _, c in pairs], metric=name, **paired_kwargs))
    return out


def write_comparisons(
    warehouse: Any, report_id: str, suite: str, comparisons: Sequence[PairedComparison], config_hash: str, adapter_id: str,
    base_id: str, base_label: str = "base", headline: str | None = None,
) -> int:
    """Upsert comparison rows (keyed by report, suite, metric); ``headline`` names the suite's headline metric (also per category).

    A gate should decide on ``headline`` rows with ``higher_is_better``; the other rows are diagnostics.
    """
    import pyarrow as pa

    headline = headline or (comparisons[0].metric.split(":")[0] if comparisons else None)

    now = dt.datetime.now(dt.timezone.utc)
    data = [{
        "report_id": report_id, "suite": suite, "metric": c.metric, "n": c.n, "base_mean": c.base_mean, "candidate_mean": c.candidate_mean,
        "diff": c.diff, "ci_low": c.ci_low, "ci_high": c.ci_high, "mde": c.mde, "min_gain": c.min_gain, "n_required": c.n_required,
        "excludes_zero": c.excludes_zero, "base_label": base_label, "base_id": base_id, "config_hash": config_hash,
        "adapter_id": adapter_id, "created_at": now, "headline": c.metric.split(":")[0] == headline,
        "higher_is_better": c.metric.split(":")[0] not in NOT_HIGHER_IS_BETTER,
    } for c in comparisons]
    if not data:
        return 0
    if warehouse.has_table(EVALUATION_COMPARISONS_TABLE):  # tables made before these columns existed
        for col in ("headline", "higher_is_better"):
            warehouse.execute(f"ALTER TABLE {EVALUATION_COMPARISONS_TABLE} ADD COLUMN IF NOT EXISTS {col} BOOLEAN")
    return warehouse.upsert_arrow(EVALUATION_COMPARISONS_TABLE, pa.Table.from_pylist(data, schema=_comparisons_schema()),
                                  key=["report_id", "suite", "metric"])


def latest_comparisons(warehouse: Any, adapter_id: str | None = None) -> list[dict[str, Any]]:
    """Every comparison row of the newest report (for ``adapter_id`` when given); [] when there is none.

    What the CLI summary and the deployment gate read: per suite and metric, n, base and
    candidate means, the paired difference and its 95 % interval, the MDE and the config hash.
    """
    if not warehouse.has_table(EVALUATION_COMPARISONS_TABLE):
        return []
    sql = f"SELECT report_id FROM {EVALUATION_COMPARISONS_TABLE}"
    params: list[Any] = []
    if adapter_id is not None:
        sql += " WHERE adapter_id = ?"
        params.append(adapter_id)
    newest = warehouse.execute(sql + " ORDER BY created_at DESC LIMIT 1", params)
    if not newest:
        return []
    return warehouse.query_arrow(
        f"SELECT * FROM {EVALUATION_COMPARISONS_TABLE} WHERE report_id = ? ORDER BY suite, metric", [newest[0][0]]
    ).to_pylist()


def candidate_comparisons(warehouse: Any, adapter_id: str) -> list[dict[str, Any]]:
    """Every comparison row of every report for ``adapter_id``, oldest first (the gate takes the newest per suite/metric)."""
    if not warehouse.has_table(EVALUATION_COMPARISONS_TABLE):
        return []
    return warehouse.query_arrow(
        f"SELECT * FROM {EVALUATION_COMPARISONS_TABLE} WHERE adapter_id = ? ORDER BY created_at, suite, metric", [adapter_id]
    ).to_pylist()


def latest_category_scores(warehouse: Any, model_ids: Sequence[str], suites: Sequence[str] = ("bfcl_strict", "bfcl_platform")) -> list[dict[str, Any]]:
    """Per model and suite, the newest stored run's per-category mean score and n (e.g. the calibration bench's BFCL runs)."""
    if not warehouse.has_table(EVALUATION_ITEMS_TABLE):
        return []
    out = []
    for model_id in model_ids:
        for suite in suites:
            found = warehouse.execute(
                f"SELECT report_id, model_label, config_hash, max(created_at) FROM {EVALUATION_ITEMS_TABLE} WHERE suite = ? AND adapter_id = ? "
                "GROUP BY ALL ORDER BY 4 DESC LIMIT 1", [suite, model_id])
            if not found:
                continue
            report_id, label, chash, created = found[0]
            for cat, mean, n in warehouse.execute(
                f"SELECT category, avg(score), count(*) FROM {EVALUATION_ITEMS_TABLE} WHERE report_id = ? AND suite = ? AND model_label = ? "
                "AND NOT excluded GROUP BY category ORDER BY category", [report_id, suite, label]):
                out.append({"model": model_id, "suite": suite, "category": cat, "mean": float(mean), "n": int(n), "report_id": report_id,
                            "config_hash": chash, "created_at": str(created)})
    return out
