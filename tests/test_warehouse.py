"""The EventLog warehouse: lossless round trip, idempotency, two writing processes, lineage."""
from __future__ import annotations

import json
import multiprocessing as mp
import pickle
import re

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse import Provenance, Warehouse, WarehouseError
from test_events import event_logs


def _log(i: int, n: int = 4, tier: str = "light") -> EventLog:
    evs = [Event(EventKind.OBSERVATION, {"content": f"task {i}"})]
    evs += [Event(EventKind.TOOL_CALL, {"name": "search", "arguments": {"q": f"{i}-{j}"}}) for j in range(n - 2)]
    evs.append(Event(EventKind.REWARD, {"value": float(i)}, scope="episode"))
    return EventLog(evs, tier=tier, id=f"traj-{i}", metadata={"task": f"task {i}"})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(event_logs(), min_size=1, max_size=5))
def test_round_trip_is_lossless(tmp_path_factory, logs):
    wh = Warehouse(tmp_path_factory.mktemp("wh") / "w.duckdb")
    wh.append_logs(logs, source="prop")
    back = {log.id: log for log in wh.read_logs()}
    assert set(back) == {log.id for log in logs}
    for log in logs:
        assert back[log.id] == log


def test_idempotent_on_trajectory_id(warehouse):
    warehouse.append_logs([_log(1), _log(2)])
    changed = _log(1, n=6)
    warehouse.append_logs([changed])
    assert warehouse.count("trajectories") == 2
    assert warehouse.count("events") == 6 + 4
    assert warehouse.get_log("traj-1") == changed


def test_duplicate_ids_in_one_batch_keep_the_last(warehouse):
    first, second = _log(1), _log(1, n=5)
    warehouse.append_logs([first, second])
    assert warehouse.count("trajectories") == 1
    assert warehouse.get_log("traj-1") == second


def test_missing_id_is_a_clear_key_error(warehouse):
    warehouse.append_logs([_log(1)])
    with pytest.raises(KeyError, match="nope"):
        warehouse.get_log("nope")


def test_failed_write_loses_nothing(warehouse):
    warehouse.append_logs([_log(1)])
    with pytest.raises(WarehouseError, match="provenance"):
        warehouse.append_logs([_log(2), _log(3)], provenance=[Provenance()])
    assert [log.id for log in warehouse.read_logs()] == ["traj-1"]


def test_provenance_columns_and_lineage_queries(warehouse):
    warehouse.upsert_arrow("documents", pa.table({"doc_id": ["d1"], "source": ["licensedcode"], "path": ["a.LICENSE"], "title": ["A"]}), key="doc_id")
    warehouse.upsert_arrow("chunks", pa.table({"chunk_id": ["c1", "c2"], "doc_id": ["d1", "d1"]}), key="chunk_id")
    warehouse.upsert_arrow(
        "qa_items", pa.table({"qa_id": ["q1"], "split": ["train"], "gold_chunk_ids": [["c1", "c2"]], "run_id": ["run-rag"]}), key="qa_id"
    )
    prov = Provenance(run_id="run-7", asset_key="teacher_trajectories", model_version="smollm2@abc", qa_item_ids=("q1",))
    warehouse.append_logs([_log(1), _log(2)], provenance=prov, source="spine")
    lineage = warehouse.trajectory_lineage("traj-1")
    assert lineage["trajectory"]["run_id"] == "run-7"
    assert lineage["trajectory"]["model_version"] == "smollm2@abc"
    assert [q["qa_id"] for q in lineage["qa_items"]] == ["q1"]
    assert sorted(c["chunk_id"] for c in lineage["chunks"]) == ["c1", "c2"]
    assert [d["doc_id"] for d in lineage["documents"]] == ["d1"]
    written = warehouse.written_by_run("run-7")
    assert written == {"trajectories": ["traj-1", "traj-2"]}
    assert warehouse.written_by_run("run-rag") == {"qa_items": ["q1"]}
    assert [log.id for log in warehouse.read_logs(run_id="run-7", source="spine")] == ["traj-1", "traj-2"]


def test_upsert_rejects_bad_names_and_unknown_columns(warehouse):
    with pytest.raises(WarehouseError, match="invalid table"):
        warehouse.upsert_arrow("x; drop table events", pa.table({"id": [1]}))
    warehouse.upsert_arrow("things", pa.table({"id": [1], "v": ["a"]}))
    with pytest.raises(WarehouseError, match="not in the stored table"):
        warehouse.upsert_arrow("things", pa.table({"id": [2], "w": ["b"]}))
    assert warehouse.execute("SELECT id, v FROM things") == [(1, "a")]


def test_pickles_as_a_path(warehouse):
    warehouse.append_logs([_log(1)])
    clone = pickle.loads(pickle.dumps(warehouse))
    assert clone.path == warehouse.path and clone.get_log("traj-1") == _log(1)


