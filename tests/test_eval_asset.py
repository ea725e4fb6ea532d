"""The evaluation_report asset and its regression check, on tiny models with a real LoRA adapter."""
import dagster as dg
import pyarrow as pa
import pytest

from agenttune_assets.defs.asset_checks.evaluate import evaluation_no_trajectory_regression
from agenttune_assets.defs.assets.evaluate import evaluation_report
from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, WarehouseResource
from agenttune_lib.evaluation.report_model import EvaluationReport, latest_report, write_report
from agenttune_lib.warehouse import Warehouse

pytest.importorskip("agenttune_lib.spine.tau2")


@pytest.fixture
def setup(tmp_path):
    import datetime as dt

    from peft import LoraConfig, get_peft_model

    from agenttune_lib.closed_loop.deploy import DEPLOYMENTS_DDL
    from agenttune_lib.models.tiny import build_tiny_model, save_tiny_model

    base = save_tiny_model(tmp_path / "tiny")
    model, _ = build_tiny_model()
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    peft_model.save_pretrained(tmp_path / "adapter_a")
    wh = Warehouse(tmp_path / "w.duckdb")
    now = dt.datetime.now(dt.timezone.utc)
    wh.upsert_arrow("adapters", pa.table({"adapter_id": ["adapter_a"], "path": [str(tmp_path / "adapter_a")], "base_model": ["tiny"],
                                          "algorithm": ["sft"], "run_id": ["r0"], "created_at": pa.array([now], pa.timestamp("us", tz="UTC"))}),
                    key="adapter_id")
    with wh.connect() as con:
        con.execute(DEPLOYMENTS_DDL)
        con.execute("INSERT INTO deployments VALUES ('d1', 'deployed_x', NULL, NULL, 'deploy', '/x', 'r0', ?)", [now]).fetchall()
    resources = {
        "warehouse": WarehouseResource(path=str(tmp_path / "w.duckdb")),
        "models": ModelsResource(path=str(tmp_path / "models")),
        "artifacts": ArtifactsResource(path=str(tmp_path / "artifacts")),
    }
    run_config = {"ops": {"evaluation_report": {"config": {
        "base_model_path": str(base), "bfcl_categories": ["simple_python", "irrelevance"], "bfcl_limit": 1,
        "tau2_limit": 1, "tau2_max_steps": 1, "seeds": [0, 1], "max_new_tokens": 4}}}}
    return wh, resources, run_config


def _report(wh, report_id, adapter_id, tac, lcf, created_at):
    write_report(wh, EvaluationReport(
        report_id=report_id, adapter_id=adapter_id, model_kind="adapter", base_model="base:tiny", config_fingerprint="other",
        created_at=created_at, bfcl=None, tau2=None, trajectory_means={"TAC": tac, "LCF": lcf}, settings={}))


@pytest.mark.slow
def test_reports_for_base_and_adapter_with_metadata_and_regression_check(setup):
    wh, resources, run_config = setup
    from agenttune_lib.evaluation.bfcl import run_bfcl
    from agenttune_lib.evaluation.report_model import EvaluationConfig, build_report

    calib = run_bfcl(lambda messages, **kw: "[]", ["irrelevance"], limit=1).to_dict()  # a 3-seed calibration run, recorded
    write_report(wh, build_report("base:tiny", "base:tiny", EvaluationConfig(), calib, None, model_kind="base", source="calibration"))
    with dg.instance_for_test() as instance:
        res = dg.materialize([evaluation_report, evaluation_no_trajectory_regression], instance=instance, resources=resources,
                             run_config=run_config, raise_on_error=False)
        assert res.success
        rows = wh.execute("SELECT adapter_id, model_kind, run_id, template_mode, seeds FROM evaluation_reports "
                          "WHERE run_id IS NOT NULL ORDER BY model_kind")
        assert [(r[0], r[1]) for r in rows] == [("adapter_a", "adapter"), ("base:tiny", "base")]
        assert all(r[2] == res.run_id and r[3] == "native" and r[4] == "[0, 1]" for r in rows)
        rep = latest_report(wh, "adapter_a")
        assert set(rep.bfcl["categories"]) == {"simple_python", "irrelevance"}
        assert rep.bfcl["categories"]["simple_python"]["n_seeds"] == 2
        assert rep.tau2["success"]["n_seeds"] == 2 and "LCF" in rep.trajectory_means
        meta = instance.get_latest_materialization_event(dg.AssetKey("evaluation_report")).asset_materialization.metadata
        assert isinstance(meta["scores"], dg.TableMetadataValue) and len(meta["scores"].records) == 2 * 3
        assert meta["plot"].value.startswith("![before/after](data:image/png;base64,")
        assert set(meta["conditions"].value["system_prompt_sha256"]) == {"bfcl", "tau2"}
        calib_rows = meta["calibration_3_seeds"].records
        assert [(r.data["category"], r.data["mean"], r.data["n_seeds"]) for r in calib_rows] == [("irrelevance", 1.0, 3)]
        check = res.get_asset_check_evaluations()[0]
        assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN  # the deployed adapter has no report

    # The deployed adapter's report is clearly better; a newer candidate regresses on TAC -> ERROR.
    _report(wh, "deployed-report", "deployed_x", 0.9, 0.0, "2026-01-01T00:00:00+00:00")
    _report(wh, "candidate-b", "adapter_b", 0.5, 0.0, "2099-01-01T00:00:00+00:00")
    with dg.instance_for_test() as instance:
        res = dg.materialize([evaluation_report, evaluation_no_trajectory_regression], instance=instance, resources=resources,
                             run_config=run_config, raise_on_error=False)
        meta = instance.get_latest_materialization_event(dg.AssetKey("evaluation_report")).asset_materialization.metadata
        assert meta["evaluated"].value == 0  # base and adapter_a already reported under this config
        check = res.get_asset_check_evaluations()[0]
        assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
        assert "TAC fell from 0.900 to 0.500" in check.description

    # Within tolerance -> passes.
    _report(wh, "candidate-c", "adapter_c", 0.88, 0.04, "2099-01-02T00:00:00+00:00")
    with dg.instance_for_test() as instance:
        res = dg.materialize([evaluation_report, evaluation_no_trajectory_regression], instance=instance, resources=resources,
                             run_config=run_config, raise_on_error=False)
        assert res.get_asset_check_evaluations()[0].passed
