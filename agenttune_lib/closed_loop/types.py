"""Records the closed loop passes between its stages: runs, failures, classifications, examples."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

#: The five root causes of paper §3.9.
ROOT_CAUSES: tuple[str, ...] = (
    "wrong_tool",
    "wrong_routing",
    "incomplete_reasoning",
    "hallucinated_output",
    "loop_collapse",
)

#: Failure signals the detector reads from a run.
SIGNALS: tuple[str, ...] = ("judge_below_threshold", "loop_collapse", "tool_crash")


def stable_id(*parts: Any) -> str:
    """A short content hash: the same inputs give the same id in every process."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class Run:
    """One finished run in the closed loop's view: ordered audit records plus its outcome.

    ``records`` follow ``EventLog.to_audit_records()``: dicts with trajectory_id, seq,
    kind, stage, status, error and state. ``source`` names where the input came from
    and ``trusted`` whether that origin is trusted (the provenance gate reads both).
    """

    trajectory_id: str
    records: list[dict[str, Any]]
    input: str = ""
    output: Any = None
    judge_score: float | None = None
    reward: float | None = None
    template: str | None = None
    source: str | None = None
    trusted: bool = True
    succeeded: bool | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    def stage_visits(self) -> dict[str, int]:
        """How many records each stage name has (a folded tool stage counts identical calls)."""
        visits: dict[str, int] = {}
        for record in self.records:
            stage = str(record.get("stage", ""))
            visits[stage] = visits.get(stage, 0) + 1
        return visits


@dataclasses.dataclass
class Failure:
    """A run the detector flagged, with the signals that flagged it and their evidence."""

    failure_id: str
    run: Run
    signals: list[str]
    evidence: dict[str, Any]

    @property
    def trajectory_id(self) -> str:
        return self.run.trajectory_id


@dataclasses.dataclass(frozen=True)
class Classification:
    """A root cause with who decided it (``rules`` or ``llm``) and why."""

    root_cause: str
    method: str
    reason: str


@dataclasses.dataclass
class TrainingExample:
    """A corrected response for a failure: one record that projects to GRPO, DPO or BCO rows.

    ``accepted`` is True only when the correction passed replay validation; only accepted
    examples are trained on.
    """

    example_id: str
    failure_id: str
    trajectory_id: str
    root_cause: str
    prompt: list[dict[str, str]]
    chosen: str
    rejected: str
    accepted: bool
    classified_by: str = "rules"
    source: str | None = None
    trusted: bool = True
    reward: float | None = None
    validation: str = ""
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dpo_row(self) -> dict[str, Any]:
        """A TRL conversational preference row."""
        return {
            "prompt": list(self.prompt),
            "chosen": [{"role": "assistant", "content": self.chosen}],
            "rejected": [{"role": "assistant", "content": self.rejected}],
            "trajectory_id": self.trajectory_id,
        }

    def as_bco_rows(self) -> list[dict[str, Any]]:
        """Two TRL unpaired rows: the correction labelled desirable, the failure undesirable."""
        return [
            {"prompt": list(self.prompt), "completion": [{"role": "assistant", "content": self.chosen}], "label": True, "trajectory_id": self.trajectory_id},
            {"prompt": list(self.prompt), "completion": [{"role": "assistant", "content": self.rejected}], "label": False, "trajectory_id": self.trajectory_id},
        ]

    def as_grpo_row(self) -> dict[str, Any]:
        """A multi-completion row: the completions with the rewards a group-relative update needs."""
        return {"prompt": list(self.prompt), "completions": [self.chosen, self.rejected], "rewards": [1.0, 0.0]}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainingExample":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclasses.dataclass(frozen=True)
class HoldoutCase:
    """A past successful run's input and the output that succeeded, with the wrong answers to rank it against."""

    case_id: str
    prompt: list[dict[str, str]]
    expected: str
    candidates: tuple[str, ...]
    trajectory_id: str
    input: str = ""
    template: str | None = None