def _writer(path: str, worker: int, batches: int, per_batch: int, barrier) -> None:
    wh = Warehouse(path)
    barrier.wait()
    for b in range(batches):
        logs = [_log(worker * 100_000 + b * per_batch + i) for i in range(per_batch)]
        wh.append_logs(logs, provenance=Provenance(run_id=f"worker-{worker}"), source="concurrent")


@pytest.mark.slow
def test_two_processes_append_at_once_and_lose_nothing(tmp_path):
    path = str(tmp_path / "w.duckdb")
    Warehouse(path).append_logs([_log(0)])
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(path, w, 15, 20, barrier)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0, 0]
    wh = Warehouse(path)
    assert wh.count("trajectories") == 1 + 2 * 15 * 20
    assert wh.count("events") == 4 * (1 + 2 * 15 * 20)
    assert len(wh.written_by_run("worker-1")["trajectories"]) == 300
    assert len(wh.written_by_run("worker-2")["trajectories"]) == 300


# ---------------------------------------------------------------- the EventLog contract on every path in
def test_append_logs_names_input_that_is_not_an_eventlog(warehouse):
    with pytest.raises(WarehouseError, match=r"append_logs: item 0 is a str \('x'\), not an EventLog"):
        warehouse.append_logs(["x"])
    with pytest.raises(WarehouseError, match=r"append_logs: item 1 is a dict"):
        warehouse.append_logs([_log(1), {"id": "t"}])
    with pytest.raises(WarehouseError, match=r"append_logs takes a list of EventLogs, got a EventLog"):
        warehouse.append_logs(_log(1))
    assert warehouse.count("trajectories") == 0


def _arrow(logs):
    from agenttune_lib.warehouse import logs_to_arrow

    return logs_to_arrow(logs, Provenance(run_id="r"), "arrow")


def _replace(table: pa.Table, column: str, values) -> pa.Table:
    idx = table.column_names.index(column)
    return table.set_column(idx, table.schema.field(column), pa.array(values, type=table.schema.field(column).type))


@pytest.mark.parametrize(
    "column, mutate, problem",
    [
        ("trajectory_id", lambda v: ["traj-9"] + v[1:], "events naming trajectories not in this batch: [('traj-9',)]"),
        ("kind", lambda v: ["shout"] + v[1:], "unknown event kinds: [('shout',)]"),
        ("scope", lambda v: [None] * len(v), "REWARD events without a scope"),
        ("scope", lambda v: ["turn"] + v[1:], "or a scope on another kind"),
        ("seq", lambda v: [0, 0] + v[2:], "event seq not 0..n_events-1"),
        ("span_end", lambda v: [2, 9, 4], "token spans outside 0 <= start <= end <= len(token_ids)"),
        ("span_start", lambda v: [0, 1, 2], "overlapping or out-of-order token spans"),
    ],
)
def test_append_arrow_enforces_the_contract(warehouse, column, mutate, problem):
    full = EventLog(
        [Event(EventKind.TEXT, {"content": "a"}, token_span=(0, 2)), Event(EventKind.TOOL_CALL, {"name": "f", "arguments": {}}, token_span=(2, 3)),
         Event(EventKind.TEXT, {"content": "b"}, token_span=(3, 4)), Event(EventKind.REWARD, {"value": 1.0}, scope="episode")],
        tier="full", id="traj-1", token_ids=[5, 6, 7, 8],
    )
    traj, events = _arrow([full])
    if column.startswith("span"):
        spans = events.column(column).to_pylist()
        bad = mutate(spans) + spans[3:]
    else:
        bad = mutate(events.column(column).to_pylist())
    with pytest.raises(WarehouseError, match=re.escape(problem)) as err:
        warehouse.append_arrow(traj, _replace(events, column, bad))
    assert str(err.value).startswith("append_arrow rejected the batch: ")
    assert warehouse.count("events") == 0
    warehouse.append_arrow(traj, events)  # the untouched batch is accepted
    assert warehouse.get_log("traj-1") == full


def test_read_logs_returns_insertion_order(warehouse):
    warehouse.append_logs([_log(7), _log(2), _log(9)])
    warehouse.append_logs([_log(1)])
    assert [log.id for log in warehouse.read_logs()] == ["traj-7", "traj-2", "traj-9", "traj-1"]
    assert [log.id for log in warehouse.read_logs(ids=["traj-1", "traj-9", "traj-7"])] == ["traj-7", "traj-9", "traj-1"]


