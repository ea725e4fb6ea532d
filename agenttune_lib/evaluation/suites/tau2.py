"""τ² retail test suite: database-state success, action-level recall, communicate_info checks, and a do-nothing baseline.

Tasks whose gold database state equals the initial one ("Sorry, I cannot help" would score 1.0)
are flagged, reported separately and ``excluded`` from success aggregates and comparisons. Each
task's step limit is its gold action count plus ``step_slack`` (never a limit at which the task
is unsolvable by construction). Episodes run in lockstep, one harness per task.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agenttune_lib.evaluation.lockstep import run_lockstep
from agenttune_lib.evaluation.schemas import coerce_arguments
from agenttune_lib.evaluation.suites.common import SuiteResult, config_hash, decoding_of, policy_stats

__all__ = ["Tau2SuiteConfig", "run_tau2_suite", "is_noop_task", "action_recall", "communicate_info_score", "select_tau2_tasks", "DO_NOTHING_REPLY"]

DO_NOTHING_REPLY = "Sorry, I cannot help with that."


@dataclasses.dataclass(frozen=True)
class Tau2SuiteConfig:
    """Which tasks, the step budget (gold action count + slack, or a fixed ``max_steps`` that must cover every task) and prompt settings."""

    split: str = "test"
    task_ids: tuple[str, ...] = ()
    limit: int | None = None
    step_slack: int = 2
    max_steps: int | None = None
    tool_format: str = "compact"
    include_policy: bool = False
    max_tool_chars: int | None = 1200
    few_shot: bool = True

    def __post_init__(self) -> None:
        if self.step_slack < 1:
            raise ValueError(f"step_slack must be >= 1 (the final answer takes a step), got {self.step_slack}")
        object.__setattr__(self, "task_ids", tuple(str(t) for t in self.task_ids))


@functools.lru_cache(maxsize=512)
def _noop(task_id: str) -> bool:
    from agenttune_lib.spine import tau2 as spine_tau2

    task = spine_tau2.load_tau2_tasks("all", ids=[task_id])[0]
    return spine_tau2.db_hash(spine_tau2.replay_actions(task.actions)) == spine_tau2.db_hash(spine_tau2.fresh_db())


def is_noop_task(task: Any) -> bool:
    """Whether the task's gold database state equals the initial one (any do-nothing reply 'succeeds')."""
    return _noop(str(getattr(task, "id", task)))


def select_tau2_tasks(split: str = "test", n: int | None = None, max_actions: int | None = None) -> list[Any]:
    """Tasks of ``split`` that are not fixed by construction, fewest gold actions (then shortest gold call) first, for a time-boxed subset."""
    from agenttune_lib.spine import tau2 as spine_tau2

    tasks = [t for t in spine_tau2.load_tau2_tasks(split) if not is_noop_task(t)]
    if max_actions is not None:
        tasks = [t for t in tasks if len(t.actions) <= max_actions]
    # Fewest actions first, then the shortest longest gold call: the turn budget is sized to fit that call.
    tasks.sort(key=lambda t: (len(t.actions), max((len(json.dumps(a.get("arguments") or {})) for a in t.actions), default=0), t.id))
    return tasks[:n] if n is not None else tasks


def _canon_args(args: Any) -> str:
    return json.dumps(coerce_arguments(args) or {}, sort_keys=True, default=str)


def action_recall(gold: Sequence[Mapping[str, Any]], calls: Sequence[Mapping[str, Any]]) -> float | None:
    """Share of gold actions the agent made with the same name and arguments (multiset match); None for no gold actions."""
    if not gold:
        return None
    pool = [(str(c.get("name")), _canon_args(c.get("arguments"))) for c in calls]
    hit = 0
    for g in gold:
        key = (str(g.get("name")), _canon_args(g.get("arguments")))
        if key in pool:
            pool.remove(key)
            hit += 1
    return hit / len(gold)


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower().replace(",", "")).strip()


def communicate_info_score(infos: Sequence[str], agent_text: str) -> float | None:
    """Share of the task's ``communicate_info`` strings found in the agent's messages (τ²'s deterministic check:
    case-insensitive substring, thousands separators ignored); None when the task has none."""
    if not infos:
        return None
    body = _norm(agent_text)
    return sum(1 for info in infos if _norm(str(info)) in body) / len(infos)


def _trajectory(log: Any, evaluator: Any) -> dict[str, Any]:
    """Table 7's TAC and LCF for one episode (None when undefined, e.g. TAC with no calls)."""
    if evaluator is None:
        return {}
    m = evaluator.evaluate(log)
    return {"TAC": m.get("TAC"), "LCF": m.get("LCF")}


def _score(task: Any, log: Any, db_ok: bool, evaluator: Any = None) -> dict[str, Any]:
    from agenttune_lib.events import EventKind

    calls = [{"name": e.payload.get("name"), "arguments": e.payload.get("arguments")} for e in log if e.kind is EventKind.TOOL_CALL]
    texts = [str(e.payload.get("content", "")) for e in log if e.kind in (EventKind.TEXT, EventKind.REASONING)]
    final = next((str(e.payload.get("content", "")) for e in reversed(list(log)) if e.kind is EventKind.TEXT and not e.payload.get("malformed_tool_call")), "")
    errors = [e for e in log if e.is_error]
    noop = is_noop_task(task)
    recall = action_recall(task.actions, calls)
    info = communicate_info_score(task.communicate_info, "\n".join(texts))
    if db_ok:
        error_type = ""
    elif not calls:
        error_type = "no_tool_call"
    elif errors:
        error_type = str((errors[-1].payload.get("error") or {}).get("type", "tool_error"))
    else:
        error_type = "wrong_db_state"
    return {
        "item_id": str(task.id), "category": "noop_gold" if noop else f"actions={len(task.actions)}", "output": final,
        "score": float(db_ok), "success": db_ok, "excluded": noop, "error_type": error_type,
        "metrics": {"db_match": float(db_ok), "action_recall": recall, "communicate_info": info, "flagged_noop": noop,
                    "n_gold_actions": len(task.actions), "tool_calls": len(calls), "tool_errors": len(errors), "trajectory_id": log.id,
                    **_trajectory(log, evaluator)},
    }


