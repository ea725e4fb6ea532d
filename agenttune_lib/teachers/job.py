"""One teacher-trajectory job: which teacher runs on which tasks, collected into the warehouse as each episode ends.

The ``teacher_trajectories`` asset's work, without Dagster: settings in, a TeacherRun and its figures out.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agenttune_lib.spine.collect import (
    TeacherConfig,
    TeacherRun,
    collect_teacher,
    expert_no_tool_tasks,
    expert_qa_tasks,
    expert_tau2_tasks,
    qa_teacher_tasks,
    tau2_teacher_tasks,
)
from agenttune_lib.teachers.base import TeacherInfo
from agenttune_lib.warehouse import Provenance

__all__ = ["TEACHERS", "TASK_SOURCES", "TeacherJob", "TeacherPlan", "plan_teacher_job", "run_teacher_job", "teacher_figures"]

TEACHERS = ("expert", "model", "endpoint")
TASK_SOURCES = ("tau2", "qa", "both")


@dataclasses.dataclass(frozen=True)
class TeacherJob:
    """Which teacher (expert, model, endpoint) on which tasks (tau2, qa, both) and how the episodes run."""

    teacher: str = "expert"
    task_source: str = "both"
    tau2_split: str = "train"
    tau2_task_ids: tuple[str, ...] = ()
    n_tasks: int = 8
    tau2_max_actions: int = 2
    qa_split: str = "train"
    n_qa: int = 24
    n_no_tool: int = 12
    no_tool_format: str = "json"
    qa_search_backend: str = "hybrid"
    qa_query_source: str = "context"
    strategy: str = "react"
    max_steps: int = 2
    tool_format: str = "compact"
    include_policy: bool = False
    max_tool_chars: int = 2400
    few_shot: bool = True
    rejection_attempts: int = 3
    success_threshold: float = 1.0
    endpoint_url: str = ""
    endpoint_model: str = ""
    endpoint_api_key_env: str = "OPENAI_API_KEY"

    def __post_init__(self) -> None:
        if self.task_source not in TASK_SOURCES:
            raise ValueError(f"task_source must be 'tau2', 'qa' or 'both', got {self.task_source!r}")
        if self.teacher not in TEACHERS:
            raise ValueError(f"teacher must be one of {TEACHERS}, got {self.teacher!r}")

    @classmethod
    def from_config(cls, config: Any) -> "TeacherJob":
        """The job from any object with these fields (the asset's Dagster config)."""
        values = {f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if hasattr(config, f.name)}
        values["tau2_task_ids"] = tuple(values.get("tau2_task_ids") or ())
        return cls(**values)

    def teacher_config(self) -> TeacherConfig:
        """The episode settings: an expert replays with ReAct, no few-shot and no rejection sampling."""
        expert = self.teacher == "expert"
        return TeacherConfig(
            strategy="react" if expert else self.strategy, max_steps=self.max_steps, tool_format=self.tool_format,
            include_policy=self.include_policy, max_tool_chars=self.max_tool_chars or None,
            few_shot=False if expert else self.few_shot,
            rejection_attempts=self.rejection_attempts if self.teacher == "model" else 0,
            success_threshold=self.success_threshold, keep_rejected=True,
        )


@dataclasses.dataclass
class TeacherPlan:
    """Task sets per kind (tau2, qa, no_tool) with the policy, model version and teacher info that run each."""

    runs: list[tuple[str, list[Any]]]
    policies: dict[str, Any]
    versions: dict[str, str]
    infos: dict[str, TeacherInfo]


def plan_teacher_job(job: TeacherJob, warehouse: Any, artifacts_root: Path, base_model_path: Callable[[], Path],
                     build_model: Callable[[], tuple[Any, str]]) -> TeacherPlan:
    """The tasks and teachers of ``job``: ``base_model_path`` gives the student tokenizer, ``build_model`` the model teacher."""
    from agenttune_lib.rag.workflow import RagPaths
    from agenttune_lib.teachers import EndpointTeacher, NoToolTeacher, QAExpertTeacher, Tau2ExpertTeacher

    expert, tconf = job.teacher == "expert", job.teacher_config()
    student_tok = None
    if expert or job.teacher == "endpoint":
        from transformers import AutoTokenizer

        student_tok = AutoTokenizer.from_pretrained(str(base_model_path()))
    runs: list[tuple[str, list[Any]]] = []
    if job.task_source in ("tau2", "both"):
        if expert:
            tasks = expert_tau2_tasks(job.tau2_split, None, list(job.tau2_task_ids) or None)
            if not job.tau2_task_ids:  # the shortest demonstrations first: they fit the training length
                tasks = sorted(tasks, key=lambda t: (len(t.task.actions), t.task_id))
                tasks = [t for t in tasks if len(t.task.actions) <= job.tau2_max_actions][: job.n_tasks]
            runs.append(("tau2", tasks))
        else:
            runs.append(("tau2", tau2_teacher_tasks(job.tau2_split, job.n_tasks, tconf, list(job.tau2_task_ids) or None)))
    qa_rows: list = []
    search = None
    if job.task_source in ("qa", "both"):
        from agenttune_lib.rag import SearchCorpusTool, load_backend
        from agenttune_lib.rag.splits import load_qa_split

        search = SearchCorpusTool(load_backend(RagPaths.under(artifacts_root).index, job.qa_search_backend))
        qa_rows = load_qa_split(warehouse, job.qa_split)[: job.n_qa]
    if expert:
        policies: dict[str, Any] = {"tau2": Tau2ExpertTeacher(student_tok)}
        if search is not None:
            policies["qa"] = QAExpertTeacher(search, qa_rows, student_tok, query_source=job.qa_query_source)
            runs.append(("qa", expert_qa_tasks(qa_rows, policies["qa"], tconf)))
        if job.n_no_tool > 0 and search is not None:  # built from the corpus and its search tool (task_source qa or both)
            from agenttune_lib.teachers.no_tool import no_tool_items_from_platform

            items = no_tool_items_from_platform(warehouse, RagPaths.under(artifacts_root), search, job.n_no_tool)
            policies["no_tool"] = NoToolTeacher(items, student_tok)
            runs.append(("no_tool", expert_no_tool_tasks(items)))
        return TeacherPlan(runs, policies, {k: f"{v.info.kind}:{v.info.version}" for k, v in policies.items()},
                           {k: v.info for k, v in policies.items()})
    if job.teacher == "endpoint":
        model_fn = EndpointTeacher(job.endpoint_url, job.endpoint_model, student_tok, api_key=os.environ.get(job.endpoint_api_key_env))
        version, info = job.endpoint_model, model_fn.info
    else:
        model_fn, version = build_model()
        info = TeacherInfo("self_rejection", f"{version}|attempts={job.rejection_attempts}|threshold={job.success_threshold}")
    if search is not None:
        runs.append(("qa", qa_teacher_tasks(qa_rows, tconf, tools=[search])))
    return TeacherPlan(runs, {k: model_fn for k, _ in runs}, {k: version for k, _ in runs}, {k: info for k, _ in runs})


def run_teacher_job(job: TeacherJob, plan: TeacherPlan, warehouse: Any, run_id: str, asset_key: str,
                    log: Callable[[str], None] = lambda _: None, warn: Callable[[str], None] = lambda _: None) -> TeacherRun:
    """Every planned task collected; each kept log is appended with its provenance as its episode ends."""
    tconf = job.teacher_config()

    def write(log_, task, kind):
        info = plan.infos[kind]
        prov = Provenance(
            run_id=run_id, asset_key=asset_key, model_version=plan.versions[kind], qa_item_ids=task.qa_item_ids, chunk_ids=task.chunk_ids,
            extra={"task_id": task.task_id, "task_source": task.source, "strategy": tconf.strategy, "teacher": job.teacher},
            teacher_kind=info.kind, teacher_version=info.version,
            adapter_version=getattr(plan.policies[kind], "served_adapter_id", None),  # the deployed adapter a model teacher ran
        )
        warehouse.append_logs([log_], provenance=prov, source="teacher")  # incremental: kept even if a later task fails

    logs, kept, failures = [], [], []
    for kind, tasks in plan.runs:
        kind_conf = dataclasses.replace(tconf, tool_format=job.no_tool_format) if kind == "no_tool" else tconf
        run = collect_teacher(
            plan.policies[kind], tasks, kind_conf, model_name=plan.versions[kind], teacher_info=plan.infos[kind],
            on_log=lambda log_, task, kind=kind: write(log_, task, kind),
            on_error=lambda task, exc: warn(f"task {task.task_id} failed and was skipped: {type(exc).__name__}: {exc}"),
            progress=lambda i, log_, kind=kind: log(f"{kind} task {i + 1}: {len(log_)} events, reward {log_.rewards('episode')}"),
        )
        logs += run.logs
        kept += run.tasks
        failures += run.failures
    return TeacherRun(logs, kept, failures)


def teacher_figures(run: TeacherRun, plan: TeacherPlan) -> dict[str, Any]:
    """The run's summary plus QA evidence figures, the model version(s) and the tokens the teacher generated."""
    evidence = [e for log in run.logs for e in log.metadata.get("evidence") or ()]
    qa_logs = [log for log in run.logs if log.metadata.get("task_source") == "qa"]
    found = sum(e["search"] is not None for e in evidence)
    generator = plan.policies.get("qa") or plan.policies.get("tau2")
    return {
        **run.summary(),
        "qa_gold_hops_retrieved": f"{found}/{len(evidence)}",
        "qa_hop_recall": found / len(evidence) if evidence else 0.0,
        "qa_answer_in_context": f"{sum(bool(log.metadata.get('answer_in_context')) for log in qa_logs)}/{len(qa_logs)}",
        "tiers": ", ".join(sorted({log.tier for log in run.logs})),
        "model_version": ", ".join(sorted(set(plan.versions.values()))),
        "generated_tokens": int(getattr(generator, "generated_tokens", 0)),
    }
