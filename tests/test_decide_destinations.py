"""Destinations dispatched after a run: a JSONL file, the DuckDB warehouse, and the real PostgreSQL server."""
import json
import uuid

import pytest

from _decide_helpers import schema_model
from agenttune_lib.decide import DestinationRouter, GraphRunner, PostgresDestination, verify_audit

# Audit keys, head checkpoints and artifacts go to a per-test $AGENTTUNE_HOME.
pytestmark = pytest.mark.usefixtures("platform_home")

PG_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


def _runner(tmp_path, destinations):
    return GraphRunner.from_template(
        "generic/sentiment", model=schema_model(), audit=tmp_path / "audit.jsonl", destinations=destinations,
        destination_base=tmp_path, warehouse_path=tmp_path / "wh.duckdb",
    )


def test_file_and_duckdb_destinations_write_after_the_run(tmp_path):
    runner = _runner(tmp_path, [{"type": "file", "path": "out/decisions.jsonl"}, {"type": "duckdb", "table": "decide_decisions"}])
    states = [runner.run({"text": "great"}), runner.run({"text": "fine"})]
    rows = [json.loads(x) for x in (tmp_path / "out" / "decisions.jsonl").read_text().splitlines()]
    assert [r["run_id"] for r in rows] == [s.run_id for s in states]
    assert rows[0]["label"] == states[0].verdict["label"] and rows[0]["path"][-1] == "positive_out"
    from agenttune_lib.warehouse import Warehouse

    got = Warehouse(tmp_path / "wh.duckdb").execute("SELECT run_id, label, confidence, template_id FROM decide_decisions ORDER BY created_at")
    assert [g[0] for g in got] == [s.run_id for s in states] and got[0][3] == "generic/sentiment"
    assert all(d["ok"] for s in states for d in s.destinations)
    last = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()][-1]
    assert last["destinations"] == [{"type": "file", "ok": True, "error": None}, {"type": "duckdb", "ok": True, "error": None}]


def test_a_failing_destination_is_reported_and_loses_nothing(tmp_path):
    runner = _runner(tmp_path, [{"type": "postgres", "url": "postgresql+psycopg2://postgres@127.0.0.1:1/none"}, {"type": "file", "path": "d.jsonl"}])
    state = runner.run({"text": "ok"})
    assert state.status == "completed"
    assert state.destinations[0]["ok"] is False and "OperationalError" in state.destinations[0]["error"]
    assert state.destinations[1]["ok"] is True and (tmp_path / "d.jsonl").exists()
    assert verify_audit(tmp_path / "audit.jsonl", warehouse=tmp_path / "wh.duckdb").ok
    env = _runner(tmp_path, [{"type": "postgres", "url": "$AGENTTUNE_NO_SUCH_VAR"}]).run({"text": "x"})
    assert env.destinations[0]["ok"] is False and "AGENTTUNE_NO_SUCH_VAR" in env.destinations[0]["error"]


def test_unknown_destination_type_is_named(tmp_path):
    with pytest.raises(Exception, match="unknown destination type 'ftp'"):
        DestinationRouter([{"type": "ftp"}], base_dir=tmp_path)


@pytest.mark.postgres
def test_postgres_destination_writes_real_rows(tmp_path, pg_url):
    """Uses conftest's ``pg_url``: fails, not skips, when AGENTTUNE_PG_REQUIRED=1 and the server is unreachable."""
    import sqlalchemy

    table = f"decide_test_{uuid.uuid4().hex[:10]}"
    runner = _runner(tmp_path, [{"type": "postgres", "url": pg_url, "table": table}])
    dest = PostgresDestination(pg_url, table=table)
    try:
        states = [runner.run({"text": "love it"}), runner.run({"text": "meh"})]
        assert all(d["ok"] for s in states for d in s.destinations), [s.destinations for s in states]
        with dest.engine().connect() as con:
            rows = con.execute(sqlalchemy.text(f"SELECT run_id, template_id, label, confidence, record->>'status' FROM {table} ORDER BY created_at")).fetchall()
        assert [r[0] for r in rows] == [s.run_id for s in states]
        assert rows[0][1] == "generic/sentiment" and rows[0][2] == states[0].verdict["label"] and rows[0][4] == "completed"
        # idempotent on run_id: writing the same decision again updates, never duplicates
        dest.write({"run_id": states[0].run_id, "template_id": "generic/sentiment", "label": "relabelled", "status": "completed"})
        with dest.engine().connect() as con:
            n, label = con.execute(sqlalchemy.text(f"SELECT count(*), max(label) FILTER (WHERE run_id = :r) FROM {table}"), {"r": states[0].run_id}).fetchone()
        assert n == 2 and label == "relabelled"
    finally:
        with dest.engine().begin() as con:
            con.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS {table}"))
        dest.dispose()


def test_postgres_table_names_are_checked():
    with pytest.raises(Exception, match="not a plain SQL identifier"):
        PostgresDestination(PG_URL, table="x; DROP TABLE y")


def test_template_destinations_dispatch_under_the_artifacts_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTTUNE_HOME", str(tmp_path / "home"))
    runner = GraphRunner.from_template("bfsi/loan_approval", model=schema_model(), audit=None, human_review_timeout=0.0)
    assert runner.config.destinations == [{"type": "file", "path": "decisions/loan_approval.jsonl"}]
    state = runner.run(runner.config.examples[0])
    out = tmp_path / "home" / "artifacts" / "decide" / "decisions" / "loan_approval.jsonl"
    row = json.loads(out.read_text())
    assert row["run_id"] == state.run_id and "Sara Kim" not in out.read_text()


def test_bad_destination_spec_is_rejected_at_load(tmp_path):
    from agenttune_lib.decide import ConfigLoader, TemplateError

    (tmp_path / "t.yaml").write_text("destinations: [{type: s3}]\nstages:\n  - {id: a, type: output, verdict: {label: x}}\n")
    with pytest.raises(TemplateError, match="template 't'.*file, duckdb or postgres"):
        ConfigLoader(tmp_path).load("t")
