"""``agenttune lineage``: a real deployed adapter walked back to its documents, row by row, with run ids."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agenttune_lib.cli import app
from agenttune_lib.closed_loop import AdapterDeployer
from agenttune_lib.closed_loop.gate import GateDecision, record_gate_decision
from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.lineage import LineageError, adapter_lineage
from agenttune_lib.warehouse import Provenance, Warehouse


@pytest.fixture
def deployed(tmp_path):
    """Documents -> chunks -> QA items -> trajectories -> LoRA adapter -> gate decision -> deployment, through the real writers."""
    from peft import LoraConfig, get_peft_model

    from agenttune_lib.corpus import load_licensedcode, write_documents
    from agenttune_lib.models.tiny import build_tiny_model
    from agenttune_lib.rag.splits import write_qa_items
    from agenttune_lib.rag.workflow import RagPaths, run_chunks
    from agenttune_lib.rl.lineage import record_adapter

    wh = Warehouse(tmp_path / "home" / "warehouse.duckdb")
    docs = load_licensedcode(limit=3).documents
    write_documents(wh, docs, run_id="run-corpus")
    run_chunks(docs, RagPaths(tmp_path / "rag"), warehouse=wh, run_id="run-chunks")
    chunks = wh.execute("SELECT chunk_id, doc_id FROM chunks ORDER BY chunk_id")
    qa = [{"qa_id": f"qa-{i}", "split": "train", "question": f"What does clause {i} say?", "answer": "x",
           "gold_chunk_ids": [chunks[i][0]], "hops": 1, "doc_ids": [chunks[i][1]]} for i in range(3)]
    write_qa_items(wh, qa, dataset_version="v1")
    logs = [EventLog([Event(EventKind.TOOL_CALL, {"name": "search", "arguments": {"q": q["question"]}}),
                      Event(EventKind.TOOL_RESULT, {"name": "search", "content": "clause text"}),
                      Event(EventKind.TEXT, {"content": "answer"})], id=f"traj-{i}", metadata={"task": q["question"]})
            for i, q in enumerate(qa)]
    wh.append_logs(logs, [Provenance(run_id="run-teacher", asset_key="teacher_trajectories", qa_item_ids=(q["qa_id"],),
                                     chunk_ids=tuple(q["gold_chunk_ids"])) for q in qa], source="teacher")
    model, _ = build_tiny_model()
    adapter_dir = tmp_path / "adapter"
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(adapter_dir)
    record_adapter(wh, "legal-sft-1", str(adapter_dir), "tiny", "sft", [log.id for log in logs], run_id="run-train")
    decision = GateDecision("dec-1", True, "legal-sft-1", None, None, {"accuracy": {"passed": True}}, [], "2026-01-01T00:00:00+00:00")
    record_gate_decision(wh, decision, run_id="run-gate")
    root = tmp_path / "home" / "models" / "deployed"
    AdapterDeployer(root, wh).apply_decision(decision, adapter_dir, run_id="run-deploy")
    return wh, root, docs


def test_adapter_lineage_reaches_documents(deployed):
    wh, root, docs = deployed
    chain = adapter_lineage(wh, "legal-sft-1", root)
    assert chain["serving"]["adapter_id"] == "legal-sft-1" and chain["deployment"]["decision_id"] == "dec-1"
    assert chain["gate_decision"]["approved"] and chain["gate_decision"]["run_id"] == "run-gate"
    assert [t["id"] for t in chain["trajectories"]] == ["traj-0", "traj-1", "traj-2"]
    assert {q["qa_id"] for q in chain["qa_items"]} == {"qa-0", "qa-1", "qa-2"}
    assert len(chain["chunks"]) == 3
    assert {d["doc_id"] for d in chain["documents"]} <= {d.doc_id for d in docs} and chain["documents"]
    assert [(r["asset"], r["run_id"]) for r in chain["runs"]] == [
        ("deployed_adapter", "run-deploy"), ("gate_decision", "run-gate"), ("trained_adapter", "run-train"),
        ("teacher_trajectories", "run-teacher"), ("corpus_chunks", "run-chunks"), ("corpus_documents", "run-corpus")]
    assert chain["gaps"] == []
    with pytest.raises(LineageError, match="no adapter 'nope'"):
        adapter_lineage(wh, "nope")


def test_lineage_cli_text_and_json(deployed, monkeypatch):
    wh, root, docs = deployed
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("AGENTTUNE_HOME", str(root.parent.parent))
    runner = CliRunner()
    out = runner.invoke(app, ["lineage", "legal-sft-1", "--json"])
    assert out.exit_code == 0, out.output
    chain = json.loads(out.output)
    assert chain["documents"] and chain["deployment"]["adapter_id"] == "legal-sft-1"
    text = runner.invoke(app, ["lineage", "legal-sft-1"])
    assert text.exit_code == 0 and "gate decision dec-1: approved" in text.output and "documents: " in text.output
    missing = runner.invoke(app, ["lineage", "nope"])
    assert missing.exit_code == 1 and "no adapter" in missing.output


def test_lineage_joins_dagster_runs(deployed, monkeypatch, tmp_path):
    import dagster as dg

    from agenttune_assets.defs.assets.deploy import dagster_run_lineage

    with dg.instance_for_test() as instance:
        instance.add_run(dg.DagsterRun(job_name="retrain_job", run_id="run-gate", status=dg.DagsterRunStatus.SUCCESS,
                                       tags={"agenttune/trigger": "T1"}))
        got = dagster_run_lineage(["run-gate", "run-unknown"], instance)
    assert got[0]["found"] and got[0]["job"] == "retrain_job" and got[0]["tags"] == {"agenttune/trigger": "T1"}
    assert got[1] == {"run_id": "run-unknown", "found": False}


def test_console_script_joins_the_chain_to_the_dagster_instance(deployed, monkeypatch, tmp_path):
    """The installed ``agenttune`` (agenttune_assets.cli) adds the Dagster side; the library CLI alone does not."""
    import dagster as dg

    from agenttune_assets.cli import app as console_app

    wh, root, docs = deployed
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("AGENTTUNE_HOME", str(root.parent.parent))
    run_ids = [r["run_id"] for r in adapter_lineage(wh, "legal-sft-1", root)["runs"]]
    with dg.DagsterInstance.get() as instance:
        instance.add_run(dg.DagsterRun(job_name="retrain_job", run_id=run_ids[0], status=dg.DagsterRunStatus.SUCCESS))
    out = CliRunner().invoke(console_app, ["lineage", "legal-sft-1", "--json"])
    assert out.exit_code == 0, out.output
    runs = {r["run_id"]: r for r in json.loads(out.output)["dagster_runs"]}
    assert runs[run_ids[0]]["found"] and runs[run_ids[0]]["job"] == "retrain_job"
    assert all("upstream" in r for r in runs.values() if r["found"])
