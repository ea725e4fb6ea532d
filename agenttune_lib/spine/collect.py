"""Teacher collection: run a teacher model over a task set through the spine and summarize what it did.

Task sources: the τ² retail split (agentic, DB-match reward) or QA items (the RAG stage's
``qa_items`` warehouse table; text answers scored by containment of the gold answer).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.events import EventKind, EventLog
from agenttune_lib.spine.episode import episode_succeeded, run_episode, run_reflexion
from agenttune_lib.spine.harness import DictToolHarness, Harness
from agenttune_lib.spine.strategies import (
    AgentStrategy,
    PlanExecuteStrategy,
    ReActStrategy,
    ReflexionStrategy,
    TreeOfThoughtsStrategy,
)

__all__ = ["TeacherConfig", "TeacherTask", "TeacherRun", "tau2_teacher_tasks", "qa_teacher_tasks", "collect_teacher", "trajectory_markdown", "build_strategy"]

STRATEGIES = ("react", "plan_execute", "reflexion", "tree_of_thoughts")


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    """How the teacher runs: strategy, step budget and prompt-size controls."""

    strategy: str = "react"
    max_steps: int = 3
    tool_format: str = "compact"
    include_policy: bool = False
    max_tool_chars: int | None = 1200
    few_shot: bool = True


@dataclasses.dataclass
class TeacherTask:
    """One task for the teacher: the harness that runs it and the ids lineage should record."""

    task: Any
    harness: Harness
    task_id: str
    source: str
    qa_item_ids: tuple[str, ...] = ()
    chunk_ids: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()


@dataclasses.dataclass
class TeacherRun:
    """The logs a teacher produced and their summary."""

    logs: list[EventLog]
    tasks: list[TeacherTask]

    def summary(self) -> dict[str, Any]:
        per = []
        for log, task in zip(self.logs, self.tasks):
            calls = log.filter(EventKind.TOOL_CALL)
            rewards = log.rewards("episode")
            per.append(
                {
                    "trajectory_id": log.id,
                    "task_id": task.task_id,
                    "source": task.source,
                    "tool_calls": len(calls),
                    "tool_errors": sum(1 for e in log if e.is_error),
                    "reward": rewards[-1] if rewards else None,
                    "success": episode_succeeded(log),
                    "n_events": len(log),
                }
            )
        n = len(per)
        names: dict[str, int] = {}
        for log in self.logs:
            for e in log.filter(EventKind.TOOL_CALL):
                names[str(e.payload.get("name"))] = names.get(str(e.payload.get("name")), 0) + 1
        return {
            "n_trajectories": n,
            "success_rate": (sum(p["success"] for p in per) / n) if n else 0.0,
            "tool_calls": sum(p["tool_calls"] for p in per),
            "tool_errors": sum(p["tool_errors"] for p in per),
            "tool_calls_by_name": dict(sorted(names.items())),
            "per_trajectory": per,
        }


def tau2_teacher_tasks(split: str = "train", n_tasks: int | None = 3, config: TeacherConfig = TeacherConfig(), task_ids: Sequence[str] | None = None) -> list[TeacherTask]:
    """The first ``n_tasks`` τ² retail tasks of ``split`` (or the given ids), one harness shared across them."""
    from agenttune_lib.spine.tau2 import TAU2_EXAMPLE, Tau2RetailHarness, load_tau2_tasks

    harness = Tau2RetailHarness(max_steps=config.max_steps, include_policy=config.include_policy)
    tasks = load_tau2_tasks(split, limit=None if task_ids else n_tasks, ids=list(task_ids) if task_ids else None)
    examples = (TAU2_EXAMPLE,) if config.few_shot else ()
    return [TeacherTask(t, harness, f"tau2:{t.id}", "tau2_retail", examples=examples) for t in tasks]


def _answer_reward(text: str, task: Any) -> float | None:
    answer = task.get("answer") if isinstance(task, dict) else None
    if not answer:
        return None
    return 1.0 if str(answer).strip().lower() in text.lower() else 0.0


def qa_teacher_tasks(rows: Sequence[dict[str, Any]], config: TeacherConfig = TeacherConfig(), tools: Any = None) -> list[TeacherTask]:
    """QA items (``qa_id``, ``question``, ``answer``, ``gold_chunk_ids``) as teacher tasks; ``tools`` (e.g. a corpus search tool) optional."""
    out = []
    for row in rows:
        for key in ("qa_id", "question", "answer"):
            if not row.get(key):
                raise ValueError(f"QA item {row.get('qa_id', '?')!r} has no {key!r}")
        harness = DictToolHarness(tools or {}, reward_fn=_answer_reward, max_steps=config.max_steps if tools else 1)
        task = {"prompt": row["question"], "answer": row["answer"], "qa_id": row["qa_id"]}
        gold = row.get("gold_chunk_ids") or ()
        out.append(TeacherTask(task, harness, f"qa:{row['qa_id']}", "qa", (str(row["qa_id"]),), tuple(str(c) for c in gold)))
    return out


def build_strategy(model: Callable[[Any], Any], config: TeacherConfig, examples: Sequence[str] = ()) -> AgentStrategy:
    """The configured strategy over ``model``; ``examples`` are demonstrations appended to its system prompt."""
    common = dict(
        max_steps=config.max_steps, tool_format=config.tool_format, max_tool_chars=config.max_tool_chars, extra_instructions=tuple(examples)
    )
    if config.strategy == "react":
        return ReActStrategy(model, **common)
    if config.strategy == "plan_execute":
        return PlanExecuteStrategy(model, **common)
    if config.strategy == "reflexion":
        return ReflexionStrategy(model, max_attempts=2, **common)
    if config.strategy == "tree_of_thoughts":
        return TreeOfThoughtsStrategy(model, n_candidates=2, **common)
    raise ValueError(f"unknown teacher strategy {config.strategy!r}; expected one of {STRATEGIES}")


def collect_teacher(
    model: Callable[[Any], Any],
    tasks: Sequence[TeacherTask],
    config: TeacherConfig = TeacherConfig(),
    model_name: str | None = None,
    progress: Callable[[int, EventLog], None] | None = None,
) -> TeacherRun:
    """Run the teacher over every task; each log's metadata names the task, source and teacher."""
    if not tasks:
        raise ValueError("collect_teacher needs at least one task")
    logs = []
    for i, task in enumerate(tasks):
        strategy = build_strategy(model, config, task.examples)
        if isinstance(strategy, ReflexionStrategy):
            log = run_reflexion(strategy, task.harness, task.task)
        else:
            log = run_episode(strategy, task.harness, task.task)
        log.metadata.update({"teacher_task_id": task.task_id, "task_source": task.source, "teacher": model_name})
        if task.qa_item_ids:
            log.metadata["qa_item_ids"] = list(task.qa_item_ids)
        logs.append(log)
        if progress is not None:
            progress(i, log)
    return TeacherRun(logs, list(tasks))


def trajectory_markdown(log: EventLog, max_chars: int = 400) -> str:
    """A readable rendering of one trajectory for asset metadata."""
    lines = [f"**trajectory** `{log.id}` ({log.tier} tier, {len(log)} events)", ""]
    for i, e in enumerate(log):
        payload = e.payload
        if e.kind is EventKind.TOOL_CALL:
            body = f"`{payload.get('name')}` {json.dumps(payload.get('arguments'), sort_keys=True)}"
        elif e.kind is EventKind.REWARD:
            body = f"{payload.get('value')} ({e.scope})"
        elif e.kind is EventKind.TOOL_RESULT and e.is_error:
            body = f"ERROR {json.dumps(payload.get('error'), sort_keys=True)}"
        else:
            content = payload.get("content", payload)
            body = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
        body = body.replace("\n", " ")
        if len(body) > max_chars:
            body = body[:max_chars] + "…"
        lines.append(f"{i}. **{e.kind.value}**: {body}")
    return "\n".join(lines)
