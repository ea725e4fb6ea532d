"""FailureClassifier: one of the five root causes, from deterministic rules where the evidence decides, else an injected LLM."""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from agenttune_lib.closed_loop.types import ROOT_CAUSES, Classification, Failure

__all__ = ["FailureClassifier", "WRONG_TOOL_ERRORS", "OUTPUT_ERRORS"]

#: Structured tool-error types that mean the agent picked the wrong tool or gave it arguments it does not take.
WRONG_TOOL_ERRORS = frozenset({"unknown_tool", "tool_not_found", "invalid_tool", "invalid_arguments", "bad_arguments", "argument_error", "parse_error"})
#: Structured stage-error types that mean the agent's output was not grounded or not well formed.
OUTPUT_ERRORS = frozenset({"schema_validation", "validation_error", "invalid_output", "ungrounded"})


def _error_type(error: Any) -> str | None:
    if isinstance(error, Mapping):
        for key in ("type", "code", "kind"):
            if isinstance(error.get(key), str):
                return error[key].lower()
    if isinstance(error, str) and re.search(r"schema|not (valid )?json|invalid json|does not match|reply rejected", error, re.I):
        return "schema_validation"  # a model stage's reply that failed its output schema (DECIDE error text)
    return None


class FailureClassifier:
    """Assigns a root cause; ``llm`` (prompt -> text) decides only what the rules cannot."""

    def __init__(self, llm: Callable[[str], str] | None = None, use_rules: bool = True) -> None:
        self.llm = llm
        self.use_rules = use_rules

    def rules(self, failure: Failure) -> Classification | None:
        """The deterministic classification, or None when the evidence does not decide it."""
        ev = failure.evidence
        if "loop_collapse" in failure.signals:
            return Classification(
                "loop_collapse", "rules",
                f"stage {ev.get('loop_stage')!r} visited {ev.get('visits')} times (limit {ev.get('revisit_limit')})",
            )
        for err in ev.get("errors", []):
            etype = _error_type(err.get("error"))
            if err.get("kind") == "tool_call" and etype in WRONG_TOOL_ERRORS:
                return Classification("wrong_tool", "rules", f"tool stage {err.get('stage')!r} failed with {etype}")
            if etype in OUTPUT_ERRORS:
                return Classification("hallucinated_output", "rules", f"stage {err.get('stage')!r} output failed with {etype}")
        for record in failure.run.records:
            state = record.get("state") or {}
            expected = state.get("expected_route")
            if expected is not None and state.get("route", state.get("content")) != expected:
                return Classification(
                    "wrong_routing", "rules", f"router {record.get('stage')!r} chose {state.get('route', state.get('content'))!r}, expected {expected!r}"
                )
        return None

    def prompt(self, failure: Failure) -> str:
        """The LLM prompt: the failure's evidence and path, and the five labels to choose from."""
        path = [
            {"stage": r.get("stage"), "status": r.get("status"), "error": r.get("error")}
            for r in failure.run.records[:40]
        ]
        return (
            "Classify the root cause of this failed agent run. Answer with JSON "
            '{"root_cause": <one of ' + ", ".join(ROOT_CAUSES) + '>, "reason": <one sentence>}.\n'
            f"Signals: {failure.signals}\nEvidence: {json.dumps(failure.evidence, default=str)}\n"
            f"Input: {failure.run.input[:2000]}\nOutput: {json.dumps(failure.run.output, default=str)[:2000]}\n"
            f"Path: {json.dumps(path, default=str)}"
        )

    @staticmethod
    def parse(reply: str) -> tuple[str, str] | None:
        """(root_cause, reason) from an LLM reply: a JSON object, or the first label named in plain text."""
        match = re.search(r"\{.*\}", reply, re.S)
        if match:
            try:
                obj = json.loads(match.group(0))
                cause = str(obj.get("root_cause", "")).strip().lower()
                if cause in ROOT_CAUSES:
                    return cause, str(obj.get("reason", ""))
            except ValueError:
                pass
        hits = [(reply.lower().find(c), c) for c in ROOT_CAUSES if c in reply.lower()]
        return (min(hits)[1], reply.strip()[:200]) if hits else None

    def classify(self, failure: Failure) -> Classification | None:
        """Rules first, then the LLM; None when neither decides (the caller counts it as dropped)."""
        if self.use_rules:
            decided = self.rules(failure)
            if decided is not None:
                return decided
        if self.llm is None:
            return None
        parsed = self.parse(self.llm(self.prompt(failure)))
        if parsed is None:
            return None
        return Classification(parsed[0], "llm", parsed[1])
