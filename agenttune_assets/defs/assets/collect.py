"""[collect] teacher_trajectories: the spine runs a teacher over a task set and writes full-tier EventLogs to the warehouse as each episode ends."""

import dataclasses

import dagster as dg

from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, ServingResource, TeacherModelResource, WarehouseResource
from agenttune_lib.spine.collect import (
    TeacherConfig,
    TeacherRun,
    collect_teacher,
    expert_no_tool_tasks,
    expert_qa_tasks,
    expert_tau2_tasks,
    qa_teacher_tasks,
    tau2_teacher_tasks,
    trajectory_markdown,
)
from agenttune_lib.warehouse import Provenance


class TeacherTrajectoriesConfig(dg.Config):
    """Which teacher runs on which tasks. Default: the expert teacher (gold τ² replays, QA evidence-chain walks).

    ``teacher``: ``expert`` (scripted from ground truth through the real harnesses; every episode
    reaches the gold state/answer), ``model`` (the teacher resource's checkpoint, by default the
    bundled SmolLM2, kept only behind rejection sampling: up to ``rejection_attempts`` tries per task,
    sampled at the resource's temperature) or ``endpoint`` (a larger model over an OpenAI-compatible
    ``endpoint_url`` / ``endpoint_model``). ``task_source``: ``tau2`` (retail train split), ``qa`` (the
    ``qa_items`` train split) or ``both``. Sizes keep the default training within its time budget on 2
    cores (see README: what the default run learns).
    """

    teacher: str = "expert"
    task_source: str = "both"
    tau2_split: str = "train"
    tau2_task_ids: list[str] = []
    n_tasks: int = 8
    tau2_max_actions: int = 2
    qa_split: str = "train"
    n_qa: int = 24
    n_no_tool: int = 12  # expert only: prompts no offered tool fits (or that need none), answered in plain text
    no_tool_format: str = "json"  # how their tools are listed: json (as BFCL's platform arm shows them) or compact
    qa_search_backend: str = "hybrid"
    strategy: str = "react"
    max_steps: int = 2
    tool_format: str = "compact"
    include_policy: bool = False
    max_tool_chars: int = 1200
    few_shot: bool = True
    rejection_attempts: int = 3
    success_threshold: float = 1.0
    endpoint_url: str = ""
    endpoint_model: str = ""
    endpoint_api_key_env: str = "OPENAI_API_KEY"


TEACHERS = ("expert", "model", "endpoint")


