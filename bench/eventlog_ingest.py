"""Events per second into the EventLog warehouse: Arrow batches vs per-row INSERT vs JSONL append + reparse,
and (with ``--agenttune-python``) side by side with AgentTune 1.1.3's EventLog and SQLite TrajectoryStore.

All paths ingest the same generated logs in one run. Usage:
    .venv/bin/python bench/eventlog_ingest.py [--events 1000000] [--baseline-events 20000]
        [--agenttune-python /work/runs/at113/bin/python --side-logs 2000 --reads 2000 --side-repeat 3]
``--agenttune-python`` is a Python 3.12 with ``pip install agenttune==1.1.3 --no-deps``; its side runs there and on
this Python (the same interpreter as ours).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse import Provenance, Warehouse, logs_to_arrow

EVENTS_PER_LOG = 50


def generate(n_events: int, prefix: str = "bench") -> list[EventLog]:
    """Realistic tool-calling episodes: observation, then reasoning/call/result triples, text, reward (ids ``prefix-i``)."""
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
        logs.append(EventLog(evs, id=f"{prefix}-{i}", metadata={"task": f"clause {i}"}))
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
    """One INSERT statement per stored row (a log with its events), in one transaction (the fair best case for
    row-at-a-time); events per second."""
    from agenttune_lib.warehouse.store import _stored_batch

    batch = _stored_batch(logs, Provenance(run_id="bench"), "bench")
    rows = list(zip(*[batch.column(c).to_pylist() for c in batch.column_names]))
    cols = ", ".join(f'"{c}"' for c in batch.column_names)
    Warehouse(path).count("trajectories")
    con = duckdb.connect(str(path))
    t0 = time.perf_counter()
    con.execute("BEGIN TRANSACTION")
    for row in rows:
        con.execute(f"INSERT INTO trajectories ({cols}) VALUES ({', '.join('?' * len(row))})", row)
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


SIDE_ROWS = [
    ("build EventLogs from Python (events/s)", "build_events_per_s", "build_events_per_s", 1.0),
    ("store from Python objects (events/s): append_logs vs TrajectoryStore.store", "store_events_per_s", "store_events_per_s", None),
    ("read by id, batched 500 ids per read_logs (logs/s) vs get_full_trajectory", "read_by_id_logs_per_s", "read_by_id_logs_per_s", 10.0),
    ("read by id, one get_log per id (logs/s) vs get_full_trajectory", "read_by_id_single_logs_per_s", "read_by_id_logs_per_s", None),
    ("to_eval_dict (logs/s)", "to_eval_dict_logs_per_s", "to_eval_dict_logs_per_s", 1.0),
    ("to_audit_records (logs/s)", "to_audit_records_logs_per_s", "to_audit_records_logs_per_s", 1.0),
    ('as_dataset_rows("sft") (logs/s)', "as_dataset_rows_sft_logs_per_s", "as_dataset_rows_sft_logs_per_s", 1.0),
    ("JSONL write + reparse, Python objects both ends (events/s)", "jsonl_write_reparse_events_per_s", "jsonl_write_reparse_events_per_s", None),
]


FLOOR_ROWS = [
    ("floor: build with plain dataclasses, no checks or copies (events/s) vs AgentTune's build", "floor_build_events_per_s", "build_events_per_s"),
    ("floor: to_eval_dict with references instead of private copies (logs/s) vs AgentTune's", "floor_to_eval_dict_logs_per_s", "to_eval_dict_logs_per_s"),
]


def side_by_side(ours: dict[str, float], same: dict[str, float], own: dict[str, float]) -> str:
    """A Markdown table: ours, AgentTune 1.1.3's on the same Python (wall and CPU-time ratios), AgentTune's on its
    own Python (the 3.12 it installs with), and the goal; then the floors of the rows below their goals."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = [f"| operation | AgentTune Platform (Python {py}) | AgentTune 1.1.3 (same Python) | ratio (wall) | ratio (CPU time) "
             "| AgentTune 1.1.3 (its Python) | ratio (wall) | goal |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]

    def ratio(a: dict[str, float], ak: str, b: dict[str, float], bk: str) -> str:
        return f"{a[ak] / b[bk]:.2f}×" if b.get(bk) and ak in a else "-"

    for label, ok, tk, goal in SIDE_ROWS:
        lines.append(f"| {label} | {ours[ok]:,.0f} | {same[tk]:,.0f} | {ratio(ours, ok, same, tk)} | "
                     f"{ratio(ours, 'cpu:' + ok, same, 'cpu:' + tk)} | {own.get(tk, float('nan')):,.0f} | {ratio(ours, ok, own, tk)} | "
                     f"{f'≥ {goal:g}×' if goal else '-'} |")
    for label, ok, tk in FLOOR_ROWS:
        if ok in ours:
            lines.append(f"| {label} | {ours[ok]:,.0f} | {same[tk]:,.0f} | {ratio(ours, ok, same, tk)} | "
                         f"{ratio(ours, 'cpu:' + ok, same, 'cpu:' + tk)} | {own.get(tk, float('nan')):,.0f} | {ratio(ours, ok, own, tk)} | - |")
    return "\n".join(lines)


