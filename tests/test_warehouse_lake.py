"""The warehouse on DuckLake: four writer processes at once lose nothing, a reader is never blocked, snapshots travel in time.

Runs on the embedded SQLite catalog and on the PostgreSQL one (the server at 127.0.0.1:5432).
"""
from __future__ import annotations

import multiprocessing as mp
import time
import uuid

import dagster as dg
import pytest

from agenttune_assets.defs.resources import WarehouseResource
from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse import Provenance, Warehouse, WarehouseError
from agenttune_lib.warehouse.lake import postgres_lake_url, sqlite_lake_url

WRITERS, BATCHES, LOGS_PER_BATCH, EVENTS_PER_LOG = 4, 8, 10, 5


def _log(writer: int, batch: int, i: int) -> EventLog:
    evs = [Event(EventKind.OBSERVATION, {"content": f"w{writer} b{batch} l{i}"})]
    evs += [Event(EventKind.TOOL_CALL, {"name": "search", "arguments": {"q": f"{writer}-{batch}-{i}-{j}"}}) for j in range(EVENTS_PER_LOG - 2)]
    evs.append(Event(EventKind.REWARD, {"value": float(i)}, scope="episode"))
    return EventLog(evs, id=f"w{writer}-b{batch}-l{i}")


def _writer(url: str, data_path: str, writer: int, start, out) -> None:
    wh = Warehouse(url, data_path=data_path)
    start.wait(60)
    t0 = time.monotonic()
    for batch in range(BATCHES):
        wh.append_logs([_log(writer, batch, i) for i in range(LOGS_PER_BATCH)], provenance=Provenance(run_id=f"writer-{writer}"))
    out.put(("writer", writer, time.monotonic() - t0))


def _reader(url: str, data_path: str, start, stop, out) -> None:
    wh = Warehouse(url, data_path=data_path)
    start.wait(60)
    counts, latencies = [], []
    while not stop.is_set():
        t0 = time.monotonic()
        counts.append(wh.count("events"))
        latencies.append(time.monotonic() - t0)
    out.put(("reader", counts, latencies))


def _get(out, procs, timeout: float):
    """The next result, failing at once (with the exit codes) when a process died before sending one."""
    import queue

    deadline = time.monotonic() + timeout
    while True:
        try:
            return out.get(timeout=1)
        except queue.Empty:
            dead = [(p.name, p.exitcode) for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise AssertionError(f"no result within {timeout} s; processes that failed: {dead}") from None


def _run(url: str, data_path: str) -> None:
    setup = Warehouse(url, data_path=data_path)
    assert setup.count("events") == 0  # creates the tables once, before the race
    ctx = mp.get_context("spawn")
    start, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(url, data_path, w, start, out)) for w in range(WRITERS)]
    reader = ctx.Process(target=_reader, args=(url, data_path, start, stop, out))
    for p in [*writers, reader]:
        p.start()
    try:
        start.set()
        results = [_get(out, writers, 600) for _ in writers]
        stop.set()
        read = _get(out, [reader], 300)
        for p in [*writers, reader]:
            p.join(60)
            assert p.exitcode == 0, (p.name, p.exitcode)
    finally:
        stop.set()
        for p in [*writers, reader]:
            if p.is_alive():
                p.kill()
                p.join(10)
    assert sorted(r[1] for r in results) == list(range(WRITERS))
    _, counts, latencies = read
    expected_logs = WRITERS * BATCHES * LOGS_PER_BATCH
    assert setup.count("trajectories") == expected_logs
    assert setup.count("events") == expected_logs * EVENTS_PER_LOG
    ids = {log.id for log in setup.read_logs()}
    assert ids == {f"w{w}-b{b}-l{i}" for w in range(WRITERS) for b in range(BATCHES) for i in range(LOGS_PER_BATCH)}
    # The reader ran throughout: it saw the table grow (reads interleaved with commits) and every read finished.
    assert len(counts) >= 3 and counts == sorted(counts) and counts[0] < expected_logs * EVENTS_PER_LOG
    slowest_writer = max(r[2] for r in results)
    assert max(latencies) < slowest_writer, (max(latencies), slowest_writer)


