"""Deterministic stages: rules (gate with goto + inject), parallel (asyncio fan-out), output (final verdict)."""
from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping
from typing import Any

from agenttune_lib.decide.errors import RuleError, StageError
from agenttune_lib.decide.rules import evaluate_rule
from agenttune_lib.decide.stages.base import Stage, StageContext, StageResult, jsonable, make_stage
from agenttune_lib.decide.state import PipelineState

__all__ = ["RulesStage", "ParallelStage", "OutputStage"]

_VERDICT_KEYS = ("label", "confidence", "reason")


def apply_inject(state: PipelineState, inject: Mapping[str, Any]) -> dict[str, Any]:
    """``label``/``confidence``/``reason`` update the running verdict; every key is kept in ``injected``."""
    injected = jsonable(dict(inject)) or {}
    state.injected.update(injected)
    for key in _VERDICT_KEYS:
        if key in injected:
            state.verdict[key] = injected[key]
    return injected


class RulesStage(Stage):
    """Conditions in order; the first that is false short-circuits to its ``goto`` and applies its ``inject``."""

    type = "rules"

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:
        ns = state.namespace()
        evaluated = []
        for index, (item, rule) in enumerate(zip(self.spec["rules"], self.config.rules[self.id])):
            name = str(item.get("name", index))
            try:
                ok = evaluate_rule(rule, ns)
            except RuleError as exc:
                raise self.error(f"rule {name!r}: {exc.bare_message}") from None
            evaluated.append({"rule": name, "condition": rule.source, "passed": ok})
            if not ok:
                inject = self.interpolate_value(item.get("inject") or {}, state)
                injected = apply_inject(state, inject)
                target = item.get("goto", self.spec.get("on_fail"))
                return StageResult(
                    output={"passed": False, "failed_rule": name, "evaluated": evaluated, "injected": injected},
                    next=target,
                )
        return StageResult(output={"passed": True, "failed_rule": None, "evaluated": evaluated})


class ParallelStage(Stage):
    """Independent branches run concurrently (asyncio.gather over worker threads), merged by branch id."""

    type = "parallel"

    def __init__(self, spec: Mapping[str, Any], config: Any) -> None:
        super().__init__(spec, config)
        self.branches = [make_stage(b, config) for b in self.spec["branches"]]

    def check(self, ctx: StageContext) -> None:
        for branch in self.branches:
            branch.check(ctx)

    async def _gather(self, state: PipelineState, ctx: StageContext) -> list[Any]:
        return await asyncio.gather(
            *(asyncio.to_thread(branch.execute, state, ctx) for branch in self.branches), return_exceptions=True
        )

    def _run(self, state: PipelineState, ctx: StageContext) -> list[Any]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._gather(state, ctx))
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # called from inside an event loop
            return pool.submit(asyncio.run, self._gather(state, ctx)).result()

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:
        results = self._run(state, ctx)
        merged: dict[str, Any] = {}
        failures: dict[str, Any] = {}
        steps = []
        for branch, result in zip(self.branches, results):
            if isinstance(result, StageError):
                failures[branch.id] = str(result)
                step = {"stage_id": branch.id, "stage_type": branch.type, "output": None, "status": "error",
                        "error": str(result), "attempts": result.detail if isinstance(result.detail, list) else []}
                if isinstance(result.detail, Mapping):
                    step["error"] = dict(result.detail)
                steps.append(step)
                continue
            if isinstance(result, BaseException):
                failures[branch.id] = f"{type(result).__name__}: {result}"
                steps.append({"stage_id": branch.id, "stage_type": branch.type, "output": None, "status": "error",
                              "error": failures[branch.id]})
                continue
            merged[branch.id] = result.output
            steps.append({
                "stage_id": branch.id, "stage_type": branch.type, "output": result.output,
                "status": result.status, "error": result.error, "score": result.score,
                "tool": result.tool, "args": result.args, "prompt": result.prompt, "attempts": result.attempts,
            })
        allow_partial = bool(self.spec.get("allow_partial", False))
        outcome = StageResult(output=merged, branch_steps=steps)
        if failures and (not allow_partial or not merged):
            err = self.error(f"branches failed: {failures}")
            err.detail = {"branch_steps": steps, "partial": merged}
            raise err
        if failures:
            outcome.output = {**merged, "_failed": sorted(failures)}
        return outcome


class OutputStage(Stage):
    """Finalizes the verdict: label, confidence (0..1) and reason, interpolated or taken from the running verdict."""

    type = "output"

    def execute(self, state: PipelineState, ctx: StageContext) -> StageResult:
        spec = self.spec.get("verdict") or {}
        if not isinstance(spec, Mapping):
            raise self.error("verdict must be a mapping with label, confidence and reason")
        verdict = dict(state.verdict)
        for key in _VERDICT_KEYS:
            if key in spec:
                verdict[key] = self.interpolate_value(spec[key], state)
        for key in _VERDICT_KEYS:
            if key in state.injected and key not in spec:
                verdict[key] = state.injected[key]
        if verdict.get("label") in (None, ""):
            raise self.error("the run reached output without a verdict label")
        verdict["label"] = str(verdict["label"])
        conf = verdict.get("confidence")
        if conf is None:
            conf = self.spec.get("default_confidence", 1.0)
        try:
            conf = float(conf)
        except (TypeError, ValueError):
            raise self.error(f"confidence {conf!r} is not a number") from None
        if conf != conf:
            raise self.error("confidence is NaN")
        verdict["confidence"] = min(1.0, max(0.0, conf))
        if verdict.get("reason") is not None and not isinstance(verdict["reason"], str):
            verdict["reason"] = str(jsonable(verdict["reason"]))
        state.verdict = verdict
        return StageResult(output=dict(verdict))
