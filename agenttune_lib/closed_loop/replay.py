"""Generative replay: DECIDE inputs re-run through their template with a model, scored per stage and per verdict.

The gate replays (a) the batch's failing inputs, where the corrected stage must now produce the
correction and the run must pass the detector, and (b) a fixed-size sample of held-out inputs
from past successful runs, where the verdict and the corrected stages' outputs must still match.
The model generates every answer; nothing is ranked from a closed list.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agenttune_lib.closed_loop.generator import render_response
from agenttune_lib.closed_loop.types import HoldoutCase, Run, TrainingExample, stable_id

__all__ = ["DecideReplayPolicy", "ReplayCase", "failure_cases", "holdout_cases", "replay_cases", "replay_summary", "same_output"]


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


@dataclasses.dataclass(frozen=True)
class ReplayCase:
    """One DECIDE input to replay: a batch ``failure`` (expected: the correction at its stage) or a ``holdout`` success."""

    case_id: str
    kind: str
    template: str
    input: str
    expected_stages: dict[str, Any]
    expected_label: str | None = None
    trajectory_id: str = ""
    #: The human-review stage the recorded run was routed to (a replay cannot wait for the officer; it must route there too).
    expected_review: str | None = None
    #: The verdict labels the input's author accepts (its ``expected_label``): when set, the verdict is scored against
    #: them, not against the recorded run, so a candidate that corrects the recorded verdict is not counted wrong.
    accepted_labels: tuple[str, ...] | None = None


def same_output(a: Any, b: Any) -> bool:
    """Stage outputs compared as canonical JSON (a string holding JSON compares by its parsed value)."""
    def norm(x: Any) -> str:
        if isinstance(x, str):
            try:
                x = json.loads(x)
            except ValueError:
                return x.strip()
        return json.dumps(x, sort_keys=True, ensure_ascii=False, default=str)

    return norm(a) == norm(b)


def failure_cases(examples: Iterable[TrainingExample]) -> list[ReplayCase]:
    """The batch's failing inputs, each expecting its correction at the corrected stage."""
    out = []
    for e in examples:
        template, text, stage = e.metadata.get("template"), e.metadata.get("input"), e.metadata.get("stage")
        if not template or not isinstance(text, str):
            continue
        expected = {stage: e.chosen} if stage else {}
        out.append(ReplayCase(stable_id("failure", e.example_id), "failure", str(template), text, expected, None, e.trajectory_id))
    return out


def holdout_cases(runs: Sequence[Run], exclude: Iterable[TrainingExample], stages: Iterable[str], size: int, seed: int = 0) -> list[ReplayCase]:
    """A fixed-size, deterministic sample of successful runs disjoint from the batch, with their verdicts and stage outputs.

    The sample is the ``size`` runs with the smallest seeded hash of their template and input (the trajectory id
    breaks ties), so it neither grows with the log nor changes between the baseline and the candidate, and two fresh
    homes with the same inputs replay the same cases in the same order (their paired bootstrap then agrees too).
    """
    if size < 0:
        raise ValueError(f"holdout size must be >= 0, got {size}")
    excluded = list(exclude)
    ex_traj = {e.trajectory_id for e in excluded}
    ex_inputs = {e.metadata.get("input") for e in excluded}
    stages = set(stages)
    good = [r for r in runs if r.succeeded and r.template and r.input and r.trajectory_id not in ex_traj and r.input not in ex_inputs]
    good.sort(key=lambda r: (stable_id("holdout", seed, r.template, r.input), r.trajectory_id))
    out = []
    for r in good[:size]:
        outputs = r.metadata.get("stage_outputs") or {}
        label = r.output.get("label") if isinstance(r.output, Mapping) else None
        review = next((str(s) for s, t in (r.metadata.get("stage_types") or {}).items() if t == "human_review"), None)
        accepted = tuple(r.metadata["expected_label"]) if r.metadata.get("expected_label") else None
        out.append(ReplayCase(stable_id("holdout", r.template, r.input, r.trajectory_id), "holdout", str(r.template), r.input,
                              {s: outputs[s] for s in stages if s in outputs}, label, r.trajectory_id, review, accepted))
    return out