@pytest.mark.slow
def test_four_writer_processes_and_a_reader_on_the_sqlite_catalog(tmp_path):
    _run(sqlite_lake_url(tmp_path / "lake" / "catalog.sqlite"), str(tmp_path / "lake" / "data") + "/")


@pytest.mark.slow
@pytest.mark.postgres
def test_four_writer_processes_and_a_reader_on_the_postgres_catalog(tmp_path, pg_url):
    import psycopg2

    db = f"agenttune_lake_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{db}"')
    try:
        _run(postgres_lake_url(db), str(tmp_path / "data") + "/")
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()


def test_snapshots_read_rows_as_they_were(tmp_path):
    wh = Warehouse(sqlite_lake_url(tmp_path / "catalog.sqlite"))
    first = _log(0, 0, 0)
    wh.append_logs([first])
    snap = wh.snapshot_id()
    changed = EventLog([Event(EventKind.TEXT, {"content": "rewritten"})], id=first.id)
    wh.append_logs([changed, _log(1, 0, 0)])
    assert [log.id for log in wh.read_logs()] == [first.id, "w1-b0-l0"]  # a rewrite is a new insertion, in batch order
    assert wh.get_log(first.id) == changed
    assert wh.read_logs(snapshot=snap) == [first]
    assert wh.snapshot_id() > snap
    plain = Warehouse(tmp_path / "plain.duckdb")
    assert plain.snapshot_id() is None
    with pytest.raises(WarehouseError, match="needs a DuckLake warehouse"):
        plain.read_logs(snapshot=1)


def test_dagster_assets_and_checks_run_on_a_lake_through_the_resource(tmp_path):
    import dagster as dg

    from agenttune_assets.defs.asset_checks.warehouse import eventlog_tables_checks
    from agenttune_assets.defs.assets.warehouse import EVENTS, eventlog_tables, warehouse_eventlog_tables
    url = sqlite_lake_url(tmp_path / "lake" / "catalog.sqlite")
    resource = WarehouseResource(path=url, data_path=str(tmp_path / "files") + "/")
    resource.get().append_logs([_log(0, 0, i) for i in range(3)], provenance=Provenance(run_id="r", asset_key="teacher_trajectories", model_version="m"))
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        result = dg.materialize([eventlog_tables, eventlog_tables_checks, warehouse_eventlog_tables], instance=instance,
                                resources={"warehouse": resource})
        assert result.success
        meta = instance.get_latest_materialization_event(dg.AssetKey("eventlog_tables")).asset_materialization.metadata
        assert {r.data["table"] for r in meta["table_rows"].records} == {"trajectories", "events"}  # not the catalog's own tables
        snap = meta["warehouse_snapshot"].value
        assert snap == resource.get().snapshot_id()
        resource.get().append_logs([_log(9, 9, 9)])
        assert len(resource.get().read_logs()) == 4 and len(resource.get().read_logs(snapshot=snap)) == 3  # the rows training saw
        assert instance.get_latest_materialization_event(EVENTS).asset_materialization.metadata["dagster/row_count"].value == 15
    assert (tmp_path / "files").exists() and not (tmp_path / "ducklake:sqlite:").exists()


def _rendezvous(directory: str, writer: int, timeout_s: float = 120.0) -> None:
    """Wait until all WRITERS steps are running, so their appends overlap; a pool that ran them one at a time
    would leave the first waiting alone, and the step fails."""
    from pathlib import Path

    Path(directory, str(writer)).touch()
    deadline = time.monotonic() + timeout_s
    while len(list(Path(directory).iterdir())) < WRITERS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"writer {writer}: the other steps never started while it ran (were they serialised?)")
        time.sleep(0.05)


