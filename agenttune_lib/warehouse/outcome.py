"""What a training run decided, read back from the warehouse and the deployment pointer (TEAM contract 6).

Held-out base vs adapter scores (``evaluation_comparisons``), the gate decision with its reasons
(``gate_decisions``) and what serves now (``DEPLOYED.json`` under the deploy root). Every part is
optional: a run that never reached evaluation or the gate says so instead of failing.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from agenttune_lib.warehouse.store import Warehouse, WarehouseError

DEPLOY_POINTER = "DEPLOYED.json"


@dataclasses.dataclass(frozen=True)
class GateOutcome:
    """One ``gate_decisions`` row: approved or refused, and why."""

    decision_id: str
    approved: bool
    candidate: str | None
    baseline: str | None
    reasons: list[str]
    accuracy_old: float | None
    accuracy_new: float | None
    n_cases: int | None
    run_id: str | None
    created_at: str
    from_this_run: bool
    #: Each target and guard the gate judged: criterion, role, n, base, candidate, diff, interval, margin, passed.
    criteria: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """Scores, gate decision and serving adapter as the warehouse and deploy root hold them now."""

    comparisons: list[dict[str, Any]]
    gate: GateOutcome | None
    serving: dict[str, Any] | None
    deploy_root: str
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def serving_label(self) -> str:
        return self.serving["adapter_id"] if self.serving else "base model (no adapter deployed)"


def latest_comparison_rows(warehouse: Warehouse) -> list[dict[str, Any]]:
    """The newest report's ``evaluation_comparisons`` rows ([] when the table does not exist yet)."""
    try:
        from agenttune_lib.evaluation.store import latest_comparisons
    except ImportError:  # evaluation package absent in a slim install: read the contract's table directly
        latest_comparisons = None
    if latest_comparisons is not None:
        return latest_comparisons(warehouse)
    if not warehouse.has_table("evaluation_comparisons"):
        return []
    newest = warehouse.execute("SELECT report_id FROM evaluation_comparisons ORDER BY created_at DESC LIMIT 1")
    if not newest:
        return []
    return warehouse.query_arrow(
        "SELECT * FROM evaluation_comparisons WHERE report_id = ? ORDER BY suite, metric", [newest[0][0]]
    ).to_pylist()


def _gate_row(warehouse: Warehouse, run_id: str | None) -> GateOutcome | None:
    if not warehouse.has_table("gate_decisions"):
        return None
    rows = []
    if run_id:
        rows = warehouse.query_arrow("SELECT * FROM gate_decisions WHERE run_id = ? ORDER BY created_at DESC LIMIT 1", [run_id]).to_pylist()
    this_run = bool(rows)
    if not rows:
        rows = warehouse.query_arrow("SELECT * FROM gate_decisions ORDER BY created_at DESC LIMIT 1").to_pylist()
    if not rows:
        return None
    r = rows[0]
    try:
        reasons = json.loads(r.get("reasons") or "[]")
    except json.JSONDecodeError:
        reasons = [str(r.get("reasons"))]
    try:
        arms = json.loads(r.get("arms") or "{}")
    except json.JSONDecodeError:
        arms = {}
    criteria = [c for name in ("targets", "guards") for c in (arms.get(name) or {}).get("criteria", [])]
    return GateOutcome(
        criteria=criteria,
        decision_id=r["decision_id"], approved=bool(r["approved"]), candidate=r.get("candidate"), baseline=r.get("baseline"),
        reasons=[str(x) for x in reasons], accuracy_old=r.get("accuracy_old"), accuracy_new=r.get("accuracy_new"),
        n_cases=r.get("n_cases"), run_id=r.get("run_id"), created_at=str(r.get("created_at")), from_this_run=this_run,
    )


def read_deployment(deploy_root: str | Path) -> dict[str, Any] | None:
    """The deployment pointer's content, or None before the first deployment."""
    pointer = Path(deploy_root) / DEPLOY_POINTER
    if not pointer.exists():
        return None
    try:
        return json.loads(pointer.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise WarehouseError(f"deployment pointer {pointer} is unreadable: {exc}") from exc


def run_outcome(warehouse: Warehouse, deploy_root: str | Path, run_id: str | None = None) -> RunOutcome:
    """Scores, gate decision (this run's, else the newest) and the serving adapter."""
    notes: list[str] = []
    if not Path(warehouse.path).exists():
        return RunOutcome([], None, read_deployment(deploy_root), str(deploy_root), [f"no warehouse at {warehouse.path} yet"])
    try:
        comparisons = latest_comparison_rows(warehouse)
    except Exception as exc:  # a summary must not fail the run it describes
        comparisons = []
        notes.append(f"evaluation_comparisons unreadable: {exc}")
    try:
        gate = _gate_row(warehouse, run_id)
    except Exception as exc:
        gate = None
        notes.append(f"gate_decisions unreadable: {exc}")
    return RunOutcome(comparisons, gate, read_deployment(deploy_root), str(deploy_root), notes)
