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


def _materialize_kyc(home, decide_model, models_dir=None, limit=2):
    from agenttune_assets.defs.asset_checks.decide import decide_audit_chain_intact
    from agenttune_assets.defs.resources import ServingResource

    resources = {
        "warehouse": WarehouseResource(path=str(home / "warehouse.duckdb")),
        "models": ModelsResource(path=str(models_dir or home / "models")),
        "artifacts": ArtifactsResource(path=str(home / "artifacts")),
        "decide_model": decide_model,
        "serving": ServingResource(deploy_root=str(home / "deployed")),
    }
    return dg.materialize(
        [decide_runs, decide_audit_chain_intact], partition_key="bfsi/kyc_triage", resources=resources,
        run_config={"ops": {"decide_runs": {"config": {"limit": limit}}}},
    )


def test_decide_model_resource_hands_its_thread_count_to_the_model(tmp_path):
    """One intra-op thread by default (short calls stall on a shared CPU otherwise); 0 means torch's default."""
    from agenttune_lib.models.tiny import save_tiny_model

    checkpoint = str(save_tiny_model(tmp_path / "tiny"))
    assert DecideModelResource(checkpoint=checkpoint).build(tmp_path / "models")[0].num_threads == 1
    assert DecideModelResource(checkpoint=checkpoint, num_threads=2).build(tmp_path / "models")[0].num_threads == 2
    assert DecideModelResource(checkpoint=checkpoint, num_threads=0).build(tmp_path / "models")[0].num_threads is None
    with pytest.raises(ValueError, match="num_threads must be at least 1"):
        DecideModelResource(checkpoint=checkpoint, num_threads=-1).build(tmp_path / "models")


def _model_attempts(audit):
    records = [json.loads(x) for x in audit.read_text().splitlines()]
    return records, [(r["stage_id"], a) for r in records if r.get("record_type") == "stage" for a in (r.get("attempts") or [])]


def test_decide_runs_materializes_with_a_real_local_model(tmp_path, platform_home):
    """A random-init model decoding under each stage's schema: every reply is schema-valid, so the workflow's own
    logic decides (the 16-year-old is declined at the age gate), never manual processing."""
    import jsonschema

    from agenttune_lib.models.tiny import save_tiny_model

    checkpoint = save_tiny_model(tmp_path / "tiny")
    home = tmp_path / "home"
    result = _materialize_kyc(home, DecideModelResource(backend="transformers", checkpoint=str(checkpoint), max_new_tokens=8))
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 1 and checks[0].passed and checks[0].metadata["lines"].value > 0
    meta = result.asset_materializations_for_node("decide_runs")[0].metadata
    assert meta["n_runs"].value == 2 and meta["audit_chain_ok"].value is True
    counts = meta["verdict_counts"].data
    assert sum(counts.values()) == 2 and "manual_processing" not in counts and "error" not in counts
    assert counts.get("decline", 0) >= 1  # A-1002 is 16
    assert meta["status_counts"].data.get("completed", 0) + meta["status_counts"].data.get("step_limit", 0) == 2
    audit = home / "artifacts" / "decide" / "audit.jsonl"
    assert verify_audit(audit, warehouse=home / "warehouse.duckdb").ok
    records, attempts = _model_attempts(audit)
    schemas = {s["id"]: s.get("output_schema") for s in TemplateRegistry().get("bfsi/kyc_triage").stages}
    assert attempts
    for stage_id, attempt in attempts:
        assert attempt["error"] is None, (stage_id, attempt)
        jsonschema.validate(json.loads(attempt["reply"]), schemas[stage_id])
    runs = {r["run_id"]: r for r in records if r.get("record_type") == "run"}
    young = [r for r in runs.values() if '"A-1002"' in r["input_text"]]
    assert young and young[0]["label"] == "decline" and young[0]["verdict"]["reason"] == "applicant is under 18"
    # Each example's expected label rides on its run line for the gate's replays; no stage's prompt or input saw it.
    assert sorted(tuple(r["expected_label"]) for r in runs.values()) == [("approve",), ("decline",)]
    assert all("expected_label" not in r["input_text"] for r in runs.values())
    assert not any("expected_label" in json.dumps(r) for r in records if r.get("record_type") != "run")
    wh = Warehouse(home / "warehouse.duckdb")
    logs = wh.read_logs(source="decide")
    assert len(logs) == 2
    row = wh.execute("SELECT run_id, asset_key, partition, model_version FROM trajectories WHERE id = ?", [logs[0].id])[0]
    assert row[0] == result.run_id and row[1] == "decide_runs" and row[2] == "bfsi/kyc_triage" and row[3] == str(checkpoint)


@pytest.mark.slow
def test_default_partition_gives_real_verdicts_with_the_packaged_smollm2(tmp_path, monkeypatch):
    """The default ``decide_runs`` partition (bfsi/kyc_triage, 2 rows, the packaged SmolLM2 via serving): every model
    reply is schema-valid and the verdicts are the workflow's: the adult is approved (or asked for documents), the
    16-year-old declined; nothing falls to manual processing."""
    import os

    import jsonschema

    from agenttune_lib.config import PlatformPaths

    models_dir = PlatformPaths.from_env().models  # reuse a converted checkpoint across runs
    monkeypatch.setenv("AGENTTUNE_HOME", str(tmp_path / "home"))
    home = tmp_path / "home"
    result = _materialize_kyc(home, DecideModelResource(), models_dir=models_dir)
    assert result.success
    meta = result.asset_materializations_for_node("decide_runs")[0].metadata
    counts = meta["verdict_counts"].data
    assert counts.get("decline") == 1 and (counts.get("approve", 0) + counts.get("request_documents", 0)) == 1, counts
    records, attempts = _model_attempts(home / "artifacts" / "decide" / "audit.jsonl")
    schemas = {s["id"]: s.get("output_schema") for s in TemplateRegistry().get("bfsi/kyc_triage").stages}
    assert len(attempts) >= 3
    for stage_id, attempt in attempts:
        assert attempt["error"] is None, (stage_id, attempt)
        jsonschema.validate(json.loads(attempt["reply"]), schemas[stage_id])
    extract = next(json.loads(a["reply"]) for sid, a in attempts if sid == "extract")
    assert extract["age"] == 37  # the model read the application, not noise
    assert os.environ["AGENTTUNE_HOME"] == str(home)


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