def _lake_writer_job():
    """Four Dagster assets that each append EventLogs to the lake, with no pool: the multiprocess executor runs them at once."""
    import dagster as dg

    def make(writer: int):
        @dg.asset(name=f"lake_writer_{writer}")
        def _asset(warehouse: WarehouseResource) -> dg.MaterializeResult:
            wh = warehouse.get()
            _rendezvous(os.environ["AGENTTUNE_TEST_LAKE_RENDEZVOUS"], writer)
            for batch in range(BATCHES):
                wh.append_logs([_log(writer, batch, i) for i in range(LOGS_PER_BATCH)], provenance=Provenance(run_id=f"dagster-{writer}"))
            return dg.MaterializeResult(metadata={"logs": BATCHES * LOGS_PER_BATCH})

        return _asset

    import os

    resource = WarehouseResource(path=os.environ["AGENTTUNE_TEST_LAKE_URL"], data_path=os.environ["AGENTTUNE_TEST_LAKE_DATA"])
    defs = dg.Definitions(assets=[make(w) for w in range(WRITERS)], resources={"warehouse": resource},
                          jobs=[dg.define_asset_job("lake_writers", executor_def=dg.multiprocess_executor.configured({"max_concurrent": WRITERS}))])
    return defs.resolve_job_def("lake_writers")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def lake(request, tmp_path):
    """(url, data path) of a fresh lake on the SQLite catalog or on the PostgreSQL one (a new database, dropped after)."""
    if request.param == "sqlite":
        yield sqlite_lake_url(tmp_path / "lake" / "catalog.sqlite"), str(tmp_path / "lake" / "data") + "/"
        return
    import psycopg2

    request.getfixturevalue("pg_url")
    db = f"agenttune_lake_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{db}"')
    try:
        yield postgres_lake_url(db), str(tmp_path / "data") + "/"
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()


@pytest.mark.slow
def test_four_dagster_steps_write_the_lake_at_once_without_a_pool(tmp_path, monkeypatch, lake):
    import dagster as dg

    url, data = lake
    monkeypatch.setenv("AGENTTUNE_TEST_LAKE_URL", url)
    monkeypatch.setenv("AGENTTUNE_TEST_LAKE_DATA", data)
    (tmp_path / "rendezvous").mkdir()
    monkeypatch.setenv("AGENTTUNE_TEST_LAKE_RENDEZVOUS", str(tmp_path / "rendezvous"))
    Warehouse(url, data_path=data).count("events")
    (tmp_path / "dagster").mkdir()
    ctx = mp.get_context("spawn")
    start, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_reader, args=(url, data, start, stop, out))
    reader.start()
    try:
        with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
            from pathlib import Path

            # Step processes rebuild the job by importing this module from the tests directory.
            job = dg.build_reconstructable_job("test_warehouse_lake", "_lake_writer_job", reconstructor_working_directory=str(Path(__file__).parent))
            start.set()
            t0 = time.monotonic()
            result = dg.execute_job(job, instance=instance)
            run_seconds = time.monotonic() - t0
            assert result.success
            stats = instance.get_run_step_stats(result.run_id)
        stop.set()
        _, counts, latencies = _get(out, [reader], 300)
        reader.join(60)
    finally:
        stop.set()
        if reader.is_alive():
            reader.kill()
    assert len(stats) == WRITERS
    # The steps overlapped in time: the last one started before the first one finished (no pool serialised them).
    assert max(s.start_time for s in stats) < min(s.end_time for s in stats)
    wh = Warehouse(url, data_path=data)
    assert wh.count("trajectories") == WRITERS * BATCHES * LOGS_PER_BATCH
    assert wh.count("events") == WRITERS * BATCHES * LOGS_PER_BATCH * EVENTS_PER_LOG
    # A reader counted throughout the run: it saw the tables grow, and no read waited for the writers to finish.
    assert len(counts) >= 3 and counts == sorted(counts) and counts[0] < WRITERS * BATCHES * LOGS_PER_BATCH * EVENTS_PER_LOG
    assert max(latencies) < run_seconds, (max(latencies), run_seconds)


