"""The named queries Dagster's assets and checks run (agenttune_lib/warehouse/queries.py), on a real DuckDB file."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse import Provenance, Warehouse, WarehouseError
from agenttune_lib.warehouse.queries import (
    adapter_paths,
    chunk_ids,
    column_types,
    logs_written_by,
    newest_adapter_of,
    rows_by_writer,
    trajectory_versions,
)


def _log(i: int, tier: str = "light") -> EventLog:
    events = [Event(EventKind.TEXT, {"content": f"answer {i}"}, token_span=(0, 1) if tier == "full" else None)]
    return EventLog(events, tier=tier, id=f"log-{i}", token_ids=[7] if tier == "full" else None)


def test_each_query_reads_exactly_its_rows(tmp_path):
    wh = Warehouse(tmp_path / "wh.duckdb")
    assert (logs_written_by(wh, "teacher_trajectories"), adapter_paths(wh), chunk_ids(wh)) == ([], None, set())
    assert newest_adapter_of(wh, "evaluation_items", "candidate") is None
    wh.append_logs([_log(0, "full"), _log(1)], provenance=Provenance(run_id="r1", asset_key="teacher_trajectories", model_version="m1"),
                   source="teacher")
    wh.append_logs([_log(2)], provenance=Provenance(run_id="r1", asset_key="decide_runs"), source="decide")
    assert sorted(trajectory_versions(wh, "r1", source="teacher")) == [("log-0", "m1"), ("log-1", "m1")]
    assert trajectory_versions(wh, "r2", source="teacher") == []
    assert [log.id for log in logs_written_by(wh, "teacher_trajectories", tier="full")] == ["log-0"]
    assert [log.id for log in logs_written_by(wh, "teacher_trajectories")] == ["log-0", "log-1"]
    assert rows_by_writer(wh) == [("decide_runs", 1, 1), ("teacher_trajectories", 2, 2)]
    assert column_types(wh, "trajectories")[0] == ("id", "VARCHAR")

    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    wh.upsert_arrow("adapters", pa.table({"adapter_id": ["a1", "a2"], "path": ["/p1", "/p2"],
                                          "created_at": [t0, t0 + dt.timedelta(hours=1)]}), key="adapter_id")
    assert list(adapter_paths(wh).items()) == [("a2", "/p2"), ("a1", "/p1")]  # newest first
    wh.upsert_arrow("evaluation_items", pa.table({"item": [1, 2, 3], "adapter_id": ["a1", "a2", None], "model_label": ["candidate", "candidate", "base"],
                                                  "created_at": [t0, t0 + dt.timedelta(hours=1), t0 + dt.timedelta(hours=2)]}), key="item")
    assert newest_adapter_of(wh, "evaluation_items", "candidate") == "a2"
    wh.upsert_arrow("chunks", pa.table({"chunk_id": ["c1", "c2"], "doc_id": ["d", "d"]}), key="chunk_id")
    assert chunk_ids(wh) == {"c1", "c2"}


def test_a_table_name_is_an_identifier_not_sql(tmp_path):
    wh = Warehouse(tmp_path / "wh.duckdb")
    wh.upsert_arrow("evaluation_items", pa.table({"item": [1], "adapter_id": ["a"], "model_label": ["candidate"], "created_at": [1]}), key="item")
    with pytest.raises(WarehouseError, match=r"invalid table or column name 'evaluation_items; DROP TABLE trajectories'"):
        newest_adapter_of(wh, "evaluation_items; DROP TABLE trajectories", "candidate")
    with pytest.raises(WarehouseError, match=r"invalid table or column name 'x y'"):
        column_types(wh, "x y")
