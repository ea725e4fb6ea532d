"""[collect] teacher_trajectories: the spine runs the teacher over a task set and writes full-tier EventLogs to the warehouse."""

import dagster as dg

from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, TeacherModelResource, WarehouseResource
from agenttune_lib.spine.collect import TeacherConfig, collect_teacher, qa_teacher_tasks, tau2_teacher_tasks, trajectory_markdown
from agenttune_lib.warehouse import Provenance


class TeacherTrajectoriesConfig(dg.Config):
    """Small τ² retail and synthesized-QA subsets by default, so the whole graph stays quick on 2 CPU cores.

    ``task_source``: ``tau2`` (retail split), ``qa`` (the ``qa_items`` table of the qa_splits
    asset) or ``both``.
    """

    task_source: str = "both"
    tau2_split: str = "train"
    tau2_task_ids: list[str] = []
    n_tasks: int = 2
    qa_split: str = "train"
    n_qa: int = 2
    qa_search_backend: str = "bm25"
    strategy: str = "react"
    max_steps: int = 2
    tool_format: str = "compact"
    include_policy: bool = False
    max_tool_chars: int = 1200
    few_shot: bool = True


@dg.asset(group_name="collect", deps=["base_model", "qa_splits"], pool="warehouse", kinds={"pytorch", "duckdb"})
def teacher_trajectories(
    context: dg.AssetExecutionContext,
    config: TeacherTrajectoriesConfig,
    warehouse: WarehouseResource,
    models: ModelsResource,
    teacher: TeacherModelResource,
    artifacts: ArtifactsResource,
) -> dg.MaterializeResult:
    """Teacher EventLogs with provenance (run, asset, model version, QA item and chunk ids); success rate and tool use in metadata."""
    if config.task_source not in ("tau2", "qa", "both"):
        raise ValueError(f"task_source must be 'tau2', 'qa' or 'both', got {config.task_source!r}")
    tconf = TeacherConfig(
        strategy=config.strategy,
        max_steps=config.max_steps,
        tool_format=config.tool_format,
        include_policy=config.include_policy,
        max_tool_chars=config.max_tool_chars or None,
        few_shot=config.few_shot,
    )
    wh = warehouse.get()
    tasks = []
    if config.task_source in ("tau2", "both"):
        tasks += tau2_teacher_tasks(config.tau2_split, config.n_tasks, tconf, config.tau2_task_ids or None)
    if config.task_source in ("qa", "both"):
        from agenttune_lib.rag import SearchCorpusTool, load_backend
        from agenttune_lib.rag.splits import load_qa_split
        from agenttune_lib.rag.workflow import RagPaths

        search = SearchCorpusTool(load_backend(RagPaths.under(artifacts.get()).index, config.qa_search_backend))
        tasks += qa_teacher_tasks(load_qa_split(wh, config.qa_split)[: config.n_qa], tconf, tools=[search])
    generator, version = teacher.build(models.get())
    context.log.info(f"teacher {version}: {len(tasks)} tasks, strategy={config.strategy}, max_steps={config.max_steps}")
    run = collect_teacher(
        generator, tasks, tconf, model_name=version, progress=lambda i, log: context.log.info(f"task {i + 1}/{len(tasks)}: {len(log)} events")
    )
    asset_key = context.asset_key.to_user_string()
    provenance = [
        Provenance(
            run_id=context.run_id,
            asset_key=asset_key,
            model_version=version,
            qa_item_ids=task.qa_item_ids,
            chunk_ids=task.chunk_ids,
            extra={"task_id": task.task_id, "task_source": task.source, "strategy": config.strategy},
        )
        for task in run.tasks
    ]
    wh.append_logs(run.logs, provenance=provenance, source="teacher")
    summary = run.summary()
    per = summary["per_trajectory"]
    columns = [("trajectory_id", "string"), ("task_id", "string"), ("tool_calls", "int"), ("tool_errors", "int"), ("reward", "float"), ("success", "bool")]
    return dg.MaterializeResult(
        metadata={
            "n_trajectories": dg.MetadataValue.int(summary["n_trajectories"]),
            "success_rate": dg.MetadataValue.float(float(summary["success_rate"])),
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