def test_read_logs_rebuilds_rows_stored_out_of_seq_order(warehouse):
    # read_logs scans without ORDER BY and falls back to a sorted read when a trajectory's rows are not in
    # seq order: rows appended through append_arrow in reverse (and interleaved) must still come back right.
    from agenttune_lib.warehouse import logs_to_arrow

    logs = [_log(i, n=6) for i in range(3)]
    traj, events = logs_to_arrow(logs)
    order = sorted(range(events.num_rows), key=lambda r: (-events.column("seq")[r].as_py(), r))
    warehouse.append_arrow(traj, events.take(pa.array(order)))
    assert warehouse.read_logs() == logs
    assert warehouse.read_logs(ids=["traj-2", "traj-0"]) == [logs[0], logs[2]]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(event_logs(), min_size=0, max_size=4))
def test_logs_to_arrow_columns_match_the_logs(logs):
    # logs_to_arrow builds columns in bulk (one pass over the events, numpy for ids and seqs, rewards from the
    # REWARD events only): each column must still say what the logs say.
    from agenttune_lib.warehouse import logs_to_arrow

    logs = list({log.id: log for log in logs}.values())
    traj, events = logs_to_arrow(logs)
    assert traj.column("reward_total").to_pylist() == [float(sum(log.rewards())) if log.rewards() else None for log in logs]
    assert traj.column("reward_episode").to_pylist() == [log.rewards("episode")[-1] if log.rewards("episode") else None for log in logs]
    rows = events.to_pylist()
    expected = [(log.id, i, ev.kind.value, ev.scope, ev.author, list(ev.token_span) if ev.token_span else [None, None],
                 list(ev.logprobs) if ev.logprobs is not None else None)
                for log in logs for i, ev in enumerate(log)]
    assert [(r["trajectory_id"], r["seq"], r["kind"], r["scope"], r["author"], [r["span_start"], r["span_end"]], r["logprobs"])
            for r in rows] == expected


def test_read_logs_keeps_integers_beyond_64_bits_in_stored_payloads(warehouse):
    # A payload written through append_arrow may hold an integer orjson would read back as a float.
    from agenttune_lib.warehouse import logs_to_arrow

    traj, events = logs_to_arrow([_log(1)])
    payloads = events.column("payload").to_pylist()
    payloads[0] = '{"big":123456789012345678901,"content":"task 1"}'
    events = events.set_column(events.schema.get_field_index("payload"), "payload", pa.array(payloads, pa.string()))
    warehouse.append_arrow(traj, events)
    assert warehouse.get_log("traj-1")[0].payload == {"big": 123456789012345678901, "content": "task 1"}


def test_bulk_reads_in_several_threads_leave_the_collector_as_they_found_it():
    import gc
    import threading

    from agenttune_lib.warehouse.store import _gc_paused

    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with _gc_paused():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with _gc_paused():
            b_in.set()
            a_out.wait(10)
            seen["inside_b_after_a_left"] = gc.isenabled()

    assert gc.isenabled()
    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"inside_b_after_a_left": False} and gc.isenabled()
    gc.disable()
    try:
        with _gc_paused():
            pass
        assert not gc.isenabled()  # a caller that turned the collector off keeps it off
    finally:
        gc.enable()


# ---------------------------------------------------------------- events stored in their trajectory's row
def test_each_log_is_one_row_and_the_events_view_gives_one_row_per_event(warehouse):
    logs = [_log(1), _log(2, n=5)]
    warehouse.append_logs(logs)
    assert warehouse.execute("SELECT table_type FROM information_schema.tables WHERE table_name = 'events' "
                             "AND table_catalog = current_database()") == [("VIEW",)]
    rows = warehouse.execute("SELECT trajectory_id, seq, kind, payload, scope FROM events ORDER BY trajectory_id, seq")
    expected = [(log.id, i, e.kind.value, e.payload, e.scope) for log in logs for i, e in enumerate(log)]
    assert [(t, s, k, json.loads(p), sc) for t, s, k, p, sc in rows] == expected


def test_a_read_of_one_id_looks_its_row_up_in_the_id_index(warehouse):
    # get_log filters on equality, which DuckDB answers from the ART index on trajectories.id instead of
    # scanning every id and decoding the token_ids list segment: it stays flat as the table grows.
    warehouse.append_logs([_log(i) for i in range(1, 40)])
    assert warehouse.get_log("traj-7") == _log(7)
    with warehouse.connect() as con:
        plan = con.execute("EXPLAIN ANALYZE SELECT t.id, t.events FROM (SELECT *, rowid AS _row FROM trajectories) t "
                           "WHERE t.id = 'traj-7'").fetchall()[0][1]
    assert "Index Scan" in plan


