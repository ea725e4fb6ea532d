"""The warehouse on one DuckDB file vs on DuckLake (SQLite catalog), side by side in one run.

What a user calls, on both: ``append_logs`` from one process, batched ``read_logs(ids=…)`` and ``get_log`` per id,
then four writer processes appending at once while a reader process counts events (its per-read latency shows
whether reads wait for writers). Same generated logs on both sides.

    .venv/bin/python bench/warehouse_lake.py [--logs 4000] [--writers 4] [--batches 8] [--batch-logs 50]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from eventlog_ingest import EVENTS_PER_LOG, generate  # noqa: E402

from agenttune_lib.events import EventLog  # noqa: E402
from agenttune_lib.warehouse import Provenance, Warehouse  # noqa: E402
from agenttune_lib.warehouse.lake import sqlite_lake_url  # noqa: E402



def make_logs(n: int, prefix: str) -> list[EventLog]:
    """``n`` tool-calling episodes of 50 events, the ingest bench's shape."""
    return generate(n * EVENTS_PER_LOG, prefix)


def _writer(path: str, data: str | None, writer: int, batches: int, batch_logs: int, start, out) -> None:
    wh = Warehouse(path, data_path=data)
    logs = make_logs(batches * batch_logs, f"w{writer}")
    wh.count("events")  # connected (and, on a lake, attached) before the clock starts
    start.wait(120)
    t0 = time.perf_counter()
    for b in range(batches):
        wh.append_logs(logs[b * batch_logs:(b + 1) * batch_logs], provenance=Provenance(run_id=f"writer-{writer}"))
    out.put(("writer", writer, time.perf_counter() - t0))


def _reader(path: str, data: str | None, start, stop, out) -> None:
    wh = Warehouse(path, data_path=data)
    wh.count("events")
    start.wait(120)
    lat = []
    while not stop.is_set():
        t0 = time.perf_counter()
        wh.count("events")
        lat.append(time.perf_counter() - t0)
    out.put(("reader", lat))


def concurrent(path: str, data: str | None, writers: int, batches: int, batch_logs: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    start, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, data, w, batches, batch_logs, start, out)) for w in range(writers)]
    reader = ctx.Process(target=_reader, args=(path, data, start, stop, out))
    for p in [*procs, reader]:
        p.start()
    time.sleep(5.0)  # let every process import, build its logs and connect before the clock starts
    t0 = time.perf_counter()
    start.set()
    done = [out.get(timeout=1800) for _ in procs]
    wall = time.perf_counter() - t0
    stop.set()
    _, lat = out.get(timeout=600)
    for p in [*procs, reader]:
        p.join(60)
    n_events = writers * batches * batch_logs * EVENTS_PER_LOG
    stored = Warehouse(path, data_path=data).count("events")
    assert stored == n_events, (stored, n_events)
    return {"wall_s": wall, "events_per_s": n_events / wall, "slowest_writer_s": max(d[2] for d in done),
            "reads": len(lat), "read_p50_ms": 1000 * statistics.median(lat), "read_max_ms": 1000 * max(lat)}


def single(path: str, data: str | None, logs: list[EventLog], reads: int) -> dict[str, float]:
    wh = Warehouse(path, data_path=data)
    wh.count("events")
    t0 = time.perf_counter()
    for i in range(0, len(logs), 100):
        wh.append_logs(logs[i:i + 100], provenance=Provenance(run_id="bench"))
    append = len(logs) * EVENTS_PER_LOG / (time.perf_counter() - t0)
    ids = [logs[(i * 7919) % len(logs)].id for i in range(reads)]
    t0 = time.perf_counter()
    got = 0
    for i in range(0, len(ids), 500):
        got += len(wh.read_logs(ids=ids[i:i + 500]))
    batched = got / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in ids[:100]:
        wh.get_log(i)
    per_id = 100 / (time.perf_counter() - t0)
    return {"append_events_per_s": append, "read_batched_logs_per_s": batched, "get_log_per_s": per_id}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", type=int, default=4000)
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--batch-logs", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logs = make_logs(args.logs, "bench")
    res: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"duckdb file": (str(Path(tmp) / "file" / "warehouse.duckdb"), None),
                 "ducklake (sqlite catalog)": (sqlite_lake_url(Path(tmp) / "lake" / "catalog.sqlite"), str(Path(tmp) / "lake" / "data") + "/")}
        for name, (path, data) in sides.items():
            res[name] = single(path, data, logs, args.reads)
        for name, (path, data) in sides.items():
            c_path = path.replace("warehouse.duckdb", "concurrent.duckdb").replace("catalog.sqlite", "concurrent.sqlite")
            res[name].update({f"concurrent_{k}": v for k, v in concurrent(c_path, data and data + "c/", args.writers, args.batches, args.batch_logs).items()})
    print(f"load average at the end: {os.getloadavg()}")
    keys = list(next(iter(res.values())))
    print(f"| measure | {' | '.join(res)} | lake / file |")
    print("|---|" + "---:|" * (len(res) + 1))
    a, b = res["duckdb file"], res["ducklake (sqlite catalog)"]
    for k in keys:
        print(f"| {k} | {a[k]:,.1f} | {b[k]:,.1f} | {b[k] / a[k]:.2f}x |")
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