def _token_budget(policy: Any, tasks: Sequence[Any]) -> int | None:
    """New tokens per turn that fit the longest gold call of these tasks (1.25x + 16), at least the policy's own; None for scripted policies.

    A budget under the gold call's length would fix the task's score at 0 by construction.
    """
    tok = getattr(policy, "tokenizer", None)
    if tok is None or not hasattr(policy, "max_new_tokens"):
        return None
    from agenttune_lib.events import render_tool_call

    longest = max((len(tok(render_tool_call({"name": a["name"], "arguments": a.get("arguments") or {}}), add_special_tokens=False)["input_ids"])
                   for t in tasks for a in t.actions), default=0)
    return max(int(policy.max_new_tokens), int(longest * 1.25) + 16)


def _do_nothing(messages: Any) -> str:
    return DO_NOTHING_REPLY


def run_tau2_suite(
    policy: Any, tasks: Sequence[Any] | None = None, config: Tau2SuiteConfig | None = None, decoding: Mapping[str, Any] | None = None
) -> SuiteResult:
    """Run the τ² tasks (given, or chosen by ``config``) with ``policy``; rows per task, plus the do-nothing baseline's rows.

    The do-nothing baseline (a reply that calls no tool) is scored by the same harness on the same
    tasks beside every run, in ``SuiteResult.baseline_rows``.
    """
    from agenttune_lib.spine import tau2 as spine_tau2
    from agenttune_lib.spine.episode import run_episode
    from agenttune_lib.evaluation.trajectory import TrajectoryEvaluator
    from agenttune_lib.spine.strategies import ReActStrategy

    config = config or Tau2SuiteConfig()
    evaluator = TrajectoryEvaluator(list(spine_tau2.tau2_tool_schemas()))
    if tasks is None:
        tasks = spine_tau2.load_tau2_tasks(config.split, ids=list(config.task_ids) or None)
        tasks = tasks[: config.limit] if config.limit is not None else tasks
    tasks = list(tasks)
    if not tasks:
        raise ValueError(f"τ² suite selects no tasks (split={config.split!r}, task_ids={list(config.task_ids)}, limit={config.limit})")
    if config.max_steps is not None:
        short = [t.id for t in tasks if config.max_steps < len(t.actions) + 1]
        if short:
            raise ValueError(f"max_steps={config.max_steps} cannot fit the gold actions plus a final answer of τ² tasks {short}: "
                             "their score would be fixed by construction; raise max_steps or use step_slack")
    examples = (spine_tau2.TAU2_EXAMPLE,) if config.few_shot else ()
    budget = _token_budget(policy, tasks)

    def steps(task: Any) -> int:
        return config.max_steps if config.max_steps is not None else len(task.actions) + config.step_slack

    def episode(task: Any, model: Any) -> tuple[Any, bool]:
        harness = spine_tau2.Tau2RetailHarness(max_steps=steps(task), include_policy=config.include_policy)
        strategy = ReActStrategy(model, max_steps=steps(task), tool_format=config.tool_format, max_tool_chars=config.max_tool_chars,
                                 extra_instructions=examples)
        log = run_episode(strategy, harness, task)
        return log, bool(harness.db_matches())

    start = time.perf_counter()
    saved = getattr(policy, "max_new_tokens", None)
    if budget is not None:
        policy.max_new_tokens = budget
    try:
        results, turns = run_lockstep(tasks, episode, policy, tools=list(spine_tau2.tau2_tool_schemas()))
    finally:
        if budget is not None:
            policy.max_new_tokens = saved
    rows, logs = [], []
    for task, res in zip(tasks, results):
        if isinstance(res, Exception):
            rows.append({"item_id": str(task.id), "category": "noop_gold" if is_noop_task(task) else f"actions={len(task.actions)}", "output": "",
                         "score": 0.0, "success": False, "excluded": is_noop_task(task), "error_type": f"crash:{type(res).__name__}",
                         "metrics": {"error": str(res)[:300]}})
            continue
        log, ok = res
        rows.append(_score(task, log, ok, evaluator))
        logs.append(log)
    baseline = []
    for task in tasks:
        log, ok = episode(task, _do_nothing)
        baseline.append(_score(task, log, ok))
    # The turn budget follows from max_new_tokens, the tokenizer and the tasks, so it is recorded, not hashed.
    extra = {"decoding": decoding_of(policy, decoding),
             "steps": {str(t.id): steps(t) for t in tasks}}
    record = {**dataclasses.asdict(config), **extra, "max_new_tokens_used": budget, "n_tasks": len(tasks), "n_flagged_noop": sum(is_noop_task(t) for t in tasks),
              "policy": policy_stats(policy)}
    return SuiteResult("tau2", rows, record, config_hash("tau2", config, [t.id for t in tasks], extra), time.perf_counter() - start,
                       turns, baseline_rows=baseline, logs=logs)
