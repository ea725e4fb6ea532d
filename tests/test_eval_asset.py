"""The evaluation_report asset (tiny base + a real LoRA adapter, a BM25 QA index, τ² tasks) and its regression check."""
import datetime as dt

import dagster as dg
import pyarrow as pa
import pytest

from agenttune_assets.defs.asset_checks.evaluate import evaluation_no_trajectory_regression
from agenttune_assets.defs.assets.evaluate import evaluation_report
from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, ServingResource, WarehouseResource
from agenttune_lib.evaluation.store import latest_comparisons, load_items, write_items
from agenttune_lib.warehouse import Warehouse

pytest.importorskip("agenttune_lib.spine.tau2")


@pytest.fixture
def setup(tmp_path):
    from peft import LoraConfig, get_peft_model

    from agenttune_lib.closed_loop import AdapterDeployer
    from agenttune_lib.closed_loop.gate import GateDecision
    from agenttune_lib.models.tiny import build_tiny_model, save_tiny_model
    from agenttune_lib.rag.backends import build_index
    from agenttune_lib.rag.chunking import Chunk
    from agenttune_lib.rag.splits import write_qa_items
    from agenttune_lib.rag.workflow import RagPaths

    base = save_tiny_model(tmp_path / "tiny")
    model, _ = build_tiny_model()
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "adapter_a")
    wh = Warehouse(tmp_path / "w.duckdb")
    now = dt.datetime.now(dt.timezone.utc)
    wh.upsert_arrow("adapters", pa.table({"adapter_id": ["adapter_a"], "path": [str(tmp_path / "adapter_a")], "base_model": ["tiny"],
                                          "algorithm": ["sft"], "run_id": ["r0"], "created_at": pa.array([now], pa.timestamp("us", tz="UTC"))}),
                    key="adapter_id")
    # What serves is what DEPLOYED.json names: a second tiny LoRA, deployed for real.
    model, _ = build_tiny_model(seed=1)
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "deployed_x")
    AdapterDeployer(tmp_path / "deployed").apply_decision(GateDecision("d1", True, "deployed_x", None, None, {}, [], now.isoformat()),
                                                          tmp_path / "deployed_x", "deployed_x")
    chunks = [Chunk(f"c{i}", f"d{i}", 0, f"Fact {i}: the code word of item {i} is word{i}.") for i in range(6)]
    build_index(chunks, RagPaths.under(tmp_path / "artifacts").index, kinds=("bm25",))
    write_qa_items(wh, [{"qa_id": f"q{i}", "split": "validation", "question": f"What is the code word of item {i}?", "answer": f"word{i}",
                         "gold_chunk_ids": [f"c{i}"], "hops": 1} for i in range(3)], "v1")
    resources = {
        "warehouse": WarehouseResource(path=str(tmp_path / "w.duckdb")),
        "models": ModelsResource(path=str(tmp_path / "models")),
        "artifacts": ArtifactsResource(path=str(tmp_path / "artifacts")),
        "serving": ServingResource(deploy_root=str(tmp_path / "deployed"), base_checkpoint=str(base)),
    }
    run_config = {"ops": {"evaluation_report": {"config": {
        "base_model_path": str(base), "qa_limit": 3, "qa_search_backend": "bm25", "tau2_n_tasks": 2, "tau2_max_actions": 2,
        "max_new_tokens": 8, "min_gain": 0.1}}}}
    return wh, resources, run_config


@pytest.mark.slow
def test_paired_report_rows_comparisons_plot_and_tool_use_regression(setup):
    wh, resources, run_config = setup
    with dg.instance_for_test() as instance:
        res = dg.materialize([evaluation_report, evaluation_no_trajectory_regression], instance=instance, resources=resources,
                             run_config=run_config, raise_on_error=False)
        assert res.success
        meta = instance.get_latest_materialization_event(dg.AssetKey("evaluation_report")).asset_materialization.metadata
        report_id = meta["report_id"].value
        labels = wh.execute("SELECT suite, model_label, count(*) FROM evaluation_items WHERE report_id = ? GROUP BY ALL ORDER BY ALL", [report_id])
        assert labels == [("qa", "base", 3), ("qa", "candidate", 3), ("qa", "deployed", 3),
                          ("tau2", "base", 2), ("tau2", "candidate", 2), ("tau2", "deployed", 2), ("tau2", "do_nothing", 2)]
        hashes = {h for (h,) in wh.execute("SELECT DISTINCT config_hash FROM evaluation_items WHERE report_id = ?", [report_id])}
        assert hashes == {h for (h,) in wh.execute("SELECT config_hash FROM evaluation_configs")}  # every hash says what it stands for
        comps = latest_comparisons(wh, "adapter_a")
        assert {(c["suite"], c["metric"]) for c in comps} >= {("qa", "score"), ("tau2", "success"), ("tau2", "action_recall")}
        assert all(c["n"] >= 2 and c["mde"] > 0 and c["ci_low"] <= c["diff"] <= c["ci_high"] for c in comps)
        suites = {r.data["suite"]: r.data for r in meta["suites"].records}
        assert suites["qa"]["n"] == 3 and suites["tau2"]["n"] == 2 and suites["tau2"]["do_nothing"] == 0.0
        assert "MDE" in meta["summary"].value and meta["plot"].value.startswith("![paired comparison](data:image/png;base64,")
        assert report_id in meta["plot"].value  # the figure names the per-item table behind it
        check = res.get_asset_check_evaluations()[0]
        # The deployed arm scored what serves on the same items: the check compared against those rows.
        assert meta["deployed"].value == "deployed_x" and check.metadata["deployed_adapter"].value == "deployed_x"
        assert set(check.metadata["suites"].value) == {"qa", "tau2"}

    # The deployed adapter called tools on the same items under the same config; the tiny candidate never does -> ERROR.
    for suite in ("qa", "tau2"):
        rows = load_items(wh, report_id, suite, "candidate")
        deployed = [{**r, "metrics": {**r["metrics"], "tool_calls": 1}} for r in rows]
        write_items(wh, "deployed-report", suite, "deployed", "deployed_x", deployed, rows[0]["config_hash"])
    with dg.instance_for_test() as instance:
        res = dg.materialize([evaluation_report, evaluation_no_trajectory_regression], instance=instance, resources=resources,
                             run_config=run_config, raise_on_error=False)
        meta = instance.get_latest_materialization_event(dg.AssetKey("evaluation_report")).asset_materialization.metadata
        assert {r.data["suite"]: r.data["base_reused_from"] for r in meta["suites"].records} == {"qa": report_id, "tau2": report_id}
        check = res.get_asset_check_evaluations()[0]
        assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
        assert "made no tool call" in check.description
