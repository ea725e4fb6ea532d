"""The YAML graph spec and the multi_agent_adapter asset (tiny-model spec; the packaged default uses the base model)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agenttune_lib.multi_agent import default_spec_path, load_graph_spec

TINY_SPEC = """
name: tiny_planner_solver
policies:
  - name: planner
    model: tiny-llama
    max_new_tokens: 4
  - name: solver
    model: tiny
    trainable: true
    prompt_from: planner
    max_new_tokens: 6
judges:
  - name: format
    kind: reward
    reward: format_reward
  - name: length
    kind: reward
    reward: _rl_helpers:length_reward  # varies between a random tiny model's samples (an all-equal step fails loudly)
    weight: 0.5
aggregate: weighted
train:
  max_steps: 1
  batch_size: 4
  num_generations: 2
  max_completion_length: 6
  max_prompts: 2
"""


def test_packaged_default_spec_loads_and_is_cheap():
    path = default_spec_path()
    assert path.exists(), "the default spec must ship as package data"
    spec = load_graph_spec(path)
    assert [p.name for p in spec.policies] == ["planner", "solver"] and spec.trainable.name == "solver"
    assert len(spec.judges) == 2 and spec.aggregate == "weighted"
    assert spec.train.max_steps == 1 and spec.train.max_completion_length <= 16 and spec.train.num_generations >= 4
    assert {j.kind for j in spec.judges} == {"overlap"}  # answer-free: main-job tasks carry no reference answers


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"policies": [{"name": "a", "model": "tiny"}]}, "exactly one policy must be 'trainable: true'"),
        ({"judges": [{"name": "j", "kind": "reward", "reward": "no_such_reward"}]}, "names reward 'no_such_reward'"),
        ({"judges": [{"name": "j", "kind": "llm"}]}, "needs 'model'"),
        ({"aggregate": "max"}, "aggregate must be one of"),
        ({"router": {"kind": "round_robin"}}, "with a router the policies are alternatives"),
        ({"bogus": 1}, r"unknown top-level key\(s\) \['bogus'\]"),
        ({"policies": [{"name": "a", "model": "tiny", "trainable": True, "temp": 2}]}, r"policies\[0\]: unknown key\(s\) \['temp'\]"),
        ({"policies": [{"name": "a", "trainable": True, "prompt_from": "b"}, {"name": "b"}]}, "not an earlier policy"),
    ],
)
def test_bad_specs_name_the_problem(patch, message):
    import yaml

    data = yaml.safe_load(TINY_SPEC)
    data.update(patch)
    with pytest.raises(ValueError, match=message):
        load_graph_spec(data)


def test_missing_spec_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_graph_spec(tmp_path / "nope.yaml")


def _seed_teacher_logs(wh_path: Path) -> None:
    from _rl_helpers import teacher_logs

    from agenttune_lib.models.tiny import build_tiny_tokenizer
    from agenttune_lib.warehouse import Provenance, Warehouse

    Warehouse(wh_path).append_logs(teacher_logs(build_tiny_tokenizer(), 3), provenance=Provenance(run_id="seed", asset_key="teacher_trajectories"), source="teacher")


def _resources(home: Path) -> dict:
    from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, ServingResource, WarehouseResource

    return {
        "warehouse": WarehouseResource(path=str(home / "warehouse.duckdb")),
        "models": ModelsResource(path=str(home / "models")),
        "artifacts": ArtifactsResource(path=str(home / "artifacts")),
        "serving": ServingResource(deploy_root=str(home / "models" / "deployed")),
    }


def test_asset_without_teacher_trajectories_fails_clearly(platform_home):
    import dagster as dg

    from agenttune_assets.defs.assets.multi_agent import multi_agent_adapter

    spec = platform_home / "tiny.yaml"
    spec.write_text(TINY_SPEC)
    with pytest.raises(dg.Failure, match="no teacher trajectories"):
        dg.materialize([multi_agent_adapter], resources=_resources(platform_home),
                       run_config={"ops": {"multi_agent_adapter": {"config": {"spec_path": str(spec)}}}})


@pytest.mark.slow
def test_asset_materializes_with_per_judge_distributions_and_lineage(platform_home):
    import dagster as dg

    from agenttune_assets.defs.asset_checks.multi_agent import multi_agent_attribution_complete
    from agenttune_assets.defs.assets.multi_agent import multi_agent_adapter
    from agenttune_lib.events import EventKind
    from agenttune_lib.rl.lineage import adapter_lineage
    from agenttune_lib.warehouse import Warehouse

    res = _resources(platform_home)
    _seed_teacher_logs(platform_home / "warehouse.duckdb")
    spec = platform_home / "tiny.yaml"
    spec.write_text(TINY_SPEC)
    result = dg.materialize([multi_agent_adapter, multi_agent_attribution_complete], resources=res,
                            run_config={"ops": {"multi_agent_adapter": {"config": {"spec_path": str(spec)}}}})
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert [c.passed for c in checks] == [True] and checks[0].metadata["trajectories"].value == 4
    mat = result.asset_materializations_for_node("multi_agent_adapter")[0]
    meta = {k: v.value for k, v in mat.metadata.items()}
    dists = meta["judge_score_distributions"]
    assert set(dists) == {"format", "length", "judge_panel"} and all(len(v) == 4 for v in dists.values())
    assert "| format |" in meta["judge_score_summary"]
    assert meta["agent_event_counts"]["planner"]["text"] == 4 and meta["agent_event_counts"]["solver"]["text"] == 4
    assert meta["plan"] == ["planner", "solver_prompt", "solver", "__episode__", "format", "length", "__panel__"]
    assert Path(meta["path"], "adapter_config.json").exists()
    wh = Warehouse(platform_home / "warehouse.duckdb")
    lineage = adapter_lineage(wh, meta["adapter_id"])
    assert len(lineage["training_rows"]) == 4 and {r["source"] for r in lineage["training_rows"]} == {"multi_agent"}
    log = wh.get_log(lineage["training_rows"][0]["trajectory_id"])
    assert [e.author for e in log.filter(EventKind.REWARD)] == ["format", "length", "judge_panel"]
    assert wh.execute("SELECT DISTINCT asset_key FROM trajectories WHERE source = 'multi_agent'") == [("multi_agent_adapter",)]
    report = json.loads(Path(meta["report"]).read_text())
    assert set(report["attribution"]["judges"]) == {"format", "length", "judge_panel"}
