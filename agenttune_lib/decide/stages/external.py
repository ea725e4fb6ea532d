"""Stages that reach outside the process: tool_call (the spine's tools, with a timeout) and human_review."""
from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agenttune_lib.decide.stages.base import Stage, StageContext, StageResult, jsonable
from agenttune_lib.decide.state import PipelineState

__all__ = ["ToolCallStage", "HumanReviewStage", "REVIEW_DECISIONS"]

REVIEW_DECISIONS = ("approved", "denied")


class ToolCallStage(Stage):
    """Invoke a registered tool with interpolated args; a structured tool error or a timeout fails the stage.

    ``isolation: process`` (the bundled templates' default, ``tools.isolation`` in ``_global.yaml``) runs the call in a
    forked child that is killed at the timeout; ``thread`` runs it in-process (for tools whose effects must stay in
    this process), where a timed-out call can only be abandoned."""

    type = "tool_call"

    def check(self, ctx: StageContext) -> None:
        if self.spec["tool"] not in ctx.tools:
            raise self.error(f"tool {self.spec['tool']!r} is not registered; registered tools: {sorted(ctx.tools)}")

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:
        name = self.spec["tool"]
        tool = ctx.tools[name]
        args = self.interpolate_value(dict(self.spec.get("args") or {}), state)
        tools_cfg = ctx.settings.get("tools") or {}
        timeout = float(self.spec.get("timeout_seconds", tools_cfg.get("timeout_seconds", 30)))
        isolation = str(self.spec.get("isolation", tools_cfg.get("isolation", "thread")))
        if isolation == "process" and "fork" in multiprocessing.get_all_start_methods():
            status, result = _invoke_in_process(tool, args, timeout)
        else:
            status, result = _invoke_in_thread(tool, args, timeout, name)
        if status == "timeout":
            killed = " and was killed" if isolation == "process" else ""
            error = {"type": "timeout", "message": f"tool {name!r} timed out after {timeout:g}s{killed}", "tool": name}
            raise self.error(error["message"], detail={**error, "args": jsonable(args)}) from None
        if status == "crash":
            error = {"type": "crash", "message": f"tool {name!r} failed in its process: {result}", "tool": name}
            raise self.error(error["message"], detail={**error, "args": jsonable(args)}) from None
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
    """Waits for a person without holding a worker: the run is parked (LangGraph ``interrupt()``; the runner's
    checkpointer keeps it) and the batch moves on; ``GraphRunner.resume`` / ``agenttune decide resume`` continues it
    when the decision arrives. Fails closed: no decision by ``timeout_seconds`` yields ``"timeout"``, routed to
    ``on_failed`` when set and to ``on_denied`` otherwise; an unknown decision is denied.

    The review is announced in ``pending_reviews/{review_id}.json`` (redacted); a reviewer answers with
    ``decisions/{review_id}.json``: ``{"decision": "approved" | "denied", "reviewer": <who>, "comment": …}``.
    A timeout of 0 (or a runner without a checkpointer) fails closed at once instead of parking.
    """

    type = "human_review"

    def review_id(self, state: PipelineState) -> str:
        return f"{state.run_id}-{self.id}-{state.visits.get(self.id, 1)}"

    def timeout(self, ctx: StageContext) -> float:
        if ctx.human_review_timeout is not None:
            return float(ctx.human_review_timeout)
        return float(self.spec.get("timeout_seconds", (ctx.settings.get("human_review") or {}).get("timeout_seconds", 3600)))

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:
        review_id = self.review_id(state)
        pending_dir = ctx.review_dir / "pending_reviews"
        decisions_dir = ctx.review_dir / "decisions"
        pending_dir.mkdir(parents=True, exist_ok=True)
        decisions_dir.mkdir(parents=True, exist_ok=True)
        timeout = self.timeout(ctx)
        pending_path = pending_dir / f"{review_id}.json"
        decision_path = decisions_dir / f"{review_id}.json"
        if ctx.suspend and timeout > 0:
            from langgraph.types import interrupt

            if not pending_path.exists():  # first entry; on resume LangGraph re-enters this node
                _retire_stale(decision_path, decisions_dir)
                now = ctx.clock()
                pending = {**self._pending(state, ctx, review_id, timeout, decision_path), "opened_at": now, "deadline": now + timeout}
                _write_atomic(pending_path, ctx.redact(pending))
            record = interrupt({"review_id": review_id, "run_id": state.run_id, "template_id": self.config.id, "stage_id": self.id})
            if not isinstance(record, Mapping) or record.get("review_id") != review_id:
                record = {"decision": "invalid", "comment": f"resume value does not answer review {review_id!r}"}
        else:
            pending = self._pending(state, ctx, review_id, timeout, decision_path)
            _write_atomic(pending_path, ctx.redact(pending))
            record = {"decision": "timeout"}
        return self._decide(record, review_id, pending_path, timeout)

    def _pending(self, state: PipelineState, ctx: StageContext, review_id: str, timeout: float, decision_path: Path) -> dict[str, Any]:
        return {
            "review_id": review_id,
            "run_id": state.run_id,
            "template_id": self.config.id,
            "stage_id": self.id,
            "question": self.spec.get("question", "Approve this decision?"),
            "summary": self.interpolate(self.spec.get("summary", "{input_text}"), state),
            "running_verdict": dict(state.verdict),
            "timeout_seconds": timeout,
            "decision_file": str(decision_path),
            "allowed_decisions": list(REVIEW_DECISIONS),
            "status": "pending",
        }

    def _decide(self, record: Mapping[str, Any], review_id: str, pending_path: Path, timeout: float) -> StageResult:
        decision = str(record.get("decision", "")).strip().lower()
        _close_pending(pending_path, "timeout" if decision == "timeout" else "decided")
        if decision == "timeout":
            return StageResult(
                output={"decision": "timeout", "review_id": review_id, "reviewer": None, "comment": None},
                status="error",
                error=f"no review decision within {timeout:g}s (fails closed)",
                next=self.spec.get("on_failed") or self.spec["on_denied"],
            )
        output = {"decision": decision, "review_id": review_id, "reviewer": record.get("reviewer"), "comment": record.get("comment"),
                  "decided_at": record.get("decided_at")}
        if decision == "approved":
            return StageResult(output=output, next=self.spec.get("on_approved", self.spec.get("next")))
        if decision != "denied":
            output["invalid_decision"] = record.get("decision")
            output["decision"] = "denied"
        return StageResult(output=output, next=self.spec["on_denied"])