@dg.asset(group_name="collect", deps=["base_model", "qa_splits"], pool="warehouse", kinds={"pytorch", "duckdb"})
def teacher_trajectories(
    context: dg.AssetExecutionContext,
    config: TeacherTrajectoriesConfig,
    warehouse: WarehouseResource,
    models: ModelsResource,
    teacher: TeacherModelResource,
    artifacts: ArtifactsResource,
    serving: ServingResource,
) -> dg.MaterializeResult:
    """Teacher EventLogs with provenance (run, asset, teacher kind/version, QA item and chunk ids), written as each episode ends."""
    import os

    from agenttune_lib.rag.workflow import RagPaths
    from agenttune_lib.teachers import EndpointTeacher, NoToolTeacher, QAExpertTeacher, Tau2ExpertTeacher, TeacherInfo

    if config.task_source not in ("tau2", "qa", "both"):
        raise ValueError(f"task_source must be 'tau2', 'qa' or 'both', got {config.task_source!r}")
    if config.teacher not in TEACHERS:
        raise ValueError(f"teacher must be one of {TEACHERS}, got {config.teacher!r}")
    expert = config.teacher == "expert"
    tconf = TeacherConfig(
        strategy="react" if expert else config.strategy,
        max_steps=config.max_steps,
        tool_format=config.tool_format,
        include_policy=config.include_policy,
        max_tool_chars=config.max_tool_chars or None,
        few_shot=False if expert else config.few_shot,
        rejection_attempts=config.rejection_attempts if config.teacher == "model" else 0,
        success_threshold=config.success_threshold,
        keep_rejected=True,
    )
    wh = warehouse.get()
    student_tok = None
    if expert or config.teacher == "endpoint":
        from transformers import AutoTokenizer

        from agenttune_lib.models.base import ensure_base_model

        student_tok = AutoTokenizer.from_pretrained(str(ensure_base_model(models.get()).path))
    runs = []  # (policy, tasks, model version, teacher info)
    if config.task_source in ("tau2", "both"):
        if expert:
            tau2_tasks = expert_tau2_tasks(config.tau2_split, None, config.tau2_task_ids or None)
            if not config.tau2_task_ids:  # the shortest demonstrations first: they fit the training length
                tau2_tasks = sorted(tau2_tasks, key=lambda t: (len(t.task.actions), t.task_id))
                tau2_tasks = [t for t in tau2_tasks if len(t.task.actions) <= config.tau2_max_actions][: config.n_tasks]
            runs.append(("tau2", tau2_tasks))
        else:
            runs.append(("tau2", tau2_teacher_tasks(config.tau2_split, config.n_tasks, tconf, config.tau2_task_ids or None)))
    qa_rows: list = []
    search = None
    if config.task_source in ("qa", "both"):
        from agenttune_lib.rag import SearchCorpusTool, load_backend
        from agenttune_lib.rag.splits import load_qa_split

        search = SearchCorpusTool(load_backend(RagPaths.under(artifacts.get()).index, config.qa_search_backend))
        qa_rows = load_qa_split(wh, config.qa_split)[: config.n_qa]
    if config.teacher == "expert":
        policies = {"tau2": Tau2ExpertTeacher(student_tok)}
        if search is not None:
            policies["qa"] = QAExpertTeacher(search, qa_rows, student_tok)
            runs.append(("qa", expert_qa_tasks(qa_rows, policies["qa"], tconf)))
        if config.n_no_tool > 0:
            from agenttune_lib.teachers.no_tool import no_tool_items_from_platform

            items = no_tool_items_from_platform(wh, RagPaths.under(artifacts.get()), search, config.n_no_tool)
            policies["no_tool"] = NoToolTeacher(items, student_tok)
            runs.append(("no_tool", expert_no_tool_tasks(items)))
        versions = {k: f"{v.info.kind}:{v.info.version}" for k, v in policies.items()}
        infos = {k: v.info for k, v in policies.items()}
    else:
        if config.teacher == "endpoint":
            model_fn = EndpointTeacher(config.endpoint_url, config.endpoint_model, student_tok, api_key=os.environ.get(config.endpoint_api_key_env))
            version, info = config.endpoint_model, model_fn.info
        else:
            model_fn, version = teacher.build(models.get(), serving)  # a checkpoint, else the deployed model
            info = TeacherInfo("self_rejection", f"{version}|attempts={config.rejection_attempts}|threshold={config.success_threshold}")
        if search is not None:
            runs.append(("qa", qa_teacher_tasks(qa_rows, tconf, tools=[search])))
        policies = {k: model_fn for k, _ in runs}
        versions = {k: version for k, _ in runs}
        infos = {k: info for k, _ in runs}
    asset_key = context.asset_key.to_user_string()
    tasks_all = [t for _, ts in runs for t in ts]
    if not tasks_all:
        raise dg.Failure(f"teacher_trajectories: no tasks selected (task_source={config.task_source!r}, n_tasks={config.n_tasks}, n_qa={config.n_qa})")
    context.log.info(f"teacher {config.teacher}: {len(tasks_all)} tasks ({', '.join(f'{k}: {len(ts)}' for k, ts in runs)})")

    def write(log, task, kind):
        info = infos[kind]
        prov = Provenance(
            run_id=context.run_id, asset_key=asset_key, model_version=versions[kind], qa_item_ids=task.qa_item_ids, chunk_ids=task.chunk_ids,
            extra={"task_id": task.task_id, "task_source": task.source, "strategy": tconf.strategy, "teacher": config.teacher},
            teacher_kind=info.kind, teacher_version=info.version,
            adapter_version=getattr(policies[kind], "served_adapter_id", None),  # the deployed adapter a model teacher ran
        )
        wh.append_logs([log], provenance=prov, source="teacher")  # incremental: kept even if a later task fails

    logs, kept, failures = [], [], []
    for kind, tasks in runs:
        kind_conf = dataclasses.replace(tconf, tool_format=config.no_tool_format) if kind == "no_tool" else tconf
        run = collect_teacher(
            policies[kind], tasks, kind_conf, model_name=versions[kind], teacher_info=infos[kind],
            on_log=lambda log, task, kind=kind: write(log, task, kind),
            on_error=lambda task, exc: context.log.warning(f"task {task.task_id} failed and was skipped: {type(exc).__name__}: {exc}"),
            progress=lambda i, log, kind=kind: context.log.info(f"{kind} task {i + 1}: {len(log)} events, reward {log.rewards('episode')}"),
        )
        logs += run.logs
        kept += run.tasks
        failures += run.failures
    if not logs:
        raise dg.Failure(f"teacher_trajectories: every task failed ({failures[:5]})")
    run = TeacherRun(logs, kept, failures)
    version = ", ".join(sorted(set(versions.values())))
    generator = policies.get("qa") or policies.get("tau2")
    summary = run.summary()
    per = summary["per_trajectory"]
    evidence = [e for log in run.logs for e in log.metadata.get("evidence") or ()]
    qa_logs = [log for log in run.logs if log.metadata.get("task_source") == "qa"]
    columns = [("trajectory_id", "string"), ("task_id", "string"), ("tool_calls", "int"), ("tool_errors", "int"), ("reward", "float"), ("success", "bool")]
    return dg.MaterializeResult(
        metadata={
            "n_trajectories": dg.MetadataValue.int(summary["n_trajectories"]),
            "success_rate": dg.MetadataValue.float(float(summary["success_rate"])),
            "valid_call_rate": dg.MetadataValue.float(float(summary["valid_call_rate"])),
            "failed_tasks": dg.MetadataValue.int(summary["n_failed_tasks"]),
            "failures": dg.MetadataValue.json(summary["failures"][:20]),
            "teacher": config.teacher,
            "served_adapter_id": ", ".join(sorted({str(getattr(p, "served_adapter_id", "")) for p in policies.values()} - {""})) or "-",
            "qa_gold_hops_retrieved": f"{sum(e['search'] is not None for e in evidence)}/{len(evidence)}",
            "qa_hop_recall": dg.MetadataValue.float(sum(e["search"] is not None for e in evidence) / len(evidence) if evidence else 0.0),
            "qa_answer_in_context": f"{sum(bool(log.metadata.get('answer_in_context')) for log in qa_logs)}/{len(qa_logs)}",
            "tool_calls": dg.MetadataValue.int(summary["tool_calls"]),
            "tool_errors": dg.MetadataValue.int(summary["tool_errors"]),
            "tool_calls_by_name": dg.MetadataValue.json(summary["tool_calls_by_name"]),
            "tiers": ", ".join(sorted({log.tier for log in run.logs})),
            "model_version": version,
            "generated_tokens": dg.MetadataValue.int(int(getattr(generator, "generated_tokens", 0))),
            "per_trajectory": dg.MetadataValue.table(
                [dg.TableRecord({c: p[c] for c, _ in columns}) for p in per],
                schema=dg.TableSchema(columns=[dg.TableColumn(c, t) for c, t in columns]),
            ),
            "example_trajectory": dg.MetadataValue.md(trajectory_markdown(run.logs[0])),
        }
    )
