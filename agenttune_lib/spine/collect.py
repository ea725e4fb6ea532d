"""Teacher collection: run a teacher over a task set through the spine and summarize what it did.

Task sources: the τ² retail split (agentic, DB-match reward) or QA items (the RAG stage's
``qa_items`` warehouse table; text answers scored by containment of the gold answer).
Teachers: expert (scripted gold replay, ``agenttune_lib.teachers``), a model over an
endpoint, or the bundled model behind rejection sampling. Collection is incremental: a
task that raises is logged and skipped, and ``on_log`` receives each episode as it ends.
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

__all__ = [
    "evidence_figures",
    "MIN_HOP_RECALL",
    "MIN_ANSWER_IN_CONTEXT",
    "TeacherConfig",
    "TeacherTask",
    "TeacherRun",
    "tau2_teacher_tasks",
    "qa_teacher_tasks",
    "expert_tau2_tasks",
    "expert_qa_tasks",
    "expert_no_tool_tasks",
    "collect_teacher",
    "trajectory_markdown",
    "build_strategy",
    "valid_call_stats",
]

STRATEGIES = ("react", "plan_execute", "reflexion", "tree_of_thoughts")


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    """How the teacher runs: strategy, step budget and prompt-size controls."""

    strategy: str = "react"
    max_steps: int = 3
    tool_format: str = "compact"
    include_policy: bool = False
    max_tool_chars: int | None = 2400
    few_shot: bool = True
    rejection_attempts: int = 0
    success_threshold: float = 1.0
    keep_rejected: bool = False


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
    max_steps: int | None = None
    demonstration: bool = True


@dataclasses.dataclass
class TeacherRun:
    """The logs a teacher produced and their summary."""

    logs: list[EventLog]
    tasks: list[TeacherTask]
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)

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
        valid, attempts = valid_call_stats(self.logs)
        return {
            "n_trajectories": n,
            "n_failed_tasks": len(self.failures),
            "failures": list(self.failures),
            "valid_call_rate": (valid / attempts) if attempts else 0.0,
            "success_rate": (sum(p["success"] for p in per) / n) if n else 0.0,
            "tool_calls": sum(p["tool_calls"] for p in per),
            "tool_errors": sum(p["tool_errors"] for p in per),
            "tool_calls_by_name": dict(sorted(names.items())),
            "per_trajectory": per,
        }


#: Tool-result error types that mean the call itself was malformed (not a real tool's "not found").
INVALID_CALL_ERRORS = frozenset({"parse_error", "unknown_tool", "invalid_arguments", "schema_error"})


def valid_call_stats(logs: Sequence[EventLog]) -> tuple[int, int]:
    """(valid tool calls, call attempts): an attempt is a TOOL_CALL or a malformed call; valid means the harness accepted its name and arguments."""
    valid = attempts = 0
    for log in logs:
        for e in log:
            if e.kind is EventKind.TEXT and e.payload.get("malformed_tool_call"):
                attempts += 1
            elif e.kind is EventKind.TOOL_RESULT:
                err = e.payload.get("error")
                if isinstance(err, dict) and err.get("type") == "parse_error":
                    continue  # counted with its malformed TEXT
                attempts += 1
                valid += not (isinstance(err, dict) and err.get("type") in INVALID_CALL_ERRORS)
    return valid, attempts


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


def expert_tau2_tasks(
    split: str = "train", n_tasks: int | None = None, task_ids: Sequence[str] | None = None, include_non_demonstrations: bool = False
) -> list[TeacherTask]:
    """τ² tasks for the gold-replay expert: a step budget of every gold action plus the closing message.

    Tasks whose gold state equals the initial database are flagged ``demonstration=False``
    and left out unless ``include_non_demonstrations``.
    """
    from agenttune_lib.spine.tau2 import Tau2RetailHarness, load_tau2_tasks
    from agenttune_lib.teachers.tau2 import Tau2ExpertTeacher

    harness = Tau2RetailHarness(max_steps=None, include_policy=False)
    out = []
    for t in load_tau2_tasks(split, ids=list(task_ids) if task_ids else None):
        demo = Tau2ExpertTeacher.is_demonstration(t)
        if not demo and not include_non_demonstrations:
            continue
        out.append(TeacherTask(t, harness, f"tau2:{t.id}", "tau2_retail", max_steps=Tau2ExpertTeacher.steps_needed(t), demonstration=demo))
        if n_tasks is not None and len(out) >= n_tasks:
            break
    return out


def expert_qa_tasks(rows: Sequence[dict[str, Any]], teacher: Any, config: TeacherConfig = TeacherConfig()) -> list[TeacherTask]:
    """QA items for the evidence-chain expert (``QAExpertTeacher``): its own search plan sets each task's step budget."""
    tasks = qa_teacher_tasks(rows, dataclasses.replace(config, max_steps=64), tools=[teacher.search])
    for task in tasks:
        task.max_steps = teacher.steps_needed(task.task["qa_id"])
        task.harness.max_steps = None
    return tasks


def expert_no_tool_tasks(items: Sequence[dict[str, Any]]) -> list[TeacherTask]:
    """No-tool items (``teachers.no_tool.no_tool_items``) as one-turn tasks whose harness offers the item's tools."""
    out = []
    for it in items:
        harness = DictToolHarness(list(it["tools"]), reward_fn=_answer_reward, max_steps=1)
        task = {"prompt": it["prompt"], "answer": it["answer"], "no_tool_kind": it["kind"]}
        out.append(TeacherTask(task, harness, str(it["task_id"]), "no_tool", max_steps=1))
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