def test_an_adapter_records_its_snapshot_and_lineage_shows_its_rows_as_they_were(tmp_path):
    import json

    from typer.testing import CliRunner

    from agenttune_lib.cli import app
    from agenttune_lib.lineage import adapter_lineage
    from agenttune_lib.rl.lineage import record_adapter

    url = sqlite_lake_url(tmp_path / "lake" / "catalog.sqlite")
    wh = Warehouse(url)
    teacher = Provenance(run_id="teacher-run", asset_key="teacher_trajectories", model_version="m")
    logs = [_log(0, 0, i) for i in range(3)]
    wh.append_logs(logs, provenance=teacher)
    snap = wh.snapshot_id()
    record_adapter(wh, "adapter-1", str(tmp_path / "a1"), "base", "distill", [log.id for log in logs], run_id="train-run", warehouse_snapshot=snap)
    # After training, a later run rewrites one of the rows the adapter learned from.
    wh.append_logs([logs[0]], provenance=Provenance(run_id="later-run", asset_key="teacher_trajectories", model_version="m2"))

    chain = adapter_lineage(wh, "adapter-1")
    assert chain["adapter"]["warehouse_snapshot"] == snap and chain["as_of_snapshot"] == snap
    assert {t["id"]: t["run_id"] for t in chain["trajectories"]} == {log.id: "teacher-run" for log in logs}  # as read, not as now
    assert chain["changed_since_training"] == [logs[0].id]
    assert any(f"after snapshot {snap}" in g for g in chain["gaps"])
    out = CliRunner().invoke(app, ["lineage", "adapter-1", "--json", "--no-dagster", "--warehouse", url])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["as_of_snapshot"] == snap


def test_a_new_column_reaches_a_table_written_before_it(tmp_path):
    import pyarrow as pa

    from agenttune_lib.rl.lineage import record_adapter

    wh = Warehouse(tmp_path / "wh.duckdb")
    record_adapter(wh, "old", str(tmp_path / "a"), "base", "distill", ["t1"])
    wh.execute("ALTER TABLE adapters DROP COLUMN warehouse_snapshot")  # an adapters table written before the column existed
    record_adapter(wh, "new", str(tmp_path / "b"), "base", "distill", ["t2"], warehouse_snapshot=7)
    assert wh.execute("SELECT adapter_id, warehouse_snapshot FROM adapters ORDER BY adapter_id") == [("new", 7), ("old", None)]
    with pytest.raises(WarehouseError, match=r"columns \['typo'\] are not in the stored table"):
        wh.upsert_arrow("adapters", pa.table({"adapter_id": ["x"], "typo": [1]}), key="adapter_id")


def test_a_lake_with_a_separate_events_table_is_moved_into_rows_losslessly(lake):
    # A lake written before events were stored in their trajectory's row: the first Warehouse to open it moves
    # them in one transaction; older snapshots still read as they were.
    from _warehouse_helpers import write_old_tables

    from agenttune_lib.warehouse import logs_to_arrow
    from agenttune_lib.warehouse.lake import open_lake

    url, data = lake
    logs = [_log(0, 0, i) for i in range(3)]
    traj, events = logs_to_arrow(logs)
    con = open_lake(url, data)
    con.execute("USE lake")
    write_old_tables(con, traj, events)
    before = con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()[0]
    con.close()
    wh = Warehouse(url, data_path=data)
    assert wh.read_logs() == logs
    assert wh.count("events") == 3 * EVENTS_PER_LOG
    assert wh.read_logs(snapshot=before) == logs  # a snapshot from before the move reads its events table