def _retire_stale(decision_path: Path, decisions_dir: Path) -> None:
    """A decision file that exists before its review opens answers some earlier review: never this one."""
    if decision_path.exists():
        stale = decisions_dir / "stale"
        stale.mkdir(exist_ok=True)
        os.replace(decision_path, stale / f"{decision_path.stem}.{os.getpid()}.{int(time.time() * 1e6)}.json")


def _close_pending(pending_path: Path, status: str) -> None:
    try:
        data = json.loads(pending_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(data, dict):
        _write_atomic(pending_path, {**data, "status": status})


def _invoke_in_thread(tool: Any, args: Any, timeout: float, name: str) -> tuple[str, Any]:
    """Run in a worker thread; a timeout abandons the thread (it cannot be killed): for tools with in-process effects."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"decide-tool-{name}")
    try:
        future = pool.submit(tool.invoke, args)
        try:
            return "ok", future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            return "timeout", None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _invoke_in_process(tool: Any, args: Any, timeout: float) -> tuple[str, Any]:
    """Run in a forked child that is killed on timeout: a tool that hangs forever cannot outlive its stage."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            sender.send(("ok", tool.invoke(args)))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, the child exits either way
            sender.send(("crash", f"{type(exc).__name__}: {exc}"))

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    sender.close()
    try:
        if receiver.poll(timeout):
            try:
                return receiver.recv()
            except EOFError:
                return "crash", f"the tool process exited with code {proc.exitcode}"
        return "timeout", None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        receiver.close()


def _write_atomic(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)
