"""Every consumer of "the deployed model" resolves DEPLOYED.json through resolve_deployed_model and records the adapter it
used: `agenttune decide run`, the teacher resource, the multi-agent graph, evaluation's deployed arm (and its check)."""
from __future__ import annotations

import json
import warnings

import dagster as dg
import pytest
from typer.testing import CliRunner

from _closed_loop_helpers import kyc_applicant
from agenttune_lib.closed_loop import AdapterDeployer
from agenttune_lib.closed_loop.gate import GateDecision

warnings.simplefilter("ignore")


def _adapter(base_dir, out_dir, seed):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)).save_pretrained(out_dir)
    return out_dir


@pytest.fixture
def deployed(platform_home, tmp_path):
    """(tiny base dir, deploy root): the tiny model is the platform's base model and adapter ``a1`` is deployed."""
    from agenttune_lib.models.base import select_base_model
    from agenttune_lib.models.tiny import save_tiny_model

    models = platform_home / "models"
    base = save_tiny_model(models / "tiny")
    select_base_model(models, checkpoint=base)
    root = models / "deployed"
    decision = GateDecision("d-a1", True, "a1", None, None, {}, [], "2026-01-01T00:00:00+00:00")
    AdapterDeployer(root).apply_decision(decision, _adapter(base, tmp_path / "a1", 1), "a1")
    return base, root


def test_resolver_defaults_to_the_platform_base_and_pointer(deployed):
    from agenttune_lib.models.serving import resolve_deployed_model

    base, root = deployed
    served = resolve_deployed_model()
    assert (served.base_path, served.adapter_id, served.adapter_path) == (base, "a1", root / "releases" / "a1")
    assert served.decision_id == "d-a1" and served.served_adapter_id == "a1"


def test_decide_run_is_served_by_the_deployed_adapter_and_audits_it(deployed, tmp_path):
    from agenttune_lib.cli import app

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(kyc_applicant(1)) + "\n")
    audit = tmp_path / "audit.jsonl"
    out = CliRunner().invoke(app, ["decide", "run", "kyc_triage", "--input", str(rows), "--audit", str(audit), "--max-new-tokens", "4",
                                   "--review-timeout", "0"])
    assert "served by: a1" in out.output, out.output
    runs = [json.loads(x) for x in audit.read_text().splitlines() if json.loads(x)["record_type"] == "run"]
    assert [r["served_adapter_id"] for r in runs] == ["a1"]
    # --checkpoint is the bare checkpoint, and says so in the audit line
    out = CliRunner().invoke(app, ["decide", "run", "kyc_triage", "--input", str(rows), "--audit", str(audit), "--max-new-tokens", "4",
                                   "--review-timeout", "0", "--checkpoint", str(deployed[0])])
    runs = [json.loads(x) for x in audit.read_text().splitlines() if json.loads(x)["record_type"] == "run"]
    assert [r["served_adapter_id"] for r in runs] == ["a1", "base:tiny"]


def test_decide_run_with_a_pointer_to_a_missing_adapter_is_a_clear_error(deployed, tmp_path):
    import shutil

    from agenttune_lib.cli import app

    _, root = deployed
    shutil.rmtree(root / "releases" / "a1")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(kyc_applicant(1)) + "\n")
    out = CliRunner().invoke(app, ["decide", "run", "kyc_triage", "--input", str(rows), "--audit", str(tmp_path / "a.jsonl")])
    assert out.exit_code == 1
    assert f"deployment pointer {root / 'DEPLOYED.json'} names adapter 'a1'" in out.output and "not a PEFT adapter directory" in out.output
    assert not (tmp_path / "a.jsonl").exists()  # nothing ran on a silently substituted base model


def test_teacher_resource_runs_the_deployed_adapter(deployed, platform_home):
    from peft import PeftModel

    from agenttune_assets.defs.resources import ServingResource, TeacherModelResource

    base, root = deployed
    gen, version = TeacherModelResource(max_new_tokens=4).build(platform_home / "models", ServingResource(deploy_root=str(root)))
    assert isinstance(gen.model, PeftModel) and gen.served_adapter_id == "a1"
    assert version.endswith("+a1") and version.startswith("tiny@")
    reply = gen([{"role": "user", "content": "hello"}])
    assert reply is not None
    gen, version = TeacherModelResource(checkpoint=str(base)).build(platform_home / "models")
    assert not isinstance(gen.model, PeftModel) and gen.served_adapter_id == "base:tiny" and version == str(base)


def test_teacher_trajectories_passes_the_serving_resource():
    from agenttune_assets.defs.assets.collect import teacher_trajectories

    assert "serving" in teacher_trajectories.required_resource_keys


DEPLOYED_PLANNER_SPEC = """
name: deployed_planner
policies:
  - name: planner
    model: deployed
    max_new_tokens: 4
  - name: solver
    model: tiny
    trainable: true
    prompt_from: planner
    max_new_tokens: 6
judges:
  - name: length
    kind: reward
    reward: _rl_helpers:length_reward
aggregate: weighted
train:
  max_steps: 1
  batch_size: 4
  num_generations: 2
  max_completion_length: 6
  max_prompts: 2
"""


def test_a_trainable_deployed_policy_is_refused():
    import yaml

    from agenttune_lib.multi_agent import load_graph_spec

    data = yaml.safe_load(DEPLOYED_PLANNER_SPEC)
    data["policies"][0]["model"], data["policies"][1]["model"] = "tiny", "deployed"
    with pytest.raises(ValueError, match="the trainable policy 'solver' cannot be 'deployed'"):
        load_graph_spec(data)


