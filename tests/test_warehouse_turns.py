"""Processes sharing one DuckDB warehouse file take turns (a sidecar flock) instead of polling DuckDB's lock."""
from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse import Warehouse, WarehouseError
from agenttune_lib.warehouse.turns import FileTurn, TurnTimeout


def _log(i: int) -> EventLog:
    return EventLog([Event(EventKind.OBSERVATION, {"content": f"task {i}"}), Event(EventKind.TEXT, {"content": f"answer {i}"}),
                     Event(EventKind.REWARD, {"value": 1.0}, scope="episode")], id=f"traj-{i}")


_HOLD = """
import sys, time
from agenttune_lib.warehouse.turns import FileTurn
turn = FileTurn(sys.argv[1])
turn.take(10)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
turn.give()
"""


def test_a_turn_waits_for_the_holder_and_times_out_with_a_clear_error(tmp_path):
    path = str(tmp_path / "w.duckdb")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, path, "1.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TurnTimeout, match="another process held the warehouse"):
            FileTurn(path).take(0.3)
        t0 = time.monotonic()
        turn = FileTurn(path)
        assert turn.take(30)  # woken when the holder lets go, not at a polling interval
        assert time.monotonic() - t0 < 10
        turn.give()
    finally:
        holder.wait(30)
    wh = Warehouse(path, lock_timeout_s=0.5)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, path, "5"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WarehouseError, match=r"cannot open warehouse .*w\.duckdb.*another process held the warehouse"):
            wh.append_logs([_log(1)])
    finally:
        holder.kill()
        holder.wait(30)
    wh.append_logs([_log(1)])  # the holder is gone (killed while holding): its turn went with it
    assert wh.get_log("traj-1") == _log(1)


def _reader(path: str, stop, started, calls) -> None:
    wh = Warehouse(path)
    wh.count("trajectories")
    started.set()
    while not stop.is_set():
        wh.count("events")
        with calls.get_lock():
            calls.value += 1


def test_readers_in_a_loop_and_a_writer_take_turns(tmp_path):
    # Two processes read the file in a tight loop while a third appends. Polling DuckDB's lock, a process finds
    # the file free only by chance (four writers and a reader took 5 to 74 s for 8 appends each, and a writer
    # once gave up after 120 s); taking turns, each waits for the others' current turns only.
    path = str(tmp_path / "w.duckdb")
    Warehouse(path).append_logs([_log(i) for i in range(2000)])
    ctx = mp.get_context("spawn")
    stop, calls = ctx.Event(), ctx.Value("i", 0)
    started = [ctx.Event(), ctx.Event()]
    readers = [ctx.Process(target=_reader, args=(path, stop, s, calls)) for s in started]
    for r in readers:
        r.start()
    rounds = []
    try:
        for s in started:
            assert s.wait(120)
        wh = Warehouse(path, lock_timeout_s=60)
        for b in range(12):
            before = calls.value
            wh.append_logs([_log(10_000 + 10 * b + k) for k in range(10)])
            rounds.append(calls.value - before)  # reader calls that finished while this append waited and ran
    finally:
        stop.set()
        for r in readers:
            r.join(60)
    assert Warehouse(path).count("trajectories") == 2120
    # Turns alternate: between two appends the readers each get in (2-3 calls here), and no append waits out
    # more than a few of their turns. Polling, whoever loops holds the file: one append waited out 231 reader
    # calls and the readers then got none in while the other eleven ran.
    median = sorted(rounds)[len(rounds) // 2]
    assert 1 <= median and max(rounds) <= 20, rounds


_FORK_THEN_DIE = """
import os, sys, time
from agenttune_lib.warehouse import Warehouse
wh = Warehouse(sys.argv[1])
cm = wh.connect()  # kept referenced: a dropped generator would run its finally and give the turn back
con = cm.__enter__()  # holds the file's turn
if os.fork() == 0:  # a child that lives on after its parent, holding whatever it inherited
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)  # let the test's pipe close when the parent exits
    time.sleep(float(sys.argv[2]))
    os._exit(0)
print("forked", flush=True)
os._exit(0)  # the parent dies holding its turn, without giving it back
"""


def test_a_forked_child_does_not_keep_a_dead_parents_turn(tmp_path):
    # A flock belongs to the open file, which fork shares: a child that kept its copy would hold the turn
    # for as long as it lives after its parent died. The child closes its copies at fork.
    path = str(tmp_path / "w.duckdb")
    Warehouse(path).append_logs([_log(1)])
    parent = subprocess.run([sys.executable, "-c", _FORK_THEN_DIE, path, "20"], capture_output=True, text=True, timeout=120)
    assert parent.stdout.strip() == "forked", parent.stderr
    t0 = time.monotonic()
    turn = FileTurn(path)
    assert turn.take(10)  # the child still sleeps; the dead parent's turn went with it
    turn.give()
    assert time.monotonic() - t0 < 10
    assert Warehouse(path, lock_timeout_s=10).get_log("traj-1") == _log(1)


def test_threads_of_one_process_share_the_turn_and_time_out_clearly(tmp_path):
    # One thread waits for the file's turn (a long timeout) while the others wait for that thread; each of
    # those stops at its own short timeout with a clear error, not when the first thread gets in.
    import threading

    path = str(tmp_path / "w.duckdb")
    Warehouse(path).append_logs([_log(1)])
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, path, "4"], stdout=subprocess.PIPE, text=True)
    errors: list[BaseException] = []
    got: list[EventLog] = []
    gave_up_after: list[float] = []

    def read(timeout_s: float) -> None:
        t0 = time.monotonic()
        try:
            got.append(Warehouse(path, lock_timeout_s=timeout_s).get_log("traj-1"))
        except WarehouseError as exc:
            gave_up_after.append(time.monotonic() - t0)
            errors.append(exc)

    try:
        assert holder.stdout.readline().strip() == "held"
        first = threading.Thread(target=read, args=(30,))
        first.start()
        time.sleep(0.3)  # the first thread is now waiting for the turn
        short = [threading.Thread(target=read, args=(0.5,)) for _ in range(2)]
        for t in short:
            t.start()
        for t in short:
            t.join(30)
        assert len(errors) == 2 and all("cannot open warehouse" in str(e) and "turn" in str(e) for e in errors), errors
        assert max(gave_up_after) < 2.5, gave_up_after  # at their own 0.5 s, not when the holder lets go at 4 s
        first.join(30)
    finally:
        holder.wait(30)
    assert got == [_log(1)]  # the first thread got in once the holder let go


def test_threads_creating_tables_on_first_use_do_not_conflict(tmp_path):
    """Threads of one process share an attachment; their first calls create the same tables at once (the served
    traffic recorder beside a sensor tick), which DuckDB refuses as a write-write conflict unless taken in turn."""
    import threading

    from agenttune_lib.service.traffic import FEEDBACK_DDL

    errors: list[BaseException] = []
    for trial in range(12):
        path = tmp_path / f"wh{trial}.duckdb"
        barrier = threading.Barrier(4)

        def first_use(i: int) -> None:
            barrier.wait()
            try:
                wh = Warehouse(path)
                wh.tables()
                with wh.connect() as con:
                    wh.create_tables(con, FEEDBACK_DDL)
                wh.upsert_arrow("t_upsert", __import__("pyarrow").table({"id": [str(i)], "v": [i]}))
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=first_use, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r[0] for r in Warehouse(path).execute("SELECT id FROM t_upsert")) == ["0", "1", "2", "3"]
    assert errors == []
