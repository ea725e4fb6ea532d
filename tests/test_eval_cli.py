"""``agenttune eval bfcl|tau2|trajectories`` on a tiny checkpoint."""
import json

import pytest
from typer.testing import CliRunner

from agenttune_lib.cli import app
from agenttune_lib.events import Event, EventKind, EventLog

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from agenttune_lib.models.tiny import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


def test_eval_bfcl(tiny, tmp_path):
    out = tmp_path / "bfcl.json"
    res = runner.invoke(app, ["eval", "bfcl", "--model", tiny, "--categories", "simple_python", "--categories", "irrelevance", "--limit", "1",
                              "--seeds", "0,1", "--max-new-tokens", "4", "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert "irrelevance" in res.output and "system_prompt_sha256" in res.output
    data = json.loads(out.read_text())
    assert data["categories"]["simple_python"]["n_seeds"] == 2 and len(data["items"]) == 4


@pytest.mark.slow
def test_eval_tau2(tiny, tmp_path):
    pytest.importorskip("agenttune_lib.spine.tau2")
    out = tmp_path / "tau2.json"
    res = runner.invoke(app, ["eval", "tau2", "--model", tiny, "--limit", "1", "--max-steps", "1", "--seeds", "0",
                              "--max-new-tokens", "4", "--template", "context", "--output", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["settings"]["template_mode"] == "context" and data["success"]["n_seeds"] == 1


def test_eval_rejects_bad_input(tiny):
    res = runner.invoke(app, ["eval", "bfcl", "--model", tiny, "--categories", "nope"])
    assert res.exit_code != 0 and "nope" in res.output
    res = runner.invoke(app, ["eval", "bfcl", "--model", "/no/such/dir", "--limit", "1"])
    assert res.exit_code != 0 and "checkpoint" in res.output
    res = runner.invoke(app, ["eval", "tau2", "--model", tiny, "--template", "weird"])
    assert res.exit_code != 0 and "template_mode" in res.output


def test_eval_trajectories(tmp_path):
    from agenttune_lib.warehouse import Warehouse

    call = {"name": "search", "arguments": {"q": "a"}}
    log = EventLog([Event(EventKind.TOOL_CALL, call)] * 3, id="t1")
    Warehouse(tmp_path / "w.duckdb").append_logs([log], source="spine")
    res = runner.invoke(app, ["eval", "trajectories", "--warehouse", str(tmp_path / "w.duckdb")])
    assert res.exit_code == 0, res.output
    assert "LCF" in res.output and "1.000" in res.output


def test_eval_comparisons_prints_the_newest_paired_report(tmp_path):
    from agenttune_lib.evaluation.paired import paired_comparison
    from agenttune_lib.evaluation.store import write_comparisons
    from agenttune_lib.warehouse import Warehouse

    path = tmp_path / "w.duckdb"
    empty = runner.invoke(app, ["eval", "comparisons", "--warehouse", str(path)])
    assert empty.exit_code != 0
    wh = Warehouse(path)
    write_comparisons(wh, "r1", "qa", [paired_comparison([0, 0, 1, 0], [1, 1, 1, 0], metric="score")], "h1", "ad1", "base:m")
    res = runner.invoke(app, ["eval", "comparisons", "--warehouse", str(path), "--adapter", "ad1"])
    assert res.exit_code == 0, res.output
    assert "qa" in res.output and "+0.500" in res.output and "MDE" in res.output