def test_packaged_spec_plans_with_the_deployed_model():
    from agenttune_lib.multi_agent import default_spec_path, load_graph_spec

    spec = load_graph_spec(default_spec_path())
    assert {p.name: p.model for p in spec.policies} == {"planner": "deployed", "solver": "base"}


@pytest.mark.slow
def test_multi_agent_planner_is_the_deployed_adapter_and_recorded(deployed, platform_home):
    from _rl_helpers import teacher_logs

    from agenttune_assets.defs.assets.multi_agent import multi_agent_adapter
    from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, ServingResource, WarehouseResource
    from agenttune_lib.models.tiny import build_tiny_tokenizer
    from agenttune_lib.warehouse import Provenance, Warehouse

    _, root = deployed
    wh = Warehouse(platform_home / "warehouse.duckdb")
    wh.append_logs(teacher_logs(build_tiny_tokenizer(), 3), provenance=Provenance(run_id="seed", asset_key="teacher_trajectories"), source="teacher")
    spec = platform_home / "spec.yaml"
    spec.write_text(DEPLOYED_PLANNER_SPEC)
    res = dg.materialize([multi_agent_adapter], resources={
        "warehouse": WarehouseResource(path=str(wh.path)), "models": ModelsResource(path=str(platform_home / "models")),
        "artifacts": ArtifactsResource(path=str(platform_home / "artifacts")), "serving": ServingResource(deploy_root=str(root)),
    }, run_config={"ops": {"multi_agent_adapter": {"config": {"spec_path": str(spec)}}}})
    meta = {k: v.value for k, v in res.asset_materializations_for_node("multi_agent_adapter")[0].metadata.items()}
    assert meta["deployed_model"] == "a1"
    assert meta["node_models"] == {"planner": "deployed:a1", "solver": "tiny"}
    assert {v for (v,) in wh.execute("SELECT DISTINCT adapter_version FROM trajectories WHERE source = 'multi_agent'")} == {"a1"}


@pytest.mark.slow
def test_evaluation_scores_the_deployed_arm_and_reuses_it(deployed, platform_home, tmp_path):
    import datetime as dt

    import pyarrow as pa

    from agenttune_assets.defs.asset_checks.evaluate import evaluation_no_trajectory_regression
    from agenttune_assets.defs.assets.evaluate import evaluation_report
    from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, ServingResource, WarehouseResource
    from agenttune_lib.warehouse import Warehouse

    pytest.importorskip("agenttune_lib.spine.tau2")
    base, root = deployed
    wh = Warehouse(platform_home / "warehouse.duckdb")
    cand = _adapter(base, tmp_path / "cand", 2)
    wh.upsert_arrow("adapters", pa.table({"adapter_id": ["cand"], "path": [str(cand)], "base_model": ["tiny"], "algorithm": ["dpo"],
                                          "run_id": ["r0"], "created_at": pa.array([dt.datetime.now(dt.timezone.utc)], pa.timestamp("us", tz="UTC"))}),
                    key="adapter_id")
    resources = {"warehouse": WarehouseResource(path=str(wh.path)), "models": ModelsResource(path=str(platform_home / "models")),
                 "artifacts": ArtifactsResource(path=str(platform_home / "artifacts")), "serving": ServingResource(deploy_root=str(root))}
    run_config = {"ops": {"evaluation_report": {"config": {"qa_limit": 0, "tau2_n_tasks": 1, "max_new_tokens": 4}}}}
    reports = []
    for _ in range(2):
        with dg.instance_for_test() as instance:
            res = dg.materialize([evaluation_report, evaluation_no_trajectory_regression], instance=instance, resources=resources, run_config=run_config)
            meta = {k: v.value for k, v in res.asset_materializations_for_node("evaluation_report")[0].metadata.items()}
            check = res.get_asset_check_evaluations()[0]
        reports.append(meta["report_id"])
        assert meta["candidate"] == "cand" and meta["deployed"] == "a1"
        # The check regresses the candidate against the deployed arm's rows on the same items (not "no rows yet").
        assert check.metadata["deployed_adapter"].value == "a1" and "suites" in check.metadata, check.description
    labels = wh.execute("SELECT report_id, model_label, adapter_id, count(*) FROM evaluation_items WHERE suite = 'tau2' GROUP BY ALL ORDER BY ALL")
    first, second = reports
    # The first report scores the deployed adapter on the same task; the second reuses those rows (and the base's).
    assert (first, "deployed", "a1", 1) in labels and not [r for r in labels if r[0] == second and r[1] in ("deployed", "base")]
    assert meta["deployed_arm"] == {"tau2": f"reused {first}"}


def test_multi_agent_cli_resolves_deployed_and_names_a_missing_adapter(deployed, tmp_path):
    import shutil

    from agenttune_lib.cli import app

    _, root = deployed
    shutil.rmtree(root / "releases" / "a1")
    spec = tmp_path / "spec.yaml"
    spec.write_text(DEPLOYED_PLANNER_SPEC)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task": "What is 1+1?", "answer": "2"}) + "\n")
    out = CliRunner().invoke(app, ["multi-agent", "train", "--spec", str(spec), "--tasks", str(tasks)])
    assert out.exit_code != 0 and "names adapter 'a1'" in out.output and "not a PEFT adapter directory" in out.output
