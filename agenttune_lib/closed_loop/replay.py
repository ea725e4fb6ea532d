"""DecideReplayPolicy: answer a held-out case by re-running its DECIDE template with a candidate model."""
from __future__ import annotations

from typing import Any

from agenttune_lib.closed_loop.gate import HoldoutCase
from agenttune_lib.closed_loop.generator import render_response

__all__ = ["DecideReplayPolicy"]


class DecideReplayPolicy:
    """The verdict a model reaches on a case's input through the whole template (loops and step limit included)."""

    def __init__(self, model: Any, template_id: str | None = None, **runner_kwargs: Any) -> None:
        self.model = model
        self.template_id = template_id
        self.runner_kwargs = {"audit": None, "destinations": [], **runner_kwargs}
        self.states: list[Any] = []
        self._runners: dict[str, Any] = {}

    def __call__(self, case: HoldoutCase) -> str:
        from agenttune_lib.decide.runner import GraphRunner

        template = self.template_id or case.template
        if not template:
            raise ValueError(f"held-out case {case.case_id} names no DECIDE template and none was given")
        if template not in self._runners:
            self._runners[template] = GraphRunner.from_template(template, model=self.model, **self.runner_kwargs)
        state = self._runners[template].run(case.input)
        self.states.append(state)
        return render_response(state.verdict)