def _agenttune_root(python: str) -> str:
    """The agenttune package directory of the Python it is installed in."""
    code = "import importlib.util as u; print(list(u.find_spec('agenttune').submodule_search_locations)[0])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def side_by_side_runs(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The sides of the side-by-side table, each in its own fresh process, alternating ``--side-repeat`` times.

    AgentTune's side runs twice: on the Python this bench runs on (its two stdlib-only modules loaded from its
    installed package) and on its own Python (3.12). The first compares code on one interpreter; the second is
    the package as installed. Each side imports only what it measures (ours runs apart from this process's logs
    and duckdb, whose GC traversals slowed it 1.5-2x when it ran in here). The machine may be shared: a burst of
    load hits whichever side runs then, so each figure is the best of its runs, for every side alike.
    """
    here = Path(__file__)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    sizes = ["--logs", str(args.side_logs), "--reads", str(args.reads)]
    theirs = str(here.with_name("eventlog_agenttune113.py"))
    root = _agenttune_root(args.agenttune_python)
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "agenttune_1_1_3_same_python": [], "agenttune_1_1_3": []}
    for _ in range(max(1, args.side_repeat)):
        for side, cmd, side_env in (
            ("ours", [sys.executable, str(here.with_name("eventlog_side_ours.py")), *sizes], env),
            ("agenttune_1_1_3_same_python", [sys.executable, theirs, *sizes, "--root", root], None),
            ("agenttune_1_1_3", [args.agenttune_python, theirs, *sizes], None),
        ):
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=side_env)
            runs[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {side: {k: max(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--baseline-events", type=int, default=20_000, help="events for the slow baselines")
    parser.add_argument("--agenttune-python", default=None, help="a Python with agenttune==1.1.3 installed: adds the side-by-side table")
    parser.add_argument("--side-logs", type=int, default=2000, help="logs of 50 events in the side-by-side run")
    parser.add_argument("--reads", type=int, default=2000, help="reads by id in the side-by-side run")
    parser.add_argument("--side-repeat", type=int, default=3,
                        help="side-by-side runs, the two sides alternating; each figure is the best of its runs")
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    side = side_by_side_runs(args) if args.agenttune_python else None  # first: before this process holds 1M events
    logs = generate(args.events)
    sample = logs[: max(1, args.baseline_events // EVENTS_PER_LOG)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        convert, ingest, n = bench_arrow(tmp / "arrow.duckdb", logs)
        t0 = time.perf_counter()
        end_wh = Warehouse(tmp / "append_logs.duckdb")
        end_wh.tables()
        for i in range(0, len(logs), 10_000):
            end_wh.append_logs(logs[i : i + 10_000], provenance=Provenance(run_id="bench"), source="bench")
        append_logs_s = time.perf_counter() - t0
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
        "append_logs_from_python_events_per_s": round(n / append_logs_s),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg()[0],
        "per_row_insert_events_per_s": round(row_eps),
        "jsonl_append_reparse_events_per_s": round(json_eps),
        "ratio_arrow_vs_per_row": round(arrow_eps / row_eps, 1),
        "ratio_arrow_vs_jsonl": round(arrow_eps / json_eps, 1),
    }
    if side:
        result["side_by_side"] = side
    print(json.dumps(result, indent=2))
    if side:
        print(side_by_side(side["ours"], side["agenttune_1_1_3_same_python"], side["agenttune_1_1_3"]))


if __name__ == "__main__":
    main()
