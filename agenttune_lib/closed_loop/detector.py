"""FailureDetector: flags runs under a judge threshold, past a revisit limit, or with a tool crash.

It reads DECIDE audit logs (JSON lines) and EventLogs collected by the spine. Reading an
audit log returns the byte offset after the last complete line; the caller commits that
offset in the same transaction as the examples it derived (``TrainingBuffer.add(offsets=…)``),
so a restart neither skips nor repeats a line.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agenttune_lib.closed_loop.types import Failure, Run, stable_id
from agenttune_lib.events import EventLog

__all__ = ["DetectorConfig", "FailureDetector", "AuditRead", "run_from_eventlog", "run_from_pipeline_state", "audit_reader_name"]


@dataclasses.dataclass(frozen=True)
class DetectorConfig:
    """A run fails below ``judge_threshold`` or when one stage is visited more than ``revisit_limit`` times."""

    judge_threshold: float = 0.5
    revisit_limit: int = 3
    #: A run with stage lines but no completion line, silent for this long, is orphaned (its writer died) and skipped.
    open_run_timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.revisit_limit < 1:
            raise ValueError(f"revisit_limit must be >= 1, got {self.revisit_limit}")
        if self.open_run_timeout_s < 0:
            raise ValueError(f"open_run_timeout_s must be >= 0, got {self.open_run_timeout_s}")


@dataclasses.dataclass
class AuditRead:
    """What one read of an audit log found, and the offset to commit with it."""

    reader: str
    start_offset: int
    end_offset: int
    runs: list[Run]
    failures: list[Failure]
    skipped_lines: int
    orphaned: list[str] = dataclasses.field(default_factory=list)

    @property
    def successes(self) -> list[Run]:
        failed = {f.trajectory_id for f in self.failures}
        return [r for r in self.runs if r.trajectory_id not in failed and r.succeeded is not False]


def audit_reader_name(path: str | Path) -> str:
    """The durable offset key of one audit log file."""
    return f"audit:{Path(path).resolve()}"


def _judge_score(state: Mapping[str, Any]) -> float | None:
    scores = [
        float(s["score"])
        for s in state.get("step_history") or []
        if isinstance(s, Mapping) and s.get("stage_type") == "llm_judge" and isinstance(s.get("score"), (int, float))
    ]
    return min(scores) if scores else None


def run_from_pipeline_state(state: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> Run:
    """A DECIDE run (a PipelineState dict) in the closed loop's view, through the EventLog projection."""
    log = EventLog.from_pipeline_state(state)
    extra = dict(extra or {})
    fields = state.get("input") if isinstance(state.get("input"), Mapping) else {}
    source = extra.get("source") or fields.get("source") or fields.get("channel")
    trusted = extra.get("trusted", fields.get("trusted", True))
    status = state.get("status")
    return Run(
        trajectory_id=log.id,
        records=log.to_audit_records(),
        input=str(state.get("input_text", "")),
        output=state.get("verdict"),
        judge_score=_judge_score(state),
        reward=_judge_score(state),
        template=state.get("template_id"),
        source=str(source) if source else None,
        trusted=bool(trusted) and not fields.get("untrusted", False),
        succeeded=(status == "completed") if status else None,
        metadata={"status": status, "visits": dict(state.get("visits") or {}), "input": dict(fields), **extra},
    )


def run_from_eventlog(log: EventLog, judge_score: float | None = None) -> Run:
    """A spine-collected EventLog in the closed loop's view; the judge score defaults to the episode reward."""
    episode = log.rewards("episode")
    score = judge_score if judge_score is not None else log.metadata.get("judge_score", episode[-1] if episode else None)
    texts = [e.payload.get("content", e.payload.get("text")) for e in log.events if e.kind.value == "text"]
    meta = dict(log.metadata)
    return Run(
        trajectory_id=log.id,
        records=log.to_audit_records(),
        input=str(meta.get("task", "")),
        output=texts[-1] if texts else None,
        judge_score=float(score) if score is not None else None,
        reward=episode[-1] if episode else None,
        template=meta.get("template_id") or meta.get("task_type"),
        source=meta.get("source"),
        trusted=not meta.get("untrusted", False),
        succeeded=meta.get("succeeded"),
        metadata=meta,
    )


