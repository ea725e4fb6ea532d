"""Resuming parked runs: a reviewer's decision file is consumed once and continues its run from the checkpoint;
a review past its deadline is resumed as a timeout (fails closed)."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agenttune_lib.decide.checkpoint import validate_run_id
from agenttune_lib.decide.errors import DecideError

__all__ = ["ResumeOutcome", "pending_reviews", "resume_decided"]


@dataclasses.dataclass
class ResumeOutcome:
    """What happened to one pending review: ``resumed``, ``timed_out``, ``waiting`` or ``error``."""

    review_id: str
    run_id: str
    template_id: str
    action: str
    state: Any = None
    error: str | None = None


def pending_reviews(review_dir: str | Path) -> list[dict[str, Any]]:
    """Open reviews (``status: pending``) under ``review_dir/pending_reviews``, oldest first."""
    folder = Path(review_dir) / "pending_reviews"
    out = []
    for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.exists() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("status") == "pending" and data.get("review_id") == path.stem:
            out.append(data)
    return out


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {"decision": "invalid", "comment": f"unreadable decision file: {exc}"}
    return data if isinstance(data, dict) else {"decision": "invalid", "comment": "decision file is not an object"}


def resume_decided(
    review_dir: str | Path, runner_for: Callable[[str], Any], run_id: str | None = None, now: Callable[[], float] = time.time
) -> list[ResumeOutcome]:
    """Resume every parked run (or just ``run_id``) whose decision has arrived or whose deadline has passed.

    ``runner_for(template_id)`` gives a GraphRunner with the same checkpointer and review folder. A decision file
    is moved to ``decisions/consumed/`` before its run continues (an atomic rename: two resumers cannot both use
    it), and put back if the resume fails.
    """
    review_dir = Path(review_dir)
    if run_id is not None:
        validate_run_id(run_id)
    decisions = review_dir / "decisions"
    consumed = decisions / "consumed"
    outcomes: list[ResumeOutcome] = []
    for pending in pending_reviews(review_dir):
        rid, review_id, template_id = pending["run_id"], pending["review_id"], pending["template_id"]
        if run_id is not None and rid != run_id:
            continue
        validate_run_id(rid)
        decision_path = decisions / f"{review_id}.json"
        outcome = ResumeOutcome(review_id, rid, template_id, "waiting")
        try:
            runner = runner_for(template_id)
            if decision_path.exists():
                decision = _read(decision_path)
                if decision.get("review_id") not in (None, review_id):
                    raise DecideError(f"decision file {decision_path.name} answers review {decision.get('review_id')!r}")
                if not str(decision.get("reviewer") or "").strip():
                    raise DecideError(f"decision for review {review_id!r} names no reviewer; add \"reviewer\" to {decision_path}")
                consumed.mkdir(parents=True, exist_ok=True)
                taken = consumed / f"{review_id}.json"
                if taken.exists():
                    raise DecideError(f"review {review_id!r} was already decided once; a second decision is not used")
                try:
                    os.replace(decision_path, taken)
                except FileNotFoundError:
                    continue  # another resumer took it
                try:
                    outcome.state = runner.resume(rid, {**decision, "review_id": review_id})
                except Exception:
                    os.replace(taken, decision_path)
                    raise
                outcome.action = "resumed"
            elif now() >= float(pending.get("deadline") or float("inf")):
                outcome.state = runner.resume(rid, {"decision": "timeout", "review_id": review_id})
                outcome.action = "timed_out"
        except Exception as exc:  # one bad review must not stop the others
            outcome.action, outcome.error = "error", f"{type(exc).__name__}: {exc}"
        outcomes.append(outcome)
    return outcomes
