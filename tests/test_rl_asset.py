"""trained_adapter materializes on Ray from teacher trajectories: a PeftModel adapter dir, metadata and lineage rows."""
from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow


def test_trained_adapter_materializes_and_loads_as_peft(platform_home):
    import dagster as dg
    from peft import PeftModel

    from agenttune_assets.defs.assets.train import trained_adapter
    from agenttune_assets.defs.resources import (
        ArtifactsResource, ClosedLoopResource, ModelsResource, RayResource, ServingResource, WarehouseResource,
    )
    from agenttune_lib.models.base import load_base_model
    from agenttune_lib.rl.lineage import adapter_lineage
    from agenttune_lib.rl.rollout import episode_to_eventlog
    from agenttune_lib.warehouse import Provenance, Warehouse
    from test_rl_table8 import SYSTEM, TOPICS, _model_dir

    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.pop("RAY_ADDRESS", None)
    cached = _model_dir()
    models = platform_home / "models"
    models.mkdir()
    (models / cached.name).symlink_to(cached, target_is_directory=True)
    _, tok = load_base_model(cached)
    wh = Warehouse(platform_home / "warehouse.duckdb")
    logs = [episode_to_eventlog(tok, SYSTEM, f"Find the {t} clause.", [{"kind": "tool_call", "payload": {"name": "search", "arguments": {"query": t}}}])[0] for t in TOPICS[:4]]
    wh.append_logs(logs, provenance=Provenance(run_id="teacher-run", asset_key="teacher_trajectories"), source="spine")

    result = dg.materialize(
        [trained_adapter],
        resources={"warehouse": WarehouseResource(), "models": ModelsResource(), "artifacts": ArtifactsResource(), "ray": RayResource(num_cpus=2),
                   "closed_loop": ClosedLoopResource(), "serving": ServingResource()},
        run_config={"ops": {"trained_adapter": {"config": {"distill": {"max_steps": 2, "max_trajectories": 4, "max_length": 96}}}}},
    )
    assert result.success
    mat = result.asset_materializations_for_node("trained_adapter")[0]
    meta = mat.metadata
    assert meta["algorithm"].value == "distill" and meta["training_rows"].value == 4
    assert meta["base_model"].value.startswith("smollm2-135m-instruct@")
    assert "data:image/png;base64," in meta["curves"].value
    path = meta["path"].value
    base, _ = load_base_model(cached)
    assert isinstance(PeftModel.from_pretrained(base, path), PeftModel)
    lineage = adapter_lineage(wh, meta["adapter_id"].value)
    assert sorted(r["trajectory_id"] for r in lineage["training_rows"]) == sorted(log.id for log in logs)
    assert lineage["run_id"] == result.run_id and lineage["data_version"] == meta["data_version"].value
