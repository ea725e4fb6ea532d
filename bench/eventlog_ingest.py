"""Events per second into the EventLog warehouse: Arrow batches vs per-row INSERT vs JSONL append + reparse.

All three ingest the same generated logs in one run. Usage:
    .venv/bin/python bench/eventlog_ingest.py [--events 1000000] [--baseline-events 20000]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import duckdb

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse import Provenance, Warehouse, logs_to_arrow

EVENTS_PER_LOG = 50


def generate(n_events: int) -> list[EventLog]:
    """Realistic tool-calling episodes: observation, then reasoning/call/result triples, text, reward."""
    logs = []
    for i in range(max(1, n_events // EVENTS_PER_LOG)):
        evs = [Event(EventKind.OBSERVATION, {"content": f"Find clause {i} in the agreement."})]
        j = 0
        while len(evs) < EVENTS_PER_LOG - 2:
            evs.append(Event(EventKind.REASONING, {"content": f"Search step {j} for clause {i}."}))
            evs.append(Event(EventKind.TOOL_CALL, {"name": "search_corpus", "arguments": {"query": f"clause {i} part {j}", "k": 8}, "id": f"c{j}"}))
            evs.append(Event(EventKind.TOOL_RESULT, {"name": "search_corpus", "content": f"[chunk {i}-{j}] The licensee shall ...", "id": f"c{j}"}))
            j += 1
        evs = evs[: EVENTS_PER_LOG - 2]
        evs.append(Event(EventKind.TEXT, {"content": f"Clause {i} is in section {i % 17}."}))
        evs.append(Event(EventKind.REWARD, {"value": (i % 5) / 4}, scope="episode"))
        logs.append(EventLog(evs, id=f"bench-{i}", metadata={"task": f"clause {i}"}))
    return logs


def bench_arrow(path: Path, logs: list[EventLog], batch_logs: int = 10_000) -> tuple[float, float, int]:
    """(conversion seconds, ingest seconds, events) for Arrow-batch appends."""
    wh = Warehouse(path)
    with wh.connect():
        pass
    t0 = time.perf_counter()
    batches = [logs_to_arrow(logs[i : i + batch_logs], Provenance(run_id="bench"), "bench") for i in range(0, len(logs), batch_logs)]
    convert = time.perf_counter() - t0
    t0 = time.perf_counter()
    for traj, events in batches:
        wh.append_arrow(traj, events)
    ingest = time.perf_counter() - t0
    n = wh.count("events")
    return convert, ingest, n


def bench_per_row(path: Path, logs: list[EventLog]) -> tuple[float, int]:
    """One INSERT statement per event row, in one transaction (the fair best case for row-at-a-time)."""
    traj, events = logs_to_arrow(logs, Provenance(run_id="bench"), "bench")
    rows = list(zip(*[events.column(c).to_pylist() for c in events.column_names]))
    Warehouse(path).count("events")
    con = duckdb.connect(str(path))
    t0 = time.perf_counter()
    con.execute("BEGIN TRANSACTION")
    for row in rows:
        con.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
    con.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    n = con.execute("SELECT count(*) FROM events").fetchone()[0]
    con.close()
    return elapsed, n


def bench_jsonl(path: Path, logs: list[EventLog]) -> tuple[float, int]:
    """Append each log as a JSON line, then reparse the file back into EventLogs."""
    t0 = time.perf_counter()
    with path.open("a") as fh:
        for log in logs:
            fh.write(log.to_json() + "\n")
    with path.open() as fh:
        back = [EventLog.from_json(line) for line in fh]
    elapsed = time.perf_counter() - t0
    return elapsed, sum(len(b) for b in back)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--baseline-events", type=int, default=20_000, help="events for the slow baselines")
    args = parser.parse_args()
    logs = generate(args.events)
    sample = logs[: max(1, args.baseline_events // EVENTS_PER_LOG)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        convert, ingest, n = bench_arrow(tmp / "arrow.duckdb", logs)
        per_row_s, n_row = bench_per_row(tmp / "rows.duckdb", sample)
        jsonl_s, n_json = bench_jsonl(tmp / "logs.jsonl", sample)
    arrow_eps = n / ingest
    row_eps = n_row / per_row_s
    json_eps = n_json / jsonl_s
    result = {
        "events": n,
        "arrow_ingest_events_per_s": round(arrow_eps),
        "eventlog_to_arrow_events_per_s": round(n / convert),
        "end_to_end_events_per_s": round(n / (convert + ingest)),
        "per_row_insert_events_per_s": round(row_eps),
        "jsonl_append_reparse_events_per_s": round(json_eps),
        "ratio_arrow_vs_per_row": round(arrow_eps / row_eps, 1),
        "ratio_arrow_vs_jsonl": round(arrow_eps / json_eps, 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
