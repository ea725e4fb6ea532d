"""[collect] teacher_trajectories: the spine runs a teacher over a task set and writes full-tier EventLogs to the warehouse as each episode ends."""

import dagster as dg

from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, ServingResource, TeacherModelResource, WarehouseResource
from agenttune_lib.spine.collect import TeacherRun, trajectory_markdown
from agenttune_lib.teachers.job import TEACHERS, TeacherJob, plan_teacher_job, run_teacher_job, teacher_figures  # noqa: F401  (TEACHERS: importable here as before)


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
    n_no_tool: int = 12  # expert, with QA tasks: prompts no offered tool fits (or that need none), answered in plain text
    no_tool_format: str = "json"  # how their tools are listed: json (as BFCL's platform arm shows them) or compact
    qa_search_backend: str = "hybrid"
    qa_query_source: str = "context"  # expert QA queries from the student's context only; "passage" adds the gold passage's words
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
    from agenttune_lib.models.base import ensure_base_model

    job, wh = TeacherJob.from_config(config), warehouse.get()
    plan = plan_teacher_job(job, wh, artifacts.get(), base_model_path=lambda: ensure_base_model(models.get()).path,
                            build_model=lambda: teacher.build(models.get(), serving))  # a checkpoint, else the deployed model
    n_tasks = sum(len(ts) for _, ts in plan.runs)
    if not n_tasks:
        raise dg.Failure(f"teacher_trajectories: no tasks selected (task_source={job.task_source!r}, n_tasks={job.n_tasks}, n_qa={job.n_qa})")
    context.log.info(f"teacher {job.teacher}: {n_tasks} tasks ({', '.join(f'{k}: {len(ts)}' for k, ts in plan.runs)})")
    run = run_teacher_job(job, plan, wh, context.run_id, context.asset_key.to_user_string(), log=context.log.info, warn=context.log.warning)
    if not run.logs:
        raise dg.Failure(f"teacher_trajectories: every task failed ({run.failures[:5]})")
    return dg.MaterializeResult(metadata=_teacher_metadata(run, teacher_figures(run, plan), job.teacher))


_PER_TRAJECTORY = [("trajectory_id", "string"), ("task_id", "string"), ("tool_calls", "int"), ("tool_errors", "int"), ("reward", "float"), ("success", "bool")]


def _teacher_metadata(run: TeacherRun, figures: dict, teacher: str) -> dict:
    """The asset's metadata: the run's figures, a per-trajectory table and one example trajectory."""
    return {
        "n_trajectories": dg.MetadataValue.int(figures["n_trajectories"]),
        "success_rate": dg.MetadataValue.float(float(figures["success_rate"])),
        "valid_call_rate": dg.MetadataValue.float(float(figures["valid_call_rate"])),
        "failed_tasks": dg.MetadataValue.int(figures["n_failed_tasks"]),
        "failures": dg.MetadataValue.json(figures["failures"][:20]),
        "teacher": teacher,
        "qa_gold_hops_retrieved": figures["qa_gold_hops_retrieved"],
        "qa_hop_recall": dg.MetadataValue.float(figures["qa_hop_recall"]),
        "qa_answer_in_context": figures["qa_answer_in_context"],
        "tool_calls": dg.MetadataValue.int(figures["tool_calls"]),
        "tool_errors": dg.MetadataValue.int(figures["tool_errors"]),
        "tool_calls_by_name": dg.MetadataValue.json(figures["tool_calls_by_name"]),
        "tiers": figures["tiers"],
        "model_version": figures["model_version"],
        "generated_tokens": dg.MetadataValue.int(figures["generated_tokens"]),
        "per_trajectory": dg.MetadataValue.table(
            [dg.TableRecord({c: p[c] for c, _ in _PER_TRAJECTORY}) for p in figures["per_trajectory"]],
            schema=dg.TableSchema(columns=[dg.TableColumn(c, t) for c, t in _PER_TRAJECTORY]),
        ),
        "example_trajectory": dg.MetadataValue.md(trajectory_markdown(run.logs[0])),
    }
