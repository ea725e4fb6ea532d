"""The ``decide_runs`` asset: one template partition → audit lines, EventLogs with provenance, verdict metadata."""
import json

import dagster as dg
import pytest

from agenttune_assets.defs.assets.decide import decide_partitions, decide_runs
from agenttune_assets.defs.resources import ArtifactsResource, DecideModelResource, ModelsResource, WarehouseResource
from agenttune_lib.decide import TemplateRegistry, verify_audit
from agenttune_lib.warehouse import Warehouse


def test_partitions_are_the_template_ids():
    assert decide_partitions.get_partition_keys() == TemplateRegistry().ids()
    assert "bfsi/kyc_triage" in decide_partitions.get_partition_keys()


def test_decide_runs_materializes_with_a_real_local_model(tmp_path):
    from agenttune_lib.models.tiny import save_tiny_model

    checkpoint = save_tiny_model(tmp_path / "tiny")
    home = tmp_path / "home"
    resources = {
        "warehouse": WarehouseResource(path=str(home / "warehouse.duckdb")),
        "models": ModelsResource(path=str(home / "models")),
        "artifacts": ArtifactsResource(path=str(home / "artifacts")),
        "decide_model": DecideModelResource(backend="transformers", checkpoint=str(checkpoint), max_new_tokens=8),
    }
    from agenttune_assets.defs.asset_checks.decide import decide_audit_chain_intact

    result = dg.materialize(
        [decide_runs, decide_audit_chain_intact], partition_key="bfsi/kyc_triage", resources=resources,
        run_config={"ops": {"decide_runs": {"config": {"limit": 2}}}},
    )
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 1 and checks[0].passed and checks[0].metadata["lines"].value > 0
    mat = result.asset_materializations_for_node("decide_runs")[0]
    meta = mat.metadata
    assert meta["n_runs"].value == 2 and meta["audit_chain_ok"].value is True
    counts = meta["verdict_counts"].data
    assert sum(counts.values()) == 2
    # a random tiny model does not produce the schema's JSON: the extract stage fails and routes to manual processing
    assert counts == {"manual_processing": 2}
    assert meta["sample_trace"].data["path"][0] == "extract"
    audit = home / "artifacts" / "decide" / "audit.jsonl"
    assert verify_audit(audit).ok
    records = [json.loads(x) for x in audit.read_text().splitlines()]
    extract = [r for r in records if r.get("stage_id") == "extract"]
    assert extract and extract[0]["status"] == "error" and extract[0]["attempts"][0]["reply"] is not None
    wh = Warehouse(home / "warehouse.duckdb")
    logs = wh.read_logs(source="decide")
    assert len(logs) == 2
    row = wh.execute("SELECT run_id, asset_key, partition, model_version FROM trajectories WHERE id = ?", [logs[0].id])[0]
    assert row[0] == result.run_id and row[1] == "decide_runs" and row[2] == "bfsi/kyc_triage" and row[3] == str(checkpoint)


def test_decide_runs_is_in_the_collect_group_and_runs_after_the_main_job():
    from agenttune_assets.definitions import PARTITIONED_DEFAULTS, defs

    assets_def = defs.resolve_assets_def("decide_runs")
    assert assets_def.group_names_by_key[dg.AssetKey("decide_runs")] == "collect"
    assert dg.AssetKey("base_model") in assets_def.dependency_keys
    assert PARTITIONED_DEFAULTS["decide_runs"] == ["bfsi/kyc_triage"]


@pytest.mark.slow
def test_kyc_triage_with_the_packaged_smollm2_base_model(tmp_path):
    """The real 135M model: its replies are recorded verbatim and whatever it answers ends in a verdict."""
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.decide import GraphRunner, TransformersModel
    from agenttune_lib.models.base import ensure_base_model

    info = ensure_base_model(PlatformPaths.from_env().ensure().models)
    runner = GraphRunner.from_template(
        "kyc_triage", model=TransformersModel(info.path, max_new_tokens=16), audit=tmp_path / "audit.jsonl",
        review_dir=tmp_path, human_review_timeout=0.0, max_retries=0, destinations=[],
    )
    state = runner.run(runner.config.examples[0])
    assert state.completed and state.verdict["label"]
    assert verify_audit(tmp_path / "audit.jsonl").ok
    first = json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[0])
    assert first["stage_id"] == "extract" and first["attempts"][0]["reply"]
