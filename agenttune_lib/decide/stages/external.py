"""Stages that reach outside the process: tool_call (the spine's tools, with a timeout) and human_review."""
from __future__ import annotations

import concurrent.futures
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agenttune_lib.decide.stages.base import Stage, StageContext, StageResult, jsonable
from agenttune_lib.decide.state import PipelineState

__all__ = ["ToolCallStage", "HumanReviewStage", "REVIEW_DECISIONS"]

REVIEW_DECISIONS = ("approved", "denied")


class ToolCallStage(Stage):
    """Invoke a registered tool with interpolated args; a structured tool error or a timeout fails the stage."""

    type = "tool_call"

    def check(self, ctx: StageContext) -> None:
        if self.spec["tool"] not in ctx.tools:
            raise self.error(f"tool {self.spec['tool']!r} is not registered; registered tools: {sorted(ctx.tools)}")

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:
        name = self.spec["tool"]
        tool = ctx.tools[name]
        args = self.interpolate_value(dict(self.spec.get("args") or {}), state)
        timeout = float(self.spec.get("timeout_seconds", (ctx.settings.get("tools") or {}).get("timeout_seconds", 30)))
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"decide-tool-{name}")
        try:
            future = pool.submit(tool.invoke, args)
            try:
                result = future.result(timeout=timeout)
            except concurrent.futures.TimeoutError:
                error = {"type": "timeout", "message": f"tool {name!r} timed out after {timeout:g}s", "tool": name}
                raise self.error(error["message"], detail={**error, "args": jsonable(args)}) from None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        if result.error is not None:
            error = jsonable(result.error)
            raise self.error(f"tool {name!r} failed: {error.get('message', error)}", detail={**error, "args": jsonable(args)})
        value = result.value if result.value is not None else result.content
        try:
            output = jsonable(value)
        except (TypeError, ValueError):
            output = result.content
        return StageResult(output=output, tool=name, args=jsonable(args))


class HumanReviewStage(Stage):
    """Filesystem handshake: write ``pending_reviews/{id}.json``, poll for a decision; fail closed.

    A decision is ``{"decision": "approved" | "denied", "reviewer": …, "comment": …}`` written
    to ``decisions/{id}.json`` (or ``pending_reviews/{id}.decision.json``, or as a ``decision``
    key added to the pending file itself).
    No decision before ``timeout_seconds`` yields ``"timeout"``, routed to ``on_failed``
    when set and to ``on_denied`` otherwise; an unreadable or unknown decision is denied.
    """

    type = "human_review"

    def review_id(self, state: PipelineState) -> str:
        return f"{state.run_id}-{self.id}-{state.visits.get(self.id, 1)}"

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:
        review_id = self.review_id(state)
        pending_dir = ctx.review_dir / "pending_reviews"
        decisions_dir = ctx.review_dir / "decisions"
        pending_dir.mkdir(parents=True, exist_ok=True)
        decisions_dir.mkdir(parents=True, exist_ok=True)
        timeout = ctx.human_review_timeout
        if timeout is None:
            timeout = float(self.spec.get("timeout_seconds", (ctx.settings.get("human_review") or {}).get("timeout_seconds", 3600)))
        poll = float(self.spec.get("poll_seconds", (ctx.settings.get("human_review") or {}).get("poll_seconds", 1.0)))
        summary = self.interpolate(self.spec.get("summary", "{input_text}"), state)
        pending = {
            "review_id": review_id,
            "run_id": state.run_id,
            "template_id": self.config.id,
            "stage_id": self.id,
            "question": self.spec.get("question", "Approve this decision?"),
            "summary": summary,
            "running_verdict": dict(state.verdict),
            "timeout_seconds": timeout,
            "decision_file": str(decisions_dir / f"{review_id}.json"),
            "allowed_decisions": list(REVIEW_DECISIONS),
        }
        pending_path = pending_dir / f"{review_id}.json"
        _write_atomic(pending_path, ctx.redact(pending))
        decision_path = decisions_dir / f"{review_id}.json"
        alt_path = pending_dir / f"{review_id}.decision.json"
        deadline = ctx.clock() + timeout
        record: dict[str, Any] | None = None
        while True:
            record = _poll_decision(decision_path, alt_path, pending_path)
            if record is not None:
                break
            if ctx.clock() >= deadline:
                break
            ctx.sleep(max(0.0, min(poll, deadline - ctx.clock())))
        if record is None:
            decision = "timeout"
            target = self.spec.get("on_failed") or self.spec["on_denied"]
            _write_atomic(pending_path, ctx.redact({**pending, "status": "timeout"}))
            return StageResult(
                output={"decision": "timeout", "review_id": review_id, "reviewer": None, "comment": None},
                status="error",
                error=f"no review decision within {timeout:g}s (fails closed)",
                next=target,
            )
        decision = str(record.get("decision", "")).strip().lower()
        output = {"decision": decision, "review_id": review_id, "reviewer": record.get("reviewer"), "comment": record.get("comment")}
        try:
            pending_path.unlink()
        except FileNotFoundError:
            pass
        if decision == "approved":
            return StageResult(output=output, next=self.spec.get("on_approved", self.spec.get("next")))
        if decision != "denied":
            output["invalid_decision"] = record.get("decision")
            output["decision"] = "denied"
        return StageResult(output=output, next=self.spec["on_denied"])


def _write_atomic(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)


def _poll_decision(decision_path: Path, alt_path: Path, pending_path: Path) -> dict[str, Any] | None:
    """A reviewer's decision from ``decisions/{id}.json``, ``pending_reviews/{id}.decision.json``,
    or a ``decision`` key written into the pending file itself."""
    for path in (decision_path, alt_path):
        if path.exists():
            return _read_decision(path)
    try:
        pending = json.loads(pending_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(pending, dict) and pending.get("decision") not in (None, ""):
        return pending
    return None


def _read_decision(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {"decision": "invalid", "comment": f"unreadable decision file: {exc}"}
    return data if isinstance(data, dict) else {"decision": "invalid", "comment": "decision file is not an object"}
