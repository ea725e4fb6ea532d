"""agenttune train --algorithm grpo --tools …: a real run on a tiny checkpoint, rollouts and lineage in the warehouse."""
from __future__ import annotations

import json

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
