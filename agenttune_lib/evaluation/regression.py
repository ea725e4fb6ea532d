"""Trajectory regression of a candidate against the deployed model on the same items and config.

Fails when the candidate stops calling tools on items where the deployed model called them, when
its tool-use rate falls beyond tolerance, or when TAC falls / LCF rises beyond tolerance. Rows
scored under different config hashes are never compared (``ConfigMismatchError``).
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from agenttune_lib.evaluation.paired import ConfigMismatchError
from agenttune_lib.evaluation.store import EVALUATION_ITEMS_TABLE

__all__ = ["trajectory_regression", "items_for", "TRAJECTORY_SUITES"]

TRAJECTORY_SUITES = ("qa", "tau2")


def _mean(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = [float(r["metrics"][key]) for r in rows if (r.get("metrics") or {}).get(key) is not None]
    return statistics.fmean(vals) if vals else None


def _tool_use(rows: Sequence[Mapping[str, Any]]) -> float | None:
    vals = [float((r.get("metrics") or {}).get("tool_calls", 0) > 0) for r in rows if "tool_calls" in (r.get("metrics") or {})]
    return statistics.fmean(vals) if vals else None


def trajectory_regression(
    candidate: Mapping[str, Sequence[Mapping[str, Any]]],
    deployed: Mapping[str, Sequence[Mapping[str, Any]]],
    tac_tolerance: float = 0.05,
    lcf_tolerance: float = 0.05,
    tool_use_tolerance: float = 0.2,
) -> dict[str, Any]:
    """Per suite ({suite: item rows}), compare tool-use rate, TAC and LCF; ``passed`` is False on any regression.

    A candidate that makes no tool call on any item where the deployed model made some always fails.
    """
    out: dict[str, Any] = {"passed": True, "reasons": [], "suites": {}}
    shared = [s for s in candidate if s in deployed]
    if not shared:
        raise ValueError(f"no suite in common: candidate has {sorted(candidate)}, deployed has {sorted(deployed)}")
    for suite in shared:
        c_rows, d_rows = list(candidate[suite]), list(deployed[suite])
        ch, dh = {r.get("config_hash") for r in c_rows}, {r.get("config_hash") for r in d_rows}
        if ch != dh or len(ch) != 1:
            raise ConfigMismatchError(f"{suite}: candidate rows under config {sorted(map(str, ch))}, deployed under {sorted(map(str, dh))}: not comparable")
        d_by_id = {r["item_id"]: r for r in d_rows}
        pairs = [(r, d_by_id[r["item_id"]]) for r in c_rows if r["item_id"] in d_by_id]
        c_pair, d_pair = [p[0] for p in pairs], [p[1] for p in pairs]
        info = {"n": len(pairs), "tool_use_candidate": _tool_use(c_pair), "tool_use_deployed": _tool_use(d_pair)}
        for m in ("TAC", "LCF"):
            info[f"{m}_candidate"], info[f"{m}_deployed"] = _mean(c_pair, m), _mean(d_pair, m)
        out["suites"][suite] = info
        cu, du = info["tool_use_candidate"], info["tool_use_deployed"]
        if du is not None and cu is not None:
            if du > 0 and cu == 0:
                out["reasons"].append(f"{suite}: the candidate made no tool call on any of {len(pairs)} items; the deployed model called tools on {du:.0%}")
            elif du - cu > tool_use_tolerance:
                out["reasons"].append(f"{suite}: tool use fell from {du:.0%} to {cu:.0%} of items (tolerance {tool_use_tolerance:.0%})")
        for m, direction, tol in (("TAC", 1, tac_tolerance), ("LCF", -1, lcf_tolerance)):
            new, old = info[f"{m}_candidate"], info[f"{m}_deployed"]
            if new is not None and old is not None and (new - old) * direction < -tol:
                out["reasons"].append(f"{suite}: {m} {'fell' if direction > 0 else 'rose'} from {old:.3f} to {new:.3f} (tolerance {tol})")
    out["passed"] = not out["reasons"]
    return out


def items_for(warehouse: Any, adapter_id: str, suites: Sequence[str] = TRAJECTORY_SUITES, config_hashes: Mapping[str, str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """The newest stored rows of ``adapter_id`` per suite (under the given config hash per suite when given)."""
    from agenttune_lib.evaluation.store import find_items_report, load_items

    out: dict[str, list[dict[str, Any]]] = {}
    if not warehouse.has_table(EVALUATION_ITEMS_TABLE):
        return out
    for suite in suites:
        if config_hashes is not None and suite in config_hashes:
            found = find_items_report(warehouse, suite, adapter_id, config_hashes[suite])
        else:
            rows = warehouse.execute(
                f"SELECT report_id, model_label FROM {EVALUATION_ITEMS_TABLE} WHERE suite = ? AND adapter_id = ? ORDER BY created_at DESC LIMIT 1",
                [suite, adapter_id])
            found = (rows[0][0], rows[0][1]) if rows else None
        if found is not None:
            out[suite] = load_items(warehouse, found[0], suite, found[1])
    return out
