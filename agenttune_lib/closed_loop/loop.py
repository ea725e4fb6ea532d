"""ClosedLoop: detector -> classifier -> generator -> buffer, with the read offset committed alongside the examples."""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agenttune_lib.closed_loop.buffer import TrainingBuffer
from agenttune_lib.closed_loop.classifier import FailureClassifier
from agenttune_lib.closed_loop.detector import FailureDetector, audit_reader_name, run_from_eventlog
from agenttune_lib.closed_loop.generator import (
    ReferenceCorrector, ReplayValidator, StageRegenerator, TemplateReplayValidator, TrainingExampleGenerator, process_failures,
)
from agenttune_lib.events import EventLog

__all__ = ["ClosedLoop", "IngestReport", "audit_identity", "find_rotated"]


def audit_identity(path: Path) -> str | None:
    """A log file's identity: the SHA-1 of its first complete line (None while it has none)."""
    try:
        with path.open("rb") as fh:
            first = fh.readline()
    except FileNotFoundError:
        return None
    return hashlib.sha1(first).hexdigest() if first.endswith(b"\n") else None


def find_rotated(path: Path, identity: str) -> Path | None:
    """The rotated copy of ``path`` (``<name>.<suffix>`` beside it) whose identity is ``identity``."""
    for cand in sorted(path.parent.glob(path.name + ".*")):
        if cand.suffix in (".head", ".lock") or not cand.is_file():
            continue
        if audit_identity(cand) == identity:
            return cand
    return None


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
        corrector_model: Any = None,
        verify_audit: bool = True,
        audit_heads_warehouse: Any = None,
    ) -> None:
        self.buffer = buffer
        # An audit log is training input: a chain that fails verification (edited, truncated, unkeyed) is never read.
        self.verify_audit = verify_audit
        self.audit_heads_warehouse = audit_heads_warehouse
        self.detector = detector or FailureDetector()
        self.classifier = classifier or FailureClassifier()
        self.references = ReferenceCorrector()
        if generator is None and corrector_model is not None:
            # The failing stage regenerated for the failing input and validated by re-running the template.
            generator = TrainingExampleGenerator(
                StageRegenerator(corrector_model), TemplateReplayValidator(self.detector, corrector_model), system_prompt=system_prompt
            )
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

    def _verify(self, path: Path) -> None:
        """Raise AuditError unless the log's keyed chain verifies against its head (the given warehouse's, else the default stores)."""
        from agenttune_lib.decide.audit import WarehouseHeadStore, log_id, require_verified

        if self.audit_heads_warehouse is not None:
            store = WarehouseHeadStore(self.audit_heads_warehouse)
            if store.get(log_id(path)) is not None:
                require_verified(path, heads=store)
                return
        require_verified(path)

    def ingest_audit(self, path: str | Path) -> IngestReport:
        """Read new complete runs from a DECIDE audit log and buffer their failures' examples.

        The stored offset belongs to one file identity (the hash of its first line). When the
        log was rotated (a new first line, or a stored offset past the end), the rest of the
        rotated file (``<name>.*`` beside it with the stored identity) is read first, then the
        new file from its start.
        """
        path = Path(path)
        if self.verify_audit:
            self._verify(path)
        reader = audit_reader_name(path)
        offset, identity = self.buffer.position(reader)
        current = audit_identity(path)
        reads = []
        if offset and ((identity is not None and current != identity) or offset > path.stat().st_size):
            rotated = find_rotated(path, identity) if identity is not None else None
            if rotated is not None:
                if self.verify_audit:
                    self._verify(rotated)
                self._load_references(rotated, offset)
                reads.append(self.detector.read_audit(rotated, offset))
            offset = 0
        self._load_references(path, offset)
        reads.append(self.detector.read_audit(path, offset))
        runs = [r for rd in reads for r in rd.runs]
        failures = [f for rd in reads for f in rd.failures]
        for rd in reads:
            self.references.add(rd.successes)
        examples, dropped = process_failures(failures, self.classifier, self.generator)
        rewards = [r.reward for r in runs if r.reward is not None]
        end = reads[-1].end_offset
        new = self.buffer.add(examples, dropped, rewards, offsets={reader: (end, current or audit_identity(path))})
        return self._report(reader, runs, failures, examples, dropped, new, reads[0].start_offset, end)

    def ingest_logs(self, logs: Iterable[EventLog], reader: str = "eventlogs") -> IngestReport:
        """Buffer failures among spine-collected EventLogs (``Project.heal``); re-ingesting a log is a no-op."""
        runs = [run_from_eventlog(log) for log in logs]
        failures = self.detector.detect(runs)
        failed = {f.trajectory_id for f in failures}
        self.references.add(r for r in runs if r.trajectory_id not in failed and r.succeeded is not False)
        examples, dropped = process_failures(failures, self.classifier, self.generator)
        rewarded = [r for r in runs if r.reward is not None]
        # Keyed by episode id: re-ingesting the same logs neither re-buffers failures nor re-observes rewards.
        new = self.buffer.add(examples, dropped, [r.reward for r in rewarded], reward_keys=[r.trajectory_id for r in rewarded])
        return self._report(reader, runs, failures, examples, dropped, new, 0, 0)

    @staticmethod
    def _report(reader, runs, failures, examples, dropped, new, start, end) -> IngestReport:
        signals: dict[str, int] = {}
        for f in failures:
            for s in f.signals:
                signals[s] = signals.get(s, 0) + 1
        return IngestReport(reader, len(runs), len(failures), signals, new, sum(e.accepted for e in examples), len(dropped), start, end)
