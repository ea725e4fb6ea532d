"""agenttune multi-agent check|train|attribution."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agenttune_lib.cli import app

from test_multi_agent_asset import TINY_SPEC


def test_check_prints_the_packaged_spec():
    result = CliRunner().invoke(app, ["multi-agent", "check"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["name"] == "planner_solver" and [p["name"] for p in out["policies"]] == ["planner", "solver"]


def test_check_rejects_a_bad_spec_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY_SPEC.replace("aggregate: weighted", "aggregate: loudest"))
    result = CliRunner().invoke(app, ["multi-agent", "check", str(bad)])
    assert result.exit_code != 0
    assert "aggregate must be one of" in result.output


def test_attribution_on_an_empty_warehouse_says_so(platform_home):
    result = CliRunner().invoke(app, ["multi-agent", "attribution"])
    assert result.exit_code != 0


@pytest.mark.slow
def test_train_then_read_attribution(platform_home, tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_SPEC)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"task": f"What is {i}+{i}?", "answer": str(2 * i)}) for i in range(2)))
    result = CliRunner().invoke(app, ["multi-agent", "train", "--spec", str(spec), "--tasks", str(tasks)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output[result.output.rindex("{\n  \"adapter_id\""):])
    assert out["rollouts"] == 4 and set(out["judges"]) == {"format", "length", "judge_panel"}
    attr = CliRunner().invoke(app, ["multi-agent", "attribution", "--run-id", out["run_id"]])
    assert attr.exit_code == 0, attr.output
    data = json.loads(attr.output)
    assert set(data["agents"]) == {"planner", "solver"} and set(data["judges"]) == {"format", "length", "judge_panel"}
