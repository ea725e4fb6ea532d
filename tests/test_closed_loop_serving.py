"""The deployed adapter serves: the pointer resolves per run (deploy and rollback switch the next run, no restart),
and every DECIDE run records the adapter that served it in the audit line and the warehouse."""
from __future__ import annotations

import json
import warnings

import dagster as dg
import pytest

from agenttune_lib.closed_loop import AdapterDeployer
from agenttune_lib.closed_loop.gate import GateDecision
from agenttune_lib.models.serving import resolve_served_model

warnings.simplefilter("ignore")


def _approved(candidate: str) -> GateDecision:
    return GateDecision(f"d-{candidate}", True, candidate, None, None, {}, [], "2026-01-01T00:00:00+00:00")


def _adapter(base_dir, out_dir, seed):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)).save_pretrained(out_dir)
    return out_dir


def test_pointer_resolves_per_call_and_rollback_switches_back(tmp_path):
    from peft import PeftModel

    from agenttune_lib.models.tiny import save_tiny_model

    base = save_tiny_model(tmp_path / "base")
    root = tmp_path / "deployed"
    served = resolve_served_model(root, base)
    assert served.adapter_id is None and served.served_adapter_id == "base:base"
    dep = AdapterDeployer(root)
    dep.apply_decision(_approved("a1"), _adapter(base, tmp_path / "a1", 1), "a1")
    served = resolve_served_model(root, base)
    assert served.served_adapter_id == "a1" and served.decision_id == "d-a1"
    model, _ = served.load()
    assert isinstance(model, PeftModel)
    dep.apply_decision(_approved("a2"), _adapter(base, tmp_path / "a2", 2), "a2")
    assert resolve_served_model(root, base).served_adapter_id == "a2"
    dep.rollback()
    assert resolve_served_model(root, base).served_adapter_id == "a1"


def test_pointer_to_a_missing_adapter_is_a_clear_error(tmp_path):
    from agenttune_lib.models.tiny import save_tiny_model

    base = save_tiny_model(tmp_path / "base")
    (tmp_path / "dep").mkdir()
    (tmp_path / "dep" / "DEPLOYED.json").write_text(json.dumps({"adapter_id": "gone", "path": str(tmp_path / "nope")}))
    with pytest.raises(FileNotFoundError, match="gone"):
        resolve_served_model(tmp_path / "dep", base)


@pytest.mark.slow
def test_decide_runs_is_served_by_the_deployed_adapter_and_records_it(tmp_path, monkeypatch):
    from agenttune_assets.defs.assets.decide import decide_runs
    from agenttune_assets.defs.resources import ArtifactsResource, DecideModelResource, ModelsResource, ServingResource, WarehouseResource
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.warehouse import Warehouse

    base = save_tiny_model(tmp_path / "base")
    root = tmp_path / "deployed"
    wh = Warehouse(tmp_path / "wh.duckdb")
    resources = {
        "warehouse": WarehouseResource(path=wh.path), "models": ModelsResource(path=str(tmp_path / "models")),
        "artifacts": ArtifactsResource(path=str(tmp_path / "artifacts")), "decide_model": DecideModelResource(max_new_tokens=8),
        "serving": ServingResource(deploy_root=str(root), base_checkpoint=str(base)),
    }
    config = {"ops": {"decide_runs": {"config": {"limit": 1, "max_steps": 3}}}}
    audit = tmp_path / "artifacts" / "decide" / "audit.jsonl"

    def served_ids():
        lines = [json.loads(x) for x in audit.read_text().splitlines()]
        return [x["served_adapter_id"] for x in lines if x["record_type"] == "run"]

    assert dg.materialize([decide_runs], resources=resources, partition_key="bfsi/kyc_triage", run_config=config).success
    assert served_ids() == ["base:base"]
    AdapterDeployer(root).apply_decision(_approved("a1"), _adapter(base, tmp_path / "a1", 1), "a1")
    res = dg.materialize([decide_runs], resources=resources, partition_key="bfsi/kyc_triage", run_config=config)
    assert served_ids() == ["base:base", "a1"]
    assert res.asset_materializations_for_node("decide_runs")[0].metadata["served_adapter_id"].value == "a1"
    # The audit log keeps both runs; re-materializing the partition replaces its warehouse rows, now served by a1.
    stored = sorted(r[0] for r in wh.execute("SELECT adapter_version FROM trajectories"))
    assert stored == ["a1"]
