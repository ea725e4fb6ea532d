"""The [deploy] assets materialized through Dagster: failure_buffer ingests a DECIDE audit log, gate_decision gates the
newest adapter on cases rebuilt from the log, deployed_adapter deploys it or keeps the serving one; retrain_job's selection."""
from __future__ import annotations

import warnings

import dagster as dg
import pytest

from _closed_loop_helpers import write_kyc_audit
from agenttune_assets.defs.assets.deploy import deployed_adapter, failure_buffer, gate_decision
from agenttune_assets.defs.resources import ClosedLoopResource, ServingResource, WarehouseResource
from agenttune_lib.closed_loop import AdapterDeployer, TrainingBuffer
from agenttune_lib.warehouse import Warehouse

warnings.simplefilter("ignore")


def test_retrain_job_selects_the_four_assets():
    from agenttune_assets.definitions import defs

    with dg.instance_for_test():  # an earlier test's ephemeral instance may still be the load context's
        job = defs.resolve_job_def("retrain_job")
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == {
        "trained_adapter", "evaluation_report", "gate_decision", "deployed_adapter"}


@pytest.mark.slow
def test_deploy_assets_materialize_end_to_end(tmp_path):
    from peft import LoraConfig, get_peft_model

    from agenttune_lib.evaluation.report_model import EvaluationReport, write_report
    from agenttune_lib.models.tiny import build_tiny_model, save_tiny_model
    from agenttune_lib.rl.lineage import record_adapter

    home = tmp_path / "home"
    wh = Warehouse(home / "warehouse.duckdb")
    base_dir = save_tiny_model(home / "models" / "base")
    audit = write_kyc_audit(home / "decide" / "audit.jsonl", n_loops=6, n_ok=9)
    resources = {
        "warehouse": WarehouseResource(path=wh.path),
        # The hand-written log has no stage prompts to regenerate from: the legacy reference corrector; two held-out inputs.
        "closed_loop": ClosedLoopResource(audit_paths=[str(audit)], deploy_root=str(home / "models" / "deployed"), corrector="reference",
                                          gate_holdout_size=2, gate_guards=[]),  # the replay arm alone is under test here
        "serving": ServingResource(deploy_root=str(home / "models" / "deployed"), base_checkpoint=str(base_dir)),
    }
    res = dg.materialize([failure_buffer], resources=resources)
    assert res.success
    meta = res.asset_materializations_for_node("failure_buffer")[0].metadata
    assert meta["size"].value == 6 and meta["per_root_cause"].value == {"loop_collapse": 6}
    batch = TrainingBuffer(wh).drain(trigger="T5")

    import torch

    torch.manual_seed(0)
    model, _ = build_tiny_model()
    adapter_dir = tmp_path / "cand"
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)).save_pretrained(adapter_dir)
    record_adapter(wh, "cand-1", str(adapter_dir), str(base_dir), "dpo", [e.trajectory_id for e in batch.accepted], run_id="train-run")
    for adapter_id, tac in (("base:tiny", 0.8), ("cand-1", 0.8)):
        write_report(wh, EvaluationReport(f"rep-{adapter_id}", adapter_id, "adapter", "tiny", "cfg", "2026-01-01T00:00:00+00:00",
                                          None, None, {"TAC": tac, "LCF": 0.1}, {}))
    res = dg.materialize([gate_decision, deployed_adapter], resources=resources, tags={"agenttune/retrain_batch": batch.batch_id})
    assert res.success
    gate_meta = res.asset_materializations_for_node("gate_decision")[0].metadata
    dep_meta = res.asset_materializations_for_node("deployed_adapter")[0].metadata
    approved = gate_meta["approved"].value
    # A random LoRA fixes none of the six looping inputs the baseline also fails: the replay arm refuses, nothing deploys.
    assert approved is False and gate_meta["reasons"].value == [
        "replay: the candidate fixes 0.00 of the batch's failures (need 0.50); failures passing 0.00 -> 0.00: no improvement over the baseline"]
    assert gate_meta["held_out_cases"].value == 2 and gate_meta["failures_replayed"].value == 6 and gate_meta["candidate"].value == "cand-1"
    arms = gate_meta["arms"].value
    assert arms["trajectory"]["exercised"] and arms["provenance"]["passed"]
    assert dep_meta["deployed_now"].value == approved
    serving = AdapterDeployer(home / "models" / "deployed").current()
    assert (serving.adapter_id if serving else None) == ("cand-1" if approved else None)
    stored = wh.execute("SELECT approved, run_id, batch_id FROM gate_decisions")
    assert stored == [(approved, res.run_id, batch.batch_id)]
    assert TrainingBuffer(wh).stats().retrain_batch is None
    status = wh.execute("SELECT status FROM training_buffer_batches WHERE batch_id = ?", [batch.batch_id])
    assert status == [("refused",)]  # closed as refused, not succeeded