def run_from_audit_records(stages: list[Mapping[str, Any]], run: Mapping[str, Any]) -> Run:
    """A DECIDE run from its audit lines (``record_type`` "stage" lines and the "run" completion line)."""
    state = {
        "run_id": run.get("run_id"),
        "template_id": run.get("template_id"),
        "input_text": run.get("input_text", ""),
        "status": run.get("status"),
        "verdict": run.get("verdict"),
        "visits": run.get("visits") or {},
        "step_history": [
            {k: st.get(k) for k in ("stage_id", "stage_type", "output", "status", "error", "tool", "args", "score", "visit")}
            for st in stages
        ],
    }
    extra = {k: run[k] for k in ("source", "trusted") if k in run}
    extra["audit_seq"] = run.get("seq")
    # The first visit's prompt and output per stage: where a stage-level correction starts.
    first: dict[str, Mapping[str, Any]] = {}
    for st in stages:
        first.setdefault(str(st.get("stage_id")), st)
    extra["stage_prompts"] = {k: p for k, v in first.items() if (p := _stage_prompt(v)) is not None}
    # Stage lines that failed (a model stage's schema failure, a tool error), even when the template routed on to a verdict.
    extra["stage_errors"] = [
        {"stage": st.get("stage_id"), "kind": st.get("stage_type"), "error": st.get("error")} for st in stages if st.get("status") == "error"
    ]
    # What an errored model stage actually replied (its last rejected attempt): the "rejected" side of its correction.
    extra["stage_replies"] = {
        str(st.get("stage_id")): (st.get("attempts") or [{}])[-1].get("reply")
        for st in stages if st.get("status") == "error" and st.get("attempts") and isinstance((st.get("attempts") or [{}])[-1], Mapping)
    }
    if run.get("served_adapter_id"):
        extra["served_adapter_id"] = run.get("served_adapter_id")
    if run.get("expected_label"):
        extra["expected_label"] = list(run["expected_label"])  # the input author's answer, not this run's
    extra["stage_outputs"] = {k: v.get("output") for k, v in first.items()}
    extra["stage_types"] = {k: v.get("stage_type") for k, v in first.items()}
    return run_from_pipeline_state(state, extra)


def _stage_prompt(line: Mapping[str, Any]) -> str | None:
    """A stage line's prompt; for a stage whose every reply was rejected, the first attempt's prompt."""
    if line.get("prompt") is not None:
        return str(line["prompt"])
    attempts = line.get("attempts") or []
    first = attempts[0] if attempts and isinstance(attempts[0], Mapping) else {}
    return str(first["prompt"]) if first.get("prompt") is not None else None


