"""Collection: DECIDE runs → EventLogs in the warehouse, and DPO pairs / BCO labels from an audit log."""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from typing import Any

from agenttune_lib.decide.audit import AuditReader, require_verified
from agenttune_lib.decide.pairs import MODEL_STAGES, extract_bco_labels, extract_dpo_pairs, run_is_good
from agenttune_lib.events import EventLog

__all__ = ["MODEL_STAGES", "CollectRunner", "CollectResult", "DecideToTrainerBridge", "extract_dpo_pairs", "extract_bco_labels", "run_is_good", "replace_partition_logs"]


@dataclasses.dataclass
class CollectResult:
    """What one collection pass produced."""

    states: list[Any]
    logs: list[EventLog]
    verdict_counts: dict[str, int]
    status_counts: dict[str, int]
    written: int
    #: Each run's summary with personal data masked: what may be shown (CLI output, Dagster metadata).
    summaries: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: Each run's step history with personal data masked (stage, type, status, error).
    redacted_steps: list[list[dict[str, Any]]] = dataclasses.field(default_factory=list)

    def sample_trace(self) -> dict[str, Any] | None:
        """The first run's summary, redacted (never the raw state: it holds the input's personal data)."""
        return self.summaries[0] if self.summaries else None


class CollectRunner:
    """Runs a GraphRunner over inputs and stores each run as a (redacted) light-tier EventLog with Provenance."""

    def __init__(self, runner: Any, warehouse: Any = None, provenance: Any = None, source: str = "decide") -> None:
        self.runner = runner
        self.warehouse = warehouse
        self.provenance = provenance
        self.source = source

    def to_eventlog(self, state: Any) -> EventLog:
        """The run as an EventLog, personal-data fields masked like the audit log."""
        log = EventLog.from_pipeline_state(self.runner.redacted_state(state), id=state.run_id)
        log.metadata.update({"template_id": state.template_id, "status": state.status, "task": f"decide:{state.template_id}"})
        return log

    def collect(self, inputs: Iterable[Any], expected: Iterable[Any] | None = None) -> CollectResult:
        """Run every input; ``expected`` (aligned with ``inputs``) gives each one's expected verdict label(s) or None."""
        inputs = list(inputs)
        expected = list(expected) if expected is not None else [None] * len(inputs)
        if len(expected) != len(inputs):
            raise ValueError(f"collect: {len(expected)} expected labels for {len(inputs)} inputs")
        states = [self.runner.run(value, expected_label=want) for value, want in zip(inputs, expected)]
        logs = [self.to_eventlog(s) for s in states]
        written = 0
        if self.warehouse is not None and logs:
            provs = None
            if self.provenance is not None:
                from agenttune_lib.warehouse import Provenance

                base = self.provenance
                provs = [
                    Provenance(
                        run_id=base.run_id, asset_key=base.asset_key, partition=base.partition,
                        model_version=base.model_version, adapter_version=base.adapter_version,
                        extra={**dict(base.extra), "decide_run_id": s.run_id, "template_id": s.template_id,
                               "status": s.status, "label": s.verdict.get("label")},
                    )
                    for s in states
                ]
            written = self.warehouse.append_logs(logs, provenance=provs, source=self.source)
        verdicts = collections.Counter(str(s.verdict.get("label")) for s in states)
        statuses = collections.Counter(s.status for s in states)
        redactors = [self.runner.redactor_for(s) for s in states]
        summaries = [red(s.summary()) for red, s in zip(redactors, states)]
        steps = [
            red([{k: step.get(k) for k in ("stage_id", "stage_type", "status", "error")} for step in s.step_history])
            for red, s in zip(redactors, states)
        ]
        return CollectResult(states, logs, dict(verdicts), dict(statuses), int(written or 0), summaries, steps)


def replace_partition_logs(warehouse: Any, asset_key: str, partition: str) -> int:
    """Delete the EventLogs an earlier materialization of ``asset_key``/``partition`` wrote, so that re-running a
    partition replaces its output instead of duplicating it; returns how many trajectories were removed."""
    if not warehouse.has_table("trajectories"):
        return 0
    with warehouse.connect() as con:
        ids = [r[0] for r in con.execute("SELECT id FROM trajectories WHERE asset_key = ? AND partition = ?", [asset_key, partition]).fetchall()]
        if ids:
            con.execute("DELETE FROM trajectories WHERE asset_key = ? AND partition = ?", [asset_key, partition])  # events live in their rows
    return len(ids)


class DecideToTrainerBridge:
    """An audit log as trainer-ready rows: TRL's DPO columns (prompt/chosen/rejected) and BCO columns (prompt/completion/label)."""

    def __init__(self, audit_path: Any, curate: Any = None, verify: bool = True, **verify_kwargs: Any) -> None:
        self.reader = audit_path if isinstance(audit_path, AuditReader) else AuditReader(audit_path)
        self.curate = curate
        self.verify = verify
        #: ``key``, ``warehouse`` or ``heads`` for ``verify_audit`` (where the head checkpoint lives).
        self.verify_kwargs = verify_kwargs

    def _records(self) -> list[dict[str, Any]]:
        if self.verify:
            # Training data must come from an untampered trail: a forged line would become a preference pair.
            require_verified(self.reader.path, **self.verify_kwargs)
        records = self.reader.records()
        return [r for r in records if self.curate(r)] if self.curate is not None else records

    def extract_dpo_pairs(self, **kwargs: Any) -> list[dict[str, Any]]:
        return extract_dpo_pairs(self._records(), **kwargs)

    def extract_bco_labels(self) -> list[dict[str, Any]]:
        return extract_bco_labels(self._records())

    def dataset_rows(self, algorithm: str) -> list[dict[str, Any]]:
        """Rows with exactly the columns TRL's DPOTrainer (``dpo``) or BCOTrainer (``bco``) reads."""
        if algorithm == "dpo":
            return [{"prompt": p["prompt"], "chosen": p["chosen"], "rejected": p["rejected"]} for p in self.extract_dpo_pairs()]
        if algorithm == "bco":
            return [{"prompt": r["prompt"], "completion": r["completion"], "label": r["label"]} for r in self.extract_bco_labels()]
        raise ValueError(f"algorithm must be 'dpo' or 'bco', got {algorithm!r}")
