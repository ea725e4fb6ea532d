"""Test helpers for the closed loop: example factories and a fresh warehouse."""
from __future__ import annotations

from agenttune_lib.closed_loop.types import TrainingExample, stable_id


def make_example(i: int, cause: str = "loop_collapse", accepted: bool = True, source: str | None = None, trusted: bool = True) -> TrainingExample:
    fid = stable_id("failure", cause, i)
    return TrainingExample(
        example_id=stable_id("example", fid),
        failure_id=fid,
        trajectory_id=f"traj-{i}",
        root_cause=cause,
        prompt=[{"role": "user", "content": f"case {i}"}],
        chosen=f"good {i}",
        rejected=f"bad {i}",
        accepted=accepted,
        source=source or f"src-{i}",
        trusted=trusted,
    )
