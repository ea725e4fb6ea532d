"""``agenttune materialize``: the console script runs the main job on the embedded default instance."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from agenttune_lib.warehouse import Warehouse

REPO = Path(__file__).resolve().parents[1]


def test_materialize_selected_assets_records_runs_in_the_platform_instance(tmp_path):
    env = {**os.environ, "AGENTTUNE_HOME": str(tmp_path)}
    env.pop("DAGSTER_HOME", None)
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "agenttune_assets.cli", "materialize", "-s", "corpus_documents", "--json", str(report)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["success"] and [s["step"] for s in data["steps"]] == ["corpus_documents"]
    assert Warehouse(tmp_path / "warehouse.duckdb").count("documents") == 111
    with dg.DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
        run = instance.get_run_by_id(data["run_id"])
        assert run.is_success and run.job_name == "main_job"
        assert instance.get_latest_materialization_event(dg.AssetKey("corpus_documents")).run_id == data["run_id"]


def test_materialize_reports_an_unknown_asset_key(tmp_path):
    env = {**os.environ, "AGENTTUNE_HOME": str(tmp_path)}
    env.pop("DAGSTER_HOME", None)
    proc = subprocess.run(
        [sys.executable, "-m", "agenttune_assets.cli", "materialize", "-s", "no_such_asset"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    assert proc.returncode == 2 and "unknown asset key(s) ['no_such_asset']" in proc.stderr