def test_a_warehouse_with_a_separate_events_table_is_moved_into_rows_losslessly(tmp_path):
    # A warehouse written before events were stored in their trajectory's row: the first connection moves them
    # (payload text kept exactly, an integer beyond 64 bits included) and leaves the events view in the table's place.
    import duckdb

    from _warehouse_helpers import write_old_tables

    from agenttune_lib.warehouse import logs_to_arrow

    full = EventLog([Event(EventKind.TEXT, {"content": "a"}, token_span=(0, 2), logprobs=[-0.5, -0.25]),
                     Event(EventKind.REWARD, {"value": 1.0}, scope="episode", author="judge")],
                    tier="full", id="full-1", token_ids=[1, 2])
    logs = [_log(1), full, EventLog([], id="empty-1")]
    traj, events = logs_to_arrow(logs)
    payloads = events.column("payload").to_pylist()
    payloads[0] = '{"big":123456789012345678901,"content":"task 1"}'
    events = _replace(events, "payload", payloads)
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    write_old_tables(con, traj, events)
    before = con.execute("SELECT * FROM events ORDER BY trajectory_id, seq").fetchall()
    con.close()
    wh = Warehouse(path)
    back = {log.id: log for log in wh.read_logs()}
    assert back["traj-1"][0].payload == {"big": 123456789012345678901, "content": "task 1"}
    assert back["full-1"] == full and back["empty-1"] == logs[2] and list(back) == ["traj-1", "full-1", "empty-1"]
    after = wh.execute("SELECT * FROM events ORDER BY trajectory_id, seq")
    assert [(r[0], r[1], r[2], json.loads(r[3]), *r[4:]) for r in after] == [(r[0], r[1], r[2], json.loads(r[3]), *r[4:]) for r in before]
    assert wh.execute("SELECT table_name, table_type FROM information_schema.tables WHERE table_catalog = current_database() "
                      "AND table_name IN ('events', 'trajectories') ORDER BY 1") == [("events", "VIEW"), ("trajectories", "BASE TABLE")]
    # and it gains the id index a read by id looks rows up with
    assert wh.execute("SELECT table_name, expressions FROM duckdb_indexes() WHERE index_name = 'trajectories_id' "
                      "AND database_name = current_database()") == [("trajectories", "[id]")]


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda d: d["payload"].pop(), "have 4 kinds and 3 payloads"),
        (lambda d: d["kind"].__setitem__(1, "shout"), "an event of unknown kind 'shout'"),
        (lambda d: d["payload"].__setitem__(0, [1]), "a stored payload is not a JSON object"),
        (lambda d: d.__setitem__("scope", ["episode"]), "stored 'scope' holds 1 values for 4 events"),
        (lambda d: d.pop("kind"), "stored events need 'kind' and 'payload' lists"),
    ],
)
def test_stored_events_edited_by_hand_are_a_clear_error(warehouse, edit, problem):
    warehouse.append_logs([_log(1), _log(2)])
    stored = json.loads(warehouse.execute("SELECT events FROM trajectories WHERE id = 'traj-2'")[0][0])
    edit(stored)
    warehouse.execute("UPDATE trajectories SET events = ? WHERE id = 'traj-2'", [json.dumps(stored)])
    with pytest.raises(WarehouseError, match=re.escape(f"trajectory 'traj-2'") + ".*" + re.escape(problem)):
        warehouse.read_logs()
    assert warehouse.get_log("traj-1") == _log(1)  # the other rows still read


def test_a_call_holds_the_file_only_while_it_runs(tmp_path):
    # The file is attached to this process's DuckDB for the length of a call: between calls another process
    # opens it (it could not while a connection was held); calls in several threads share the attachment.
    import subprocess
    import sys
    import threading

    wh = Warehouse(tmp_path / "w.duckdb")
    wh.append_logs([_log(1)])
    probe = [sys.executable, "-c", f"import duckdb; print(duckdb.connect({str(wh.path)!r}).execute('SELECT count(*) FROM trajectories').fetchone()[0])"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "1"
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for j in range(5):
                wh.append_logs([_log(100 * k + j)])
                assert wh.get_log(f"traj-{100 * k + j}") == _log(100 * k + j)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and wh.count("trajectories") == 21
    with wh.connect() as con:  # held: another process waits for the lock
        held = subprocess.run(probe, capture_output=True, text=True)
        assert held.returncode != 0 and "lock" in held.stderr
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "21"


def test_non_finite_logprobs_come_back_exactly_on_both_write_paths(warehouse):
    # JSON has no infinity: a logprob of -inf (a token the sampler could not have drawn) is stored as a string.
    from agenttune_lib.warehouse import logs_to_arrow

    def full(tid):
        return EventLog([Event(EventKind.TEXT, {"content": "a"}, token_span=(0, 3), logprobs=[-0.5, float("-inf"), -1e-300])],
                        tier="full", id=tid, token_ids=[1, 2, 3])

    warehouse.append_logs([full("a")])
    warehouse.append_arrow(*logs_to_arrow([full("b")]))
    for tid in ("a", "b"):
        assert warehouse.get_log(tid) == full(tid)
    assert warehouse.execute("SELECT logprobs FROM events ORDER BY trajectory_id") == [([-0.5, float("-inf"), -1e-300],)] * 2
