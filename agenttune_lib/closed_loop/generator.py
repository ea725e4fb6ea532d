"""TrainingExampleGenerator: a corrected response, validated by replay, as a GRPO/DPO/BCO example."""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agenttune_lib.closed_loop.classifier import FailureClassifier
from agenttune_lib.closed_loop.detector import FailureDetector
from agenttune_lib.closed_loop.types import Classification, Failure, Run, TrainingExample, stable_id

__all__ = ["Correction", "ReferenceCorrector", "ReplayValidator", "TrainingExampleGenerator", "render_response", "process_failures"]


def render_response(output: Any) -> str:
    """The assistant text of a run's output: JSON for structured verdicts, the string otherwise."""
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    return json.dumps(output, sort_keys=True, ensure_ascii=False, default=str)


@dataclasses.dataclass(frozen=True)
class Correction:
    """A corrected response and where it came from (``score`` is its judge score when known)."""

    text: str
    origin: str
    score: float | None = None
    stage: str | None = None
    prompt: str | None = None


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


class ReferenceCorrector:
    """Corrects a failure with the output of the most similar past successful run of the same template."""

    def __init__(self, successes: Iterable[Run] = ()) -> None:
        self.successes: list[Run] = []
        self.add(successes)

    def add(self, runs: Iterable[Run]) -> None:
        self.successes.extend(r for r in runs if r.output is not None)

    def __call__(self, failure: Failure, classification: Classification) -> Correction | None:
        want = _tokens(failure.run.input)
        pool = [r for r in self.successes if r.template == failure.run.template and r.trajectory_id != failure.trajectory_id]
        if not pool:
            return None

        def similarity(run: Run) -> float:
            have = _tokens(run.input)
            return len(want & have) / max(1, len(want | have))

        best = max(pool, key=lambda r: (similarity(r), r.trajectory_id))
        # A looping stage the reference run also passed through, with a different output, is
        # where the failure went wrong: correct that stage's output, under that stage's prompt.
        mine = failure.run.metadata.get("stage_outputs") or {}
        theirs = best.metadata.get("stage_outputs") or {}
        prompts = failure.run.metadata.get("stage_prompts") or {}
        for stage in failure.evidence.get("loop_stages") or []:
            if stage in mine and stage in theirs and stage in prompts and render_response(theirs[stage]) != render_response(mine[stage]):
                return Correction(render_response(theirs[stage]), f"reference:{best.trajectory_id}", best.judge_score, stage, prompts[stage])
        return Correction(render_response(best.output), f"reference:{best.trajectory_id}", best.judge_score)


class ReplayValidator:
    """Replays the failed run with the correction in place of its failing tail and re-runs the detector.

    The correction is accepted only if the replayed run raises no signal: the loop is cut,
    the errored step is gone, and the judge score (the injected judge's, else the reference
    run's) clears the threshold.
    """

    def __init__(self, detector: FailureDetector, judge: Callable[[str, str], float] | None = None) -> None:
        self.detector = detector
        self.judge = judge

    def __call__(self, failure: Failure, correction: Correction, rejected: str) -> tuple[bool, str]:
        if not correction.text.strip():
            return False, "empty correction"
        if correction.text.strip() == rejected.strip():
            return False, "correction repeats the failed response"
        limit = self.detector.config.revisit_limit
        kept: list[dict[str, Any]] = []
        seen: dict[str, int] = {}
        for record in failure.run.records:
            stage = str(record.get("stage"))
            if record.get("status") == "error" or stage == "verdict":
                break
            seen[stage] = seen.get(stage, 0) + 1
            if seen[stage] > limit:
                break
            kept.append(record)
        kept.append({"trajectory_id": failure.trajectory_id, "seq": len(kept), "kind": "text", "stage": "verdict", "status": "ok",
                     "state": {"content": correction.text}})
        score = self.judge(failure.run.input, correction.text) if self.judge else correction.score
        if "judge_below_threshold" in failure.signals and score is None:
            return False, "no judge score for the correction of a judge failure"
        replay = Run(trajectory_id=failure.trajectory_id + ":replay", records=kept, input=failure.run.input,
                     output=correction.text, judge_score=score, template=failure.run.template)
        again = self.detector.check(replay)
        if again is not None:
            return False, f"replay still fails: {again.signals}"
        return True, f"replay passed ({correction.origin})"


class TrainingExampleGenerator:
    """Builds the TrainingExample for a classified failure; ``corrector`` and ``validator`` are injected."""

    def __init__(
        self,
        corrector: Callable[[Failure, Classification], Correction | None],
        validator: Callable[[Failure, Correction, str], tuple[bool, str]],
        system_prompt: str | None = None,
    ) -> None:
        self.corrector = corrector
        self.validator = validator
        self.system_prompt = system_prompt

    def prompt(self, run: Run, correction: Correction | None = None) -> list[dict[str, str]]:
        """The run's input, or the corrected stage's own prompt for a stage-level correction."""
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": correction.prompt if correction and correction.prompt else run.input})
        return messages

    @staticmethod
    def rejected_response(failure: Failure, correction: Correction | None = None) -> str:
        """What the agent produced: the corrected stage's first output, the looping stage's output, else its final output."""
        if correction is not None and correction.stage:
            outs = failure.run.metadata.get("stage_outputs") or {}
            if correction.stage in outs:
                return render_response(outs[correction.stage])
        stage = failure.evidence.get("loop_stage")
        if stage:
            outs = [r["state"].get("content") for r in failure.run.records if r.get("stage") == stage and isinstance(r.get("state"), dict)]
            outs = [o for o in outs if o is not None]
            if outs:
                return render_response(outs[-1])
        return render_response(failure.run.output)

    def generate(self, failure: Failure, classification: Classification) -> TrainingExample | None:
        """The example, accepted or not; None when no correction could be produced at all."""
        correction = self.corrector(failure, classification)
        if correction is None:
            return None
        rejected = self.rejected_response(failure, correction)
        ok, why = self.validator(failure, correction, rejected)
        return TrainingExample(
            example_id=stable_id("example", failure.failure_id, correction.text),
            failure_id=failure.failure_id,
            trajectory_id=failure.trajectory_id,
            root_cause=classification.root_cause,
            prompt=self.prompt(failure.run, correction),
            chosen=correction.text,
            rejected=rejected,
            accepted=ok,
            classified_by=classification.method,
            source=failure.run.source or "input:" + stable_id(failure.run.input)[:12],
            trusted=failure.run.trusted,
            reward=failure.run.reward,
            validation=why,
            metadata={"signals": failure.signals, "reason": classification.reason, "template": failure.run.template,
                      "origin": correction.origin, "stage": correction.stage, "input": failure.run.input},
        )


def process_failures(
    failures: Sequence[Failure], classifier: FailureClassifier, generator: TrainingExampleGenerator
) -> tuple[list[TrainingExample], list[tuple[str, str]]]:
    """Classify and generate for each failure: (examples, dropped as (failure_id, reason))."""
    examples: list[TrainingExample] = []
    dropped: list[tuple[str, str]] = []
    for failure in failures:
        label = classifier.classify(failure)
        if label is None:
            dropped.append((failure.failure_id, "unclassified"))
            continue
        example = generator.generate(failure, label)
        if example is None:
            dropped.append((failure.failure_id, "no correction"))
        else:
            examples.append(example)
    return examples, dropped
