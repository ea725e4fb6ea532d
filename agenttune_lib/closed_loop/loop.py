"""ClosedLoop: detector -> classifier -> generator -> buffer, with the read offset committed alongside the examples."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agenttune_lib.closed_loop.buffer import TrainingBuffer
from agenttune_lib.closed_loop.classifier import FailureClassifier
from agenttune_lib.closed_loop.detector import FailureDetector, audit_reader_name, run_from_eventlog
from agenttune_lib.closed_loop.generator import ReferenceCorrector, ReplayValidator, TrainingExampleGenerator, process_failures
from agenttune_lib.events import EventLog

__all__ = ["ClosedLoop", "IngestReport"]


@dataclasses.dataclass(frozen=True)
class IngestReport:
    """What one ingest read and what it buffered."""

    reader: str
    runs: int
    failures: int
    signals: dict[str, int]
    buffered: int
    accepted: int
    dropped: int
    start_offset: int
    end_offset: int


class ClosedLoop:
    """Stage 1 of paper §3.9 over an audit log or EventLogs, writing into a durable TrainingBuffer.

    The default corrector uses past successful runs from the same sources; the default
    validator replays the correction through the detector (with ``judge`` when given).
    """

    def __init__(
        self,
        buffer: TrainingBuffer,
        detector: FailureDetector | None = None,
        classifier: FailureClassifier | None = None,
        generator: TrainingExampleGenerator | None = None,
        judge: Callable[[str, str], float] | None = None,
        system_prompt: str | None = None,
    ) -> None:
        self.buffer = buffer
        self.detector = detector or FailureDetector()
        self.classifier = classifier or FailureClassifier()
        self.references = ReferenceCorrector()
        self.generator = generator or TrainingExampleGenerator(
            self.references, ReplayValidator(self.detector, judge), system_prompt=system_prompt
        )
        self._loaded: set[str] = set()

    def _load_references(self, path: Path, upto: int) -> None:
        """Successful runs before the stored offset: the reference pool a restarted process must rebuild."""
        key = str(path.resolve())
        if key in self._loaded:
            return
        self._loaded.add(key)
        if upto > 0:
            earlier = self.detector.read_audit(path, 0)
            self.references.add(r for r in earlier.successes if r.trajectory_id)

    def ingest_audit(self, path: str | Path) -> IngestReport:
        """Read new complete runs from a DECIDE audit log and buffer their failures' examples."""
        path = Path(path)
        reader = audit_reader_name(path)
        offset = self.buffer.offset(reader)
        self._load_references(path, offset)
        read = self.detector.read_audit(path, offset)
        self.references.add(read.successes)
        examples, dropped = process_failures(read.failures, self.classifier, self.generator)
        rewards = [r.reward for r in read.runs if r.reward is not None]
        new = self.buffer.add(examples, dropped, rewards, offsets={reader: read.end_offset})
        return self._report(reader, read.runs, read.failures, examples, dropped, new, read.start_offset, read.end_offset)

    def ingest_logs(self, logs: Iterable[EventLog], reader: str = "eventlogs") -> IngestReport:
        """Buffer failures among spine-collected EventLogs (``Project.heal``); re-ingesting a log is a no-op."""
        runs = [run_from_eventlog(log) for log in logs]
        failures = self.detector.detect(runs)
        failed = {f.trajectory_id for f in failures}
        self.references.add(r for r in runs if r.trajectory_id not in failed and r.succeeded is not False)
        examples, dropped = process_failures(failures, self.classifier, self.generator)
        rewards = [r.reward for r in runs if r.reward is not None]
        new = self.buffer.add(examples, dropped, rewards)
        return self._report(reader, runs, failures, examples, dropped, new, 0, 0)

    @staticmethod
    def _report(reader, runs, failures, examples, dropped, new, start, end) -> IngestReport:
        signals: dict[str, int] = {}
        for f in failures:
            for s in f.signals:
                signals[s] = signals.get(s, 0) + 1
        return IngestReport(reader, len(runs), len(failures), signals, new, sum(e.accepted for e in examples), len(dropped), start, end)
