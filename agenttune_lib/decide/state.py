"""PipelineState: the working state one DECIDE run threads through every stage."""
from __future__ import annotations

import copy
import dataclasses
import json
import uuid
from collections.abc import Mapping
from typing import Any

__all__ = ["PipelineState", "parse_input"]

RUN_STATUSES = ("running", "completed", "error", "step_limit", "suspended")


def parse_input(value: Any) -> tuple[str, dict[str, Any]]:
    """``(input_text, input fields)`` from a string (JSON object or plain text) or a mapping."""
    if isinstance(value, Mapping):
        fields = json.loads(json.dumps(dict(value), default=str))
        if isinstance(fields.get("input_text"), str):
            return fields["input_text"], fields
        return json.dumps(fields, sort_keys=True, ensure_ascii=False), fields
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parse_input(parsed)
        return value, {"text": value}
    raise TypeError(f"DECIDE input must be a string or a mapping, got {type(value).__name__}")


@dataclasses.dataclass
class PipelineState:
    """Stage outputs, step history, the running verdict and the completion flags of one run.

    ``step_history`` entries carry ``stage_id, stage_type, output, status, error, tool,
    args, score, visit``: the shape ``EventLog.from_pipeline_state`` reads.
    """

    template_id: str
    input_text: str
    input: dict[str, Any] = dataclasses.field(default_factory=dict)
    run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    stage_outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    stage_status: dict[str, str] = dataclasses.field(default_factory=dict)
    step_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    verdict: dict[str, Any] = dataclasses.field(default_factory=lambda: {"label": None, "confidence": None, "reason": None})
    visits: dict[str, int] = dataclasses.field(default_factory=dict)
    steps: int = 0
    next_stage: str | None = None
    current_stage: str | None = None
    completed: bool = False
    status: str = "running"
    error: str | None = None
    injected: dict[str, Any] = dataclasses.field(default_factory=dict)
    destinations: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @classmethod
    def start(cls, template_id: str, value: Any, run_id: str | None = None) -> "PipelineState":
        text, fields = parse_input(value)
        state = cls(template_id=template_id, input_text=text, input=fields)
        if run_id:
            state.run_id = run_id
        return state

    def namespace(self) -> dict[str, Any]:
        """What rules and ``{…}`` interpolation can see: input, verdict, and every stage by id."""
        ns: dict[str, Any] = {
            "input_text": self.input_text,
            "input": self.input,
            "verdict": self.verdict,
            "run_id": self.run_id,
            "template_id": self.template_id,
            "injected": self.injected,
            "visits": dict(self.visits),
        }
        for stage_id, output in self.stage_outputs.items():
            score = next((s.get("score") for s in reversed(self.step_history) if s["stage_id"] == stage_id), None)
            ns[stage_id] = {
                "output": output,
                "status": self.stage_status.get(stage_id),
                "score": score,
                "visits": self.visits.get(stage_id, 0),
            }
        return ns

    def finish(self, status: str, label: Any = None, confidence: Any = None, reason: Any = None, error: str | None = None) -> None:
        """Mark the run done; a failed run gets its label and zero confidence unless given."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
        self.status = status
        self.completed = True
        self.next_stage = None
        if error is not None:
            self.error = error
        if status != "completed":
            self.verdict = {
                "label": label if label is not None else status,
                "confidence": float(confidence) if confidence is not None else 0.0,
                "reason": reason if reason is not None else error,
            }

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(dataclasses.asdict(self))

    def summary(self) -> dict[str, Any]:
        """The trace a human reads: stage path, verdict, status."""
        return {
            "run_id": self.run_id,
            "template_id": self.template_id,
            "status": self.status,
            "verdict": dict(self.verdict),
            "path": [s["stage_id"] for s in self.step_history],
            "steps": self.steps,
            "error": self.error,
        }