def _run_one(model: Callable[[Any], Any], task: TeacherTask, config: TeacherConfig) -> EventLog:
    conf = dataclasses.replace(config, max_steps=task.max_steps) if task.max_steps else config
    strategy = build_strategy(model, conf, task.examples)
    if isinstance(strategy, ReflexionStrategy):
        return run_reflexion(strategy, task.harness, task.task)
    return run_episode(strategy, task.harness, task.task)


def collect_teacher(
    model: Callable[[Any], Any],
    tasks: Sequence[TeacherTask],
    config: TeacherConfig = TeacherConfig(),
    model_name: str | None = None,
    progress: Callable[[int, EventLog], None] | None = None,
    teacher_info: Any = None,
    on_log: Callable[[EventLog, TeacherTask], None] | None = None,
    on_error: Callable[[TeacherTask, BaseException], None] | None = None,
) -> TeacherRun:
    """Run the teacher over every task; each log's metadata names the task, source and teacher.

    A task whose episode raises is recorded in ``failures`` (and passed to ``on_error``) and
    skipped; each finished episode goes to ``on_log`` at once, so what succeeded is kept
    even if a later task fails. With ``config.rejection_attempts`` > 0 (a model teacher such
    as the bundled model), an episode is kept only once its reward reaches
    ``config.success_threshold``; tasks with no accepted attempt are failures.
    """
    if not tasks:
        raise ValueError("collect_teacher needs at least one task")
    info = teacher_info if teacher_info is not None else getattr(model, "info", None)
    logs, kept, failures = [], [], []
    for i, task in enumerate(tasks):
        try:
            if config.rejection_attempts > 0:
                from agenttune_lib.teachers.llm import RejectionSampling

                sampler = RejectionSampling(config.rejection_attempts, config.success_threshold)
                attempts: list[EventLog] = []
                log, used = sampler.run(lambda _attempt: attempts.append(_run_one(model, task, config)) or attempts[-1])
                if log is None and config.keep_rejected and attempts:
                    # recorded as what the teacher did (reward below threshold); distillation drops it
                    log = attempts[-1]
                    log.metadata["rejection_sampling"] = {"accepted": False, "attempts": used, "threshold": config.success_threshold}
                if log is None:
                    raise RuntimeError(f"no attempt of {used} reached reward {config.success_threshold} (rejection sampling)")
            else:
                log = _run_one(model, task, config)
        except Exception as exc:  # one task's failure must not lose the batch
            failures.append({"task_id": task.task_id, "error": f"{type(exc).__name__}: {exc}"})
            if on_error is not None:
                on_error(task, exc)
            continue
        log.metadata.update({"teacher_task_id": task.task_id, "task_source": task.source, "teacher": model_name})
        if info is not None:
            log.metadata.update({"teacher_kind": info.kind, "teacher_version": info.version})
        if not task.demonstration:
            log.metadata["non_demonstration"] = True
        if task.qa_item_ids:
            log.metadata["qa_item_ids"] = list(task.qa_item_ids)
        if isinstance(task.task, dict) and task.task.get("answer") is not None:
            log.metadata.setdefault("answer", task.task["answer"])
        if isinstance(task.task, dict) and task.task.get("no_tool_kind"):
            log.metadata["no_tool_kind"] = str(task.task["no_tool_kind"])
        evidence = getattr(model, "evidence", None)
        if callable(evidence) and task.source == "qa":
            log.metadata["evidence"] = evidence(log, task.task)
            texts = [e.payload.get("content") for e in log.events if e.kind is EventKind.TEXT]
            # the expert answers only from what its searches showed (QAExpertTeacher.next_text)
            log.metadata["answer_in_context"] = bool(texts) and str(texts[-1]).strip() == str(log.metadata.get("answer", "")).strip()
        logs.append(log)
        kept.append(task)
        if on_log is not None:
            on_log(log, task)
        if progress is not None:
            progress(i, log)
    return TeacherRun(logs, kept, failures)


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


#: Floors for expert QA demonstrations: a walk must reach its gold chunks and show the answer it gives. Walks whose
#: queries a student can imitate (context-only, the default) reached 0.78 / 0.62 on the bundled corpus's train split
#: (bench/RESULTS.md); the floors catch a broken expert, and a walk short of its evidence says "not found" and is not taught.
MIN_HOP_RECALL = 0.6
MIN_ANSWER_IN_CONTEXT = 0.4


def evidence_figures(logs: Sequence[EventLog], min_hop_recall: float = MIN_HOP_RECALL,
                     min_answer_in_context: float = MIN_ANSWER_IN_CONTEXT) -> dict[str, Any]:
    """Gold-hop recall and answer-in-context over the expert QA episodes in ``logs``, and what falls short of the floors."""
    qa = [log for log in logs if "evidence" in log.metadata]
    hops = [e for log in qa for e in log.metadata.get("evidence") or ()]
    found = sum(e.get("search") is not None for e in hops)
    in_ctx = sum(bool(log.metadata.get("answer_in_context")) for log in qa)
    recall = found / len(hops) if hops else 0.0
    rate = in_ctx / len(qa) if qa else 0.0
    problems = []
    if qa and recall < min_hop_recall:
        problems.append(f"gold-hop recall {found}/{len(hops)} = {recall:.2f} is below {min_hop_recall:.2f}")
    if qa and rate < min_answer_in_context:
        problems.append(f"answer in context {in_ctx}/{len(qa)} = {rate:.2f} is below {min_answer_in_context:.2f}")
    problems += [f"episode {log.id} succeeded without the answer in its context" for log in qa
                 if episode_succeeded(log) and not log.metadata.get("answer_in_context")]
    return {"qa_episodes": len(qa), "gold_hops": len(hops), "gold_hops_retrieved": found, "hop_recall": recall,
            "answer_in_context": in_ctx, "answer_in_context_rate": rate, "min_hop_recall": min_hop_recall,
            "min_answer_in_context": min_answer_in_context, "problems": problems}
