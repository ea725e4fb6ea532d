"""agenttune train --algorithm grpo --tools …: a real run on a tiny checkpoint, rollouts and lineage in the warehouse."""
from __future__ import annotations

import json

import pytest

from typer.testing import CliRunner

from agenttune_lib.cli import app


def test_cli_trains_grpo_with_tools(platform_home, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl.lineage import adapter_lineage
    from agenttune_lib.warehouse import Warehouse

    base = save_tiny_model(tmp_path / "base")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"task": f"What is {i}*3?", "answer": str(3 * i)}) for i in range(4)))
    result = CliRunner().invoke(app, [
        "train", "--algorithm", "grpo", "--tools", "calculator", "--tasks", str(tasks), "--base-model", str(base),
        "--steps", "1", "--num-generations", "2", "--max-completion-length", "8", "--reward", "format_reward,reward_concise_answer",
    ])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output[result.output.rindex("{\n  \"adapter_id\""):])
    assert PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out["path"]) is not None
    wh = Warehouse(platform_home / "warehouse.duckdb")
    lineage = adapter_lineage(wh, out["adapter_id"])
    assert lineage["algorithm"] == "grpo" and len(lineage["training_rows"]) == 4
    assert {r["source"] for r in lineage["training_rows"]} == {"rollout"}


def test_cli_rejects_unknown_algorithm(platform_home):
    result = CliRunner().invoke(app, ["train", "--algorithm", "a3c", "--steps", "1"])
    assert result.exit_code != 0
    assert "a3c" in result.output


@pytest.mark.parametrize("algo", ["grpo", "ppo", "rloo", "dpo", "bco"])
def test_cli_accepts_every_algorithm_with_tasks_and_tools(algo, platform_home, tmp_path):
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.rl.lineage import adapter_lineage
    from agenttune_lib.warehouse import Warehouse

    base = save_tiny_model(tmp_path / "base")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"task": f"What is {i}*3?", "answer": str(3 * i)}) for i in range(2)))
    # length_reward separates a policy's rollouts, so DPO/BCO can rank them into rows
    result = CliRunner().invoke(app, [
        "train", "-a", algo, "--tools", "calculator", "--tasks", str(tasks), "--base-model", str(base), "--steps", "1",
        "--num-generations", "2", "--batch-size", "2", "--max-completion-length", "6", "--reward", "_rl_helpers:length_reward",
    ])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output[result.output.rindex("{\n  \"adapter_id\""):])
    lineage = adapter_lineage(Warehouse(platform_home / "warehouse.duckdb"), out["adapter_id"])
    assert lineage["algorithm"] == algo and lineage["training_rows"]


@pytest.mark.parametrize("flag,value,named", [("--tools", "no_such_tool", "no_such_tool"), ("--reward", "no_such_reward", "no_such_reward"),
                                               ("--env", "nowhere", "nowhere")])
def test_cli_rejects_bad_names_before_loading_a_model(flag, value, named, platform_home, tmp_path, monkeypatch):
    import agenttune_lib.models.base as base_mod

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the names were checked")

    monkeypatch.setattr(base_mod, "load_base_model", boom)
    monkeypatch.setattr(base_mod, "ensure_base_model", boom)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task": "x"}))
    result = CliRunner().invoke(app, ["train", "-a", "grpo", "--tasks", str(tasks), flag, value, "--steps", "1"])
    assert result.exit_code != 0
    assert named in result.output and "a model was loaded" not in result.output
