"""teacher_trajectories with the default expert teacher: every episode succeeds, is written as it ends, and names its teacher."""
from __future__ import annotations

import dagster as dg
import pytest

pytestmark = pytest.mark.slow  # needs the converted SmolLM2 checkpoint (the student's tokenizer)


def test_expert_teacher_asset_writes_successful_student_token_logs(tmp_path):
    from _spine_helpers import shared_base_model_dir

    from agenttune_assets.defs.asset_checks.collect import teacher_trajectories_succeed, teacher_trajectories_well_formed
    from agenttune_assets.defs.assets.collect import TeacherTrajectoriesConfig, teacher_trajectories
    from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, ServingResource, TeacherModelResource, WarehouseResource
    from agenttune_lib.warehouse import Warehouse

    models = shared_base_model_dir()  # converted once per machine by ensure_base_model
    resources = {
        "warehouse": WarehouseResource(path=str(tmp_path / "w.duckdb")), "models": ModelsResource(path=str(models)),
        "teacher": TeacherModelResource(), "artifacts": ArtifactsResource(path=str(tmp_path / "artifacts")),
        "serving": ServingResource(deploy_root=str(tmp_path / "deployed")),
    }
    result = dg.materialize(
        [teacher_trajectories, teacher_trajectories_well_formed, teacher_trajectories_succeed],
        resources=resources,
        run_config=dg.RunConfig({"teacher_trajectories": TeacherTrajectoriesConfig(task_source="tau2", n_tasks=4)}),
    )
    assert result.success
    meta = result.asset_materializations_for_node("teacher_trajectories")[0].metadata
    assert meta["n_trajectories"].value == 4 and meta["success_rate"].value == 1.0 and meta["valid_call_rate"].value == 1.0
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["teacher_trajectories_succeed"].passed and checks["teacher_trajectories_well_formed"].passed
    assert checks["teacher_trajectories_succeed"].metadata["successful"].value == 4
    rows = Warehouse(tmp_path / "w.duckdb").execute("SELECT teacher_kind, reward_episode, tier FROM trajectories")
    assert rows and {r[0] for r in rows} == {"expert_tau2"} and {r[1] for r in rows} == {1.0} and {r[2] for r in rows} == {"full"}