class FailureDetector:
    """Flags failed runs from three signals; every flag names its evidence."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()

    def check(self, run: Run) -> Failure | None:
        """The failure this run is, or None for a run that passed all three checks."""
        signals: list[str] = []
        evidence: dict[str, Any] = {}
        if run.judge_score is not None and run.judge_score < self.config.judge_threshold:
            signals.append("judge_below_threshold")
            evidence["judge_score"] = run.judge_score
            evidence["judge_threshold"] = self.config.judge_threshold
        visits = run.stage_visits()
        visits.update({k: max(v, visits.get(k, 0)) for k, v in (run.metadata.get("visits") or {}).items()})
        looped = {stage: n for stage, n in visits.items() if n > self.config.revisit_limit and stage not in ("input", "verdict")}
        if looped or run.metadata.get("status") == "step_limit":
            signals.append("loop_collapse")
            stage = max(looped, key=looped.get) if looped else None
            evidence["loop_stage"] = stage
            evidence["visits"] = looped.get(stage, 0) if stage else 0
            evidence["revisit_limit"] = self.config.revisit_limit
            evidence["loop_stages"] = list(looped)
        crashes = [r for r in run.records if r.get("status") == "error" and r.get("error") not in (None, "", False)]
        if crashes:
            signals.append("tool_crash" if any(r.get("kind") == "tool_call" for r in crashes) else "stage_error")
            evidence["errors"] = [{"stage": r.get("stage"), "kind": r.get("kind"), "error": r.get("error")} for r in crashes]
        else:
            # A stage that failed (e.g. a schema failure routed to manual processing) or a run that ended in error is a
            # failure even when the template still reached a verdict: it must not become a held-out "correct" case.
            failed = list(run.metadata.get("stage_errors") or [])
            if failed or run.metadata.get("status") == "error":
                signals.append("tool_crash" if any(f.get("kind") == "tool_call" for f in failed) else "stage_error")
                evidence["errors"] = failed or [{"stage": None, "kind": "run", "error": run.metadata.get("error") or "run ended in error"}]
        if not signals:
            return None
        return Failure(failure_id=stable_id(run.trajectory_id, sorted(signals)), run=run, signals=signals, evidence=evidence)

    def detect(self, runs: Iterable[Run]) -> list[Failure]:
        return [f for f in (self.check(r) for r in runs) if f is not None]

    def detect_logs(self, logs: Iterable[EventLog]) -> list[Failure]:
        """Failures among spine-collected EventLogs (``Project.heal`` and the warehouse path)."""
        return self.detect(run_from_eventlog(log) for log in logs)

    def read_audit(self, path: str | Path, offset: int = 0, now: dt.datetime | None = None) -> AuditRead:
        """Read a DECIDE audit log from ``offset`` to the last point where no run is half-written.

        Stage lines are held until their run's completion line; the returned ``end_offset``
        never passes the first line of a run still open, so committing it neither skips nor
        repeats a line. A run with no completion line whose last line is older than
        ``open_run_timeout_s`` is orphaned: it is skipped (named in ``orphaned``) so one dead
        writer cannot stall the detector. A line that is not JSON raises ValueError naming the
        file and byte offset.
        """
        path = Path(path)
        size = os.path.getsize(path)
        if offset > size:
            raise ValueError(f"audit log {path}: stored offset {offset} is past its end ({size} bytes); was it truncated or replaced?")
        lines: list[tuple[int, Any]] = []
        pos = offset
        with path.open("rb") as fh:
            fh.seek(offset)
            for raw in fh:
                if not raw.endswith(b"\n"):
                    break
                line = raw.strip()
                obj = None
                if line:
                    try:
                        obj = json.loads(line)
                    except ValueError as exc:
                        raise ValueError(f"audit log {path}: line at byte {pos} is not JSON ({exc})") from None
                pos += len(raw)
                lines.append((pos, obj))
        orphaned = self._orphans(lines, now)
        open_runs: dict[Any, list[Mapping[str, Any]]] = {}
        done: list[tuple[list[Mapping[str, Any]], Mapping[str, Any]]] = []
        committed: list[Run] = []
        skipped = 0
        end = offset
        for pos, obj in lines:
            if obj is not None:
                kind = obj.get("record_type") if isinstance(obj, Mapping) else None
                if kind == "stage" and obj.get("run_id") not in orphaned:
                    open_runs.setdefault(obj.get("run_id"), []).append(obj)
                elif kind == "run":
                    done.append((open_runs.pop(obj.get("run_id"), []), obj))
                elif kind != "stage":
                    skipped += 1
            if not open_runs:
                end = pos
                committed.extend(run_from_audit_records(st, rl) for st, rl in done)
                done = []
        return AuditRead(audit_reader_name(path), offset, end, committed, self.detect(committed), skipped, sorted(map(str, orphaned)))

    def _orphans(self, lines: list[tuple[int, Any]], now: dt.datetime | None) -> set[Any]:
        """Run ids with stage lines and no completion line whose newest line is older than the open-run timeout."""
        last: dict[Any, dt.datetime | None] = {}
        closed: set[Any] = set()
        for _, obj in lines:
            if not isinstance(obj, Mapping):
                continue
            rid = obj.get("run_id")
            if obj.get("record_type") == "run":
                closed.add(rid)
            elif obj.get("record_type") == "stage":
                last[rid] = _timestamp(obj.get("timestamp"))
        now = now or dt.datetime.now(dt.timezone.utc)
        limit = dt.timedelta(seconds=self.config.open_run_timeout_s)
        return {rid for rid, ts in last.items() if rid not in closed and ts is not None and now - ts > limit}


def _timestamp(value: Any) -> dt.datetime | None:
    """An audit line's ISO-8601 timestamp (UTC when naive), or None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        ts = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts if ts.tzinfo else ts.replace(tzinfo=dt.timezone.utc)
