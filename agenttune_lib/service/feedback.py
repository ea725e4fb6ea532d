"""Served feedback into the self-healing loop: new feedback rows -> FailureDetector -> root cause -> a corrected
example (the reviewer's correction, validated by replay) -> TrainingBuffer, with the read position committed in the
same transaction as the examples (a restart neither skips nor repeats feedback)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from agenttune_lib.closed_loop.buffer import TrainingBuffer
from agenttune_lib.closed_loop.classifier import FailureClassifier
from agenttune_lib.closed_loop.detector import FailureDetector, run_from_eventlog
from agenttune_lib.closed_loop.generator import Correction, ReplayValidator, TrainingExampleGenerator, process_failures
from agenttune_lib.closed_loop.types import ROOT_CAUSES, Classification, Failure, Run
from agenttune_lib.service.tools import CALL_RE
from agenttune_lib.service.traffic import SERVE_SOURCE, feedback_after

__all__ = ["FEEDBACK_READER", "ServedClassifier", "ServedExampleGenerator", "ServedIngest", "ingest_served_feedback", "pending_feedback", "served_run"]

#: The TrainingBuffer reader name whose offset is the last feedback ``seq`` ingested.
FEEDBACK_READER = "served:feedback"


def served_run(log: Any) -> Run:
    """A served request (with its feedback) in the closed loop's view: the judge score is the feedback reward."""
    run = run_from_eventlog(log, judge_score=log.metadata.get("feedback_reward"))
    run.output = log.metadata.get("completion_text", run.output)
    # Not a DECIDE run: no template to replay it through (the gate's DECIDE replay arm skips it).
    run.template = None
    return run


def _called_tools(text: str) -> list[str]:
    names = []
    for m in CALL_RE.finditer(text or ""):
        try:
            names.append(str(json.loads(m.group(1)).get("name")))
        except (ValueError, AttributeError):
            names.append("?")
    return names


class ServedClassifier(FailureClassifier):
    """The reviewer's root cause when feedback names one; else the tool calls of reply and correction decide
    (a different or missing tool is ``wrong_tool``, a wrong answer under the same tools ``hallucinated_output``)."""

    def classify(self, failure: Failure) -> Classification | None:
        meta = failure.run.metadata
        label = meta.get("feedback_root_cause")
        if label in ROOT_CAUSES:
            return Classification(label, "feedback", "root cause named by the feedback")
        decided = super().classify(failure)
        if decided is not None:
            return decided
        correction = meta.get("feedback_correction")
        if not correction:
            return None
        mine, theirs = _called_tools(meta.get("completion_text") or ""), _called_tools(correction)
        if mine != theirs and (mine or theirs):
            return Classification("wrong_tool", "rules", f"served reply called {mine or 'no tool'}, the correction calls {theirs or 'no tool'}")
        return Classification("hallucinated_output", "rules", "the correction replaces the served answer under the same tool calls")


class ServedExampleGenerator(TrainingExampleGenerator):
    """Examples whose prompt is the full served conversation and whose rejected side is the served reply text."""

    def __init__(self, detector: FailureDetector) -> None:
        super().__init__(self._correct, ReplayValidator(detector))

    @staticmethod
    def _correct(failure: Failure, classification: Classification) -> Correction | None:
        text = failure.run.metadata.get("feedback_correction")
        if not text:
            return None
        # A person's correction of this very request: it is the judged-good answer (score 1.0) for the replay.
        return Correction(str(text), f"feedback:{failure.trajectory_id}", 1.0)

    def prompt(self, run: Run, correction: Correction | None = None) -> list[dict[str, str]]:
        return [dict(m) for m in run.metadata.get("messages") or []] or super().prompt(run, correction)

    @staticmethod
    def rejected_response(failure: Failure, correction: Correction | None = None) -> str:
        return str(failure.run.metadata.get("completion_text") or failure.run.output or "")

    def generate(self, failure: Failure, classification: Classification) -> Any:
        """The example, carrying how the request was decoded (its tools, structured or not) so the gate replays it as served."""
        example = super().generate(failure, classification)
        if example is not None:
            meta = failure.run.metadata
            example.metadata.update({k: meta[k] for k in ("tool_specs", "structured_tool_calls", "allow_text") if k in meta})
        return example


@dataclasses.dataclass(frozen=True)
class ServedIngest:
    """What one ingest of served feedback read and buffered."""

    feedback_rows: int
    failures: int
    buffered: int
    accepted: int
    dropped: int
    start_seq: int
    end_seq: int
    request_ids: tuple[str, ...]


def pending_feedback(warehouse: Any, buffer: TrainingBuffer) -> int:
    """How many feedback rows the buffer has not ingested yet (the sensor's cheap check)."""
    if not warehouse.has_table("served_feedback"):
        return 0
    done, _ = buffer.position(FEEDBACK_READER)
    return int(warehouse.execute("SELECT count(*) FROM served_feedback WHERE seq > ?", [done])[0][0])


def ingest_served_feedback(warehouse: Any, buffer: TrainingBuffer, detector: FailureDetector | None = None,
                           classifier: FailureClassifier | None = None) -> ServedIngest:
    """Buffer the failures among requests that received feedback since the last ingest."""
    detector = detector or FailureDetector()
    classifier = classifier or ServedClassifier()
    if not isinstance(classifier, ServedClassifier):
        base = classifier
        classifier = ServedClassifier(llm=base.llm, use_rules=base.use_rules)
    start, _ = buffer.position(FEEDBACK_READER)
    rows = feedback_after(warehouse, start)
    if not rows:
        return ServedIngest(0, 0, 0, 0, 0, start, start, ())
    # The newest feedback per request decides (a later thumbs-up overrides an earlier thumbs-down).
    ids = list(dict.fromkeys(r[1] for r in rows))
    logs = warehouse.read_logs(ids=ids, source=SERVE_SOURCE)
    runs = [served_run(log) for log in logs]
    failures = detector.detect(runs)
    examples, dropped = process_failures(failures, classifier, ServedExampleGenerator(detector))
    rewarded = [r for r in runs if r.reward is not None]
    end = int(rows[-1][0])
    new = buffer.add(examples, dropped, [r.reward for r in rewarded], offsets={FEEDBACK_READER: (end, None)},
                     reward_keys=[f"{r.trajectory_id}@{end}" for r in rewarded])
    return ServedIngest(len(rows), len(failures), new, sum(e.accepted for e in examples), len(dropped), start, end, tuple(ids))
