"""The Dagster skeleton: definitions load, foundation assets materialize, the Postgres instance works."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import dagster as dg
import pytest

from agenttune_assets.defs.assets.corpus import corpus_documents
from agenttune_assets.defs.assets.warehouse import eventlog_tables
from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, WarehouseResource
from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse import Provenance, Warehouse

REPO = Path(__file__).resolve().parents[1]


def _resources(tmp_path: Path) -> dict:
    return {
        "warehouse": WarehouseResource(path=str(tmp_path / "w.duckdb")),
        "models": ModelsResource(path=str(tmp_path / "models")),
        "artifacts": ArtifactsResource(path=str(tmp_path / "artifacts")),
    }


def test_definitions_load_through_workspace_module():
    from agenttune_assets.definitions import defs, get_main_job

    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"corpus_documents", "eventlog_tables"} <= keys
    groups = {spec.key.to_user_string(): spec.group_name for spec in defs.resolve_all_asset_specs()}
    assert groups["corpus_documents"] == "corpus" and groups["eventlog_tables"] == "collect"
    assert get_main_job().name == "main_job"
    assert {"warehouse", "models", "artifacts"} <= set(defs.resources)


def test_corpus_and_eventlog_tables_land_in_duckdb(tmp_path):
    Warehouse(tmp_path / "w.duckdb").append_logs(
        [EventLog([Event(EventKind.TEXT, {"content": "x"})], id="t1")], provenance=Provenance(run_id="earlier"), source="spine"
    )
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = dg.materialize(
            [corpus_documents, eventlog_tables],
            instance=instance,
            resources=_resources(tmp_path),
            run_config={"ops": {"corpus_documents": {"config": {"limit": 5}}}},
        )
        assert result.success
        wh = Warehouse(tmp_path / "w.duckdb")
        assert wh.count("documents") == 5
        cats = {r[0] for r in wh.execute("SELECT DISTINCT category FROM documents")}
        assert cats == {"Commercial"}
        assert wh.execute("SELECT count(*) FROM documents WHERE run_id = ?", [result.run_id]) == [(5,)]
        event = instance.get_latest_materialization_event(dg.AssetKey("corpus_documents"))
        meta = event.asset_materialization.metadata
        assert meta["documents"].value == 5
        assert isinstance(meta["by_category"], dg.TableMetadataValue)
        tables = instance.get_latest_materialization_event(dg.AssetKey("eventlog_tables")).asset_materialization.metadata
        assert tables["trajectories"].value == 1
        assert {r.data["table"] for r in tables["table_rows"].records} >= {"trajectories", "events", "documents"}
        assert "dagster/column_schema" in tables


def test_byo_folder_bad_files_are_named_and_the_rest_ingested(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "good.txt").write_text("The Supplier shall deliver the Goods within thirty days.")
    (folder / "notes.md").write_text("# Heading\n\nConfidential information must not be disclosed.")
    (folder / "empty.txt").write_text("")
    (folder / "blob.txt").write_bytes(b"\x00\x01\x02binary")
    (folder / "latin1.txt").write_bytes("Vertragsk\xfcndigung".encode("latin-1"))
    (folder / "docs.json").write_text('{"documents": [{"title": "A", "text": "Term of five years."}, {"title": "B", "text": "   "}]}')
    (folder / "image.png").write_bytes(b"\x89PNG")
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = dg.materialize(
            [corpus_documents],
            instance=instance,
            resources=_resources(tmp_path),
            run_config={"ops": {"corpus_documents": {"config": {"folder": str(folder), "include_licensedcode": False}}}},
        )
        assert result.success
        meta = instance.get_latest_materialization_event(dg.AssetKey("corpus_documents")).asset_materialization.metadata
    assert meta["documents"].value == 3
    skipped = meta["skipped"].value
    for name, reason in [("empty.txt", "empty file"), ("blob.txt", "binary"), ("latin1.txt", "not UTF-8"), ("docs.json#1", "no text"), ("image.png", "unsupported")]:
        assert name in skipped and reason in skipped


def test_empty_corpus_fails_with_the_reason_and_keeps_stored_documents(tmp_path):
    resources = _resources(tmp_path)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        assert dg.materialize([corpus_documents], instance=instance, resources=resources, run_config={"ops": {"corpus_documents": {"config": {"limit": 2}}}}).success
        empty = tmp_path / "empty"
        empty.mkdir()
        (empty / "a.txt").write_text("  ")
        result = dg.materialize(
            [corpus_documents], instance=instance, resources=resources, raise_on_error=False,
            run_config={"ops": {"corpus_documents": {"config": {"folder": str(empty), "include_licensedcode": False}}}},
        )
        assert not result.success
        failure = result.get_step_failure_events()[0].step_failure_data.error
        assert "corpus is empty" in failure.to_string() and "a.txt" in failure.to_string()
    assert Warehouse(tmp_path / "w.duckdb").count("documents") == 2


@pytest.mark.postgres
def test_postgres_instance_records_and_reads_back_a_materialization(tmp_path, pg_url, monkeypatch):
    import psycopg2

    db = f"agenttune_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{db}"')
    try:
        home = tmp_path / "pg_home"
        home.mkdir()
        shutil.copyfile(REPO / "agenttune_assets" / "instance" / "postgres.yaml", home / "dagster.yaml")
        for key, value in {"AGENTTUNE_PG_HOST": "127.0.0.1", "AGENTTUNE_PG_PORT": "5432", "AGENTTUNE_PG_USER": "postgres", "AGENTTUNE_PG_PASSWORD": "", "AGENTTUNE_PG_DB": db}.items():
            monkeypatch.setenv(key, value)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            result = dg.materialize(
                [corpus_documents], instance=instance, resources=_resources(tmp_path),
                run_config={"ops": {"corpus_documents": {"config": {"limit": 3}}}},
            )
            assert result.success
        with dg.DagsterInstance.from_config(str(home)) as reopened:
            event = reopened.get_latest_materialization_event(dg.AssetKey("corpus_documents"))
            assert event is not None and event.run_id == result.run_id
            assert event.asset_materialization.metadata["documents"].value == 3
            assert reopened.get_run_by_id(result.run_id).is_success
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()


def test_prepare_dagster_home_selects_instance_by_environment(tmp_path, monkeypatch):
    from agenttune_assets.instance import prepare_dagster_home

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("AGENTTUNE_HOME", str(tmp_path))
    monkeypatch.chdir(REPO)
    home = prepare_dagster_home()
    assert home == tmp_path / "dagster" and "storage:" not in (home / "dagster.yaml").read_text()
    monkeypatch.delenv("DAGSTER_HOME")
    monkeypatch.setenv("AGENTTUNE_INSTANCE", "postgres")
    home = prepare_dagster_home()
    assert home == tmp_path / "dagster-postgres" and "postgresql+psycopg2" in (home / "dagster.yaml").read_text()
    assert os.environ["DAGSTER_HOME"] == str(home)
    monkeypatch.delenv("DAGSTER_HOME")
    monkeypatch.setenv("AGENTTUNE_INSTANCE", "oracle")
    with pytest.raises(ValueError, match="AGENTTUNE_INSTANCE"):
        prepare_dagster_home()
