"""``run_conformance``: exercise a harness's declared capabilities instead of trusting them."""
from __future__ import annotations

import dataclasses
from typing import Any

from agenttune_lib.spine.harness import Harness
from agenttune_lib.spine.state import Action

__all__ = ["ConformanceReport", "run_conformance"]

_PROBE_TOOL = "__conformance_probe__"


@dataclasses.dataclass
class ConformanceReport:
    """``passed`` when no declared capability drifted from observed behavior."""

    passed: bool
    drift: list[str]
    checks: dict[str, bool] = dataclasses.field(default_factory=dict)


def _probe_actions(harness: Harness, probe: Action | list[Action] | None) -> list[Action]:
    if probe is not None:
        return list(probe) if isinstance(probe, list) else [probe]
    custom = getattr(harness, "conformance_actions", None)
    if callable(custom):
        return list(custom())
    # An unknown tool always changes the log (an error result), whatever the environment.
    return [Action.call(_PROBE_TOOL, {})]


def run_conformance(harness: Harness, task: Any = None, probe: Action | list[Action] | None = None) -> ConformanceReport:
    """Snapshot, step, restore and check the log and environment reverted; check step and max-steps claims.

    ``task`` defaults to the harness's ``default_task()`` when it has one, else a probe string.
    """
    if task is None:
        default = getattr(harness, "default_task", None)
        task = default() if callable(default) else "conformance probe"
    caps = harness.capabilities
    drift: list[str] = []
    checks: dict[str, bool] = {}
    harness.reset(task)
    actions = _probe_actions(harness, probe)
    before_len = len(harness.to_eventlog())
    result = harness.step(actions[0])
    after = harness.to_eventlog()
    checks["step_appends_events"] = len(after) > before_len and len(result.events) == len(after) - before_len
    if not checks["step_appends_events"]:
        drift.append(f"step() reported {len(result.events)} new events but the log grew by {len(after) - before_len}")
    if caps.stepwise_turn:
        checks["stepwise_turn"] = bool(result.events) and list(after.events[before_len:]) == list(result.events)
        if not checks["stepwise_turn"]:
            drift.append("claims stepwise_turn but a step's events are not the log's new tail")

    harness.reset(task)
    if caps.supports_snapshot:
        try:
            env_before = harness.state_fingerprint()
        except NotImplementedError as exc:
            env_before = None
            checks["state_fingerprint"] = False
            drift.append(f"claims supports_snapshot but exposes no environment state fingerprint ({exc})")
        try:
            blob = harness.snapshot()
            log_before = harness.to_eventlog().events
            for action in actions:
                harness.step(action)
            env_changed = env_before is not None and harness.state_fingerprint() != env_before
            if env_before is not None and not env_changed:
                # The probe left the environment alone: change it directly, as a tool could.
                env_changed = harness._perturb_env() and harness.state_fingerprint() != env_before
            harness.restore(blob)
            reverted_log = harness.to_eventlog().events == log_before
            reverted_env = env_before is not None and harness.state_fingerprint() == env_before
            checks["snapshot_restore"] = reverted_log and reverted_env and env_changed
            checks["env_state_restored"] = reverted_env if env_changed else None
            if not reverted_log:
                drift.append("claims supports_snapshot but restore() did not revert the event log")
            if env_before is not None and not env_changed:
                drift.append("neither the probe nor _perturb_env() changed the environment state; restore() of the environment is unverified")
            elif env_before is not None and not reverted_env:
                drift.append("claims supports_snapshot but restore() did not revert the environment state")
        except NotImplementedError as exc:
            checks["snapshot_restore"] = False
            drift.append(f"claims supports_snapshot but snapshot/restore raised: {exc}")
    else:
        try:
            harness.snapshot()
            checks["snapshot_declared"] = False
            drift.append("snapshot() works but supports_snapshot=False (undeclared capability)")
        except NotImplementedError:
            checks["snapshot_declared"] = True

    if caps.supports_streaming:
        harness.reset(task)
        try:
            streamed = list(harness.stream_step(actions[0]))
            checks["streaming"] = bool(streamed)
        except NotImplementedError as exc:
            checks["streaming"] = False
            drift.append(f"claims supports_streaming but stream_step raised: {exc}")
    if caps.supports_interruption:
        harness.reset(task)
        try:
            harness.interrupt()
            checks["interruption"] = True
        except NotImplementedError as exc:
            checks["interruption"] = False
            drift.append(f"claims supports_interruption but interrupt() raised: {exc}")

    if caps.max_steps is not None:
        harness.reset(task)
        n = 0
        done = False
        limit = caps.max_steps + 1
        while not done and n < limit:
            done = harness.step(Action.call(_PROBE_TOOL, {"n": n})).done
            n += 1
        checks["max_steps"] = done and n == caps.max_steps
        if not checks["max_steps"]:
            drift.append(f"claims max_steps={caps.max_steps} but the episode ended after {n} steps (done={done})")
    harness.reset(task)
    return ConformanceReport(passed=not drift, drift=drift, checks=checks)