def replay_cases(model: Any, cases: Sequence[ReplayCase], revisit_limit: int = 3, **runner_kwargs: Any) -> list[dict[str, Any]]:
    """Run each case through its template with ``model``; per case: status, verdict, stage correctness, loop/step-limit flags.

    A replay cannot wait for a compliance officer: a run that reaches a ``human_review`` stage parks there
    (LangGraph interrupt, in a throwaway checkpointer) and that routing is its outcome, scored against the
    route the recorded run took, never as an error.
    """
    outcomes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agenttune-replay-") as review:  # parked reviews and their checkpoints
        kwargs = {"audit": None, "destinations": [], "review_dir": review, **runner_kwargs}
        runners: dict[str, Any] = {}
        for case in cases:
            outcomes.append(_replay_one(runners, model, case, revisit_limit, kwargs))
    return outcomes


def _replay_one(runners: dict[str, Any], model: Any, case: ReplayCase, revisit_limit: int, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """One case through its template: the outcome row ``replay_cases`` returns."""
    from agenttune_lib.decide.runner import GraphRunner

    if case.template not in runners:
        runners[case.template] = GraphRunner.from_template(case.template, model=model, **kwargs)
    runner = runners[case.template]
    state = runner.run(case.input)
    parked = runner.waiting_review(state.run_id) if state.status == "suspended" else None
    routed = str(parked.get("stage_id")) if parked else None
    first: dict[str, Any] = {}
    for step in state.step_history:
        if step.get("status") == "ok":
            first.setdefault(str(step.get("stage_id")), step.get("output"))
    stage_ok = {s: (s in first and same_output(first[s], want)) for s, want in case.expected_stages.items()}
    loop = any(n > revisit_limit for s, n in (state.visits or {}).items())
    errored = state.status == "error" or any(step.get("status") == "error" for step in state.step_history)
    label = f"human_review:{routed}" if routed else (state.verdict.get("label") if isinstance(state.verdict, Mapping) else None)
    if case.accepted_labels:
        verdict_ok = label in case.accepted_labels
    elif case.expected_label is None and case.expected_review is None:
        verdict_ok = None
    elif case.expected_review is not None:
        verdict_ok = routed == case.expected_review
    else:
        verdict_ok = label == case.expected_label
    finished = state.status == "completed" or routed is not None
    passed = finished and not loop and not errored and all(stage_ok.values()) and verdict_ok is not False
    return {"case_id": case.case_id, "kind": case.kind, "status": state.status, "label": label,
            "routed_to_review": routed, "stage_correct": stage_ok,
            "stage_outputs": {s: first.get(s) for s in case.expected_stages}, "verdict_correct": verdict_ok,
            "loop_collapse": loop, "step_limit": state.status == "step_limit", "error": errored, "passed": passed}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def replay_summary(outcomes: Sequence[Mapping[str, Any]], kind: str) -> dict[str, Any]:
    """Rates over one kind of case: passed, stage correctness at the expected stages, verdict accuracy, loop/step-limit/error."""
    rows = [o for o in outcomes if o["kind"] == kind]
    stage = [float(v) for o in rows for v in o["stage_correct"].values()]
    verdict = [float(o["verdict_correct"]) for o in rows if o["verdict_correct"] is not None]
    return {
        "n": len(rows),
        "pass_rate": _mean([float(o["passed"]) for o in rows]),
        "stage_correct": _mean(stage),
        "verdict_accuracy": _mean(verdict),
        "loop_collapse_rate": _mean([float(o["loop_collapse"]) for o in rows]),
        "step_limit_rate": _mean([float(o["step_limit"]) for o in rows]),
        "error_rate": _mean([float(o["error"]) for o in rows]),
    }
