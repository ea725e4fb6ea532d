"""base_model and teacher_trajectories: the assets materialize and their trajectories are in DuckDB."""
from __future__ import annotations

import dagster as dg
import pytest

from agenttune_assets.defs.asset_checks.collect import teacher_trajectories_well_formed
from agenttune_assets.defs.assets.collect import TeacherTrajectoriesConfig, teacher_trajectories
from agenttune_assets.defs.assets.models import BaseModelConfig, base_model
from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, ServingResource, TeacherModelResource, WarehouseResource
from agenttune_lib.models.tiny import save_tiny_model
from agenttune_lib.warehouse import Warehouse
from _spine_helpers import shared_base_model_dir


def _resources(tmp_path, checkpoint="", models_dir=None, max_new_tokens=8):
    return {
        "warehouse": WarehouseResource(path=str(tmp_path / "w.duckdb")),
        "models": ModelsResource(path=str(models_dir or tmp_path / "models")),
        "teacher": TeacherModelResource(checkpoint=checkpoint, max_new_tokens=max_new_tokens),
        "artifacts": ArtifactsResource(path=str(tmp_path / "artifacts")),
        "serving": ServingResource(deploy_root=str(tmp_path / "deployed")),
    }


def _check_written(result, tmp_path, expected):
    assert result.success
    mat = result.asset_materializations_for_node("teacher_trajectories")[0]
    meta = mat.metadata
    assert meta["n_trajectories"].value == expected
    assert "**observation**" in meta["example_trajectory"].value
    wh = Warehouse(tmp_path / "w.duckdb")
    # The stated success rate is the stored episodes' (episode reward at the success threshold 1.0).
    stored = wh.execute("SELECT avg(CASE WHEN reward_episode >= 1.0 THEN 1.0 ELSE 0.0 END) FROM trajectories")[0][0]
    assert meta["success_rate"].value == pytest.approx(stored)
    rows = wh.execute("SELECT id, tier, source, run_id, asset_key, model_version FROM trajectories")
    assert len(rows) == expected
    assert {r[1] for r in rows} == {"full"} and {r[2] for r in rows} == {"teacher"}
    assert {r[3] for r in rows} == {result.run_id} and {r[4] for r in rows} == {"teacher_trajectories"}
    return rows


def test_teacher_trajectories_materializes_with_a_tiny_checkpoint(tmp_path):
    ckpt = save_tiny_model(tmp_path / "tiny")
    result = dg.materialize(
        [teacher_trajectories, teacher_trajectories_well_formed],
        resources=_resources(tmp_path, checkpoint=str(ckpt)),
        run_config=dg.RunConfig({"teacher_trajectories": TeacherTrajectoriesConfig(teacher="model", rejection_attempts=1, task_source="tau2", n_tasks=2, max_steps=2)}),
    )
    rows = _check_written(result, tmp_path, 2)
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 1 and checks[0].passed, checks[0].metadata
    assert {r[5] for r in rows} == {str(ckpt)}
    logs = Warehouse(tmp_path / "w.duckdb").read_logs()
    assert all(log.metadata["task_source"] == "tau2_retail" and log.token_ids for log in logs)


def test_teacher_trajectories_from_qa_items(tmp_path):
    """QA tasks run with the corpus search tool over the retrieval index, and keep QA/chunk lineage."""
    from agenttune_lib.corpus import Document
    from agenttune_lib.rag.backends import BM25Backend
    from agenttune_lib.rag.chunking import chunk_documents
    from agenttune_lib.rag.splits import write_qa_items
    from agenttune_lib.rag.workflow import RagPaths

    docs = [Document.create("Either party may terminate this Agreement on thirty days written notice.", "folder", "a.txt")]
    chunks, _ = chunk_documents(docs)
    BM25Backend.build(chunks, RagPaths.under(tmp_path / "artifacts").index)
    wh = Warehouse(tmp_path / "w.duckdb")
    write_qa_items(
        wh,
        [{"qa_id": "q1", "split": "train", "question": "Who may terminate?", "answer": "either party", "gold_chunk_ids": ["c1", "c2"], "hops": 1}],
        "v1",
    )
    ckpt = save_tiny_model(tmp_path / "tiny")
    result = dg.materialize(
        [teacher_trajectories],
        resources=_resources(tmp_path, checkpoint=str(ckpt)),
        run_config=dg.RunConfig({"teacher_trajectories": TeacherTrajectoriesConfig(teacher="model", rejection_attempts=1, task_source="qa", n_qa=1, qa_search_backend="bm25")}),
    )
    assert result.success
    lineage = wh.execute("SELECT qa_item_ids, chunk_ids FROM trajectories")
    assert lineage == [(["q1"], ["c1", "c2"])]


def test_bad_task_source_fails_clearly(tmp_path):
    with pytest.raises(Exception, match="task_source must be"):
        dg.materialize(
            [teacher_trajectories],
            resources=_resources(tmp_path, checkpoint=str(tmp_path)),
            run_config=dg.RunConfig({"teacher_trajectories": TeacherTrajectoriesConfig(task_source="web")}),
        )


@pytest.mark.slow
def test_base_model_and_teacher_with_packaged_smollm2(tmp_path):
    """The real graph slice: GGUF → cached checkpoint → SmolLM2 teacher on one τ² task."""
    models_dir = shared_base_model_dir()
    result = dg.materialize(
        [base_model, teacher_trajectories],
        resources=_resources(tmp_path, models_dir=models_dir, max_new_tokens=24),
        run_config=dg.RunConfig(
            {"base_model": BaseModelConfig(), "teacher_trajectories": TeacherTrajectoriesConfig(teacher="model", rejection_attempts=1, task_source="tau2", n_tasks=1, max_steps=1)}
        ),
    )
    base = result.asset_materializations_for_node("base_model")[0].metadata
    assert base["n_params"].value == 134_515_008
    rows = _check_written(result, tmp_path, 1)
    assert rows[0][5].startswith("smollm2-135m-instruct@") and rows[0][5].endswith(base["version"].value)


def test_cli_collect_and_show_with_a_tiny_checkpoint(tmp_path, platform_home):
    import json

    from typer.testing import CliRunner

    from agenttune_lib.cli.spine import app

    ckpt = save_tiny_model(tmp_path / "tiny")
    runner = CliRunner()
    out = runner.invoke(app, ["collect", "--n-tasks", "1", "--max-steps", "1", "--max-new-tokens", "4", "--checkpoint", str(ckpt)])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output[out.output.index("{"):])
    tid = summary["per_trajectory"][0]["trajectory_id"]
    assert Warehouse(platform_home / "warehouse.duckdb").get_log(tid).tier == "full"
    shown = runner.invoke(app, ["show", tid])
    assert shown.exit_code == 0 and "**observation**" in shown.output
    assert runner.invoke(app, ["show", "nope"]).exit_code == 1
