"""The episode drivers: ``run_episode`` for every strategy, ``run_reflexion`` for retry-with-critique."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agenttune_lib.events import EventKind, EventLog
from agenttune_lib.spine.harness import Harness
from agenttune_lib.spine.record import link_branches
from agenttune_lib.spine.strategies import AgentStrategy, ReflexionStrategy

__all__ = ["run_episode", "run_reflexion", "episode_succeeded"]


def run_episode(strategy: AgentStrategy, harness: Harness, task: Any) -> EventLog:
    """init, then propose → harness.step → observe until is_done; returns the harness's EventLog."""
    harness.reset(task)
    state = strategy.init(task, harness.action_space(), getattr(harness, "instructions", None))
    for event in state.drain():
        harness.record(event)
    state.events = harness.events
    while not strategy.is_done(state) and not harness.done:
        action = strategy.propose(state)
        result = harness.step(action)
        strategy.observe(state, result)
        for event in state.drain():
            harness.record(event)
        state.events = harness.events
    if not harness.done:
        harness.finalize(truncated=True)
    return link_branches(harness.to_eventlog(metadata=strategy.log_metadata(state)))


def episode_succeeded(log: EventLog, threshold: float = 1.0) -> bool:
    """Success: the episode reward reaches ``threshold``; without one, a final answer and no tool errors."""
    rewards = log.rewards("episode")
    if rewards:
        return rewards[-1] >= threshold
    has_answer = any(e.kind is EventKind.TEXT and not e.payload.get("malformed_tool_call") for e in log)
    return has_answer and not any(e.is_error for e in log)


def run_reflexion(
    strategy: ReflexionStrategy,
    harness: Harness,
    task: Any,
    max_attempts: int | None = None,
    success_fn: Callable[[EventLog], bool] | None = None,
) -> EventLog:
    """Retry up to ``max_attempts``, reflecting after each failure; failed attempts stay attached to the log."""
    if not isinstance(strategy, ReflexionStrategy):
        raise TypeError(f"run_reflexion needs a ReflexionStrategy, got {type(strategy).__name__}")
    attempts = max_attempts or strategy.max_attempts
    succeeded = success_fn or episode_succeeded
    strategy.reflections = []
    failed: list[EventLog] = []
    critique_turns: list[dict[str, Any]] = []
    log = run_episode(strategy, harness, task)
    for _ in range(attempts - 1):
        if succeeded(log):
            break
        strategy.reflect(log)
        critique_turns.append(strategy.last_critique_turn)
        # The failed attempt is a rejected branch of the task: its own log, generated in its own context.
        log.metadata["branch"] = {"kind": "reflexion", "reason": "failed_attempt", "attempt": len(failed) + 1, "prefix_len": 1}
        failed.append(log)
        log = run_episode(strategy, harness, task)
    ok = succeeded(log)
    log.metadata["reflexion"] = {
        "attempts": len(failed) + 1,
        "succeeded": ok,
        "critiques": list(strategy.reflections),
        "critique_turns": critique_turns,
    }
    log.metadata["rejected_attempts"] = [f.to_dict() for f in failed]
    return link_branches(log)
