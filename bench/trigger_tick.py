"""One RetrainingTrigger tick at 1k / 100k / 1M buffered failures: maintained counters vs a full SQL aggregate vs a Python scan.

The buffer is filled through ``TrainingBuffer.add`` (the product path that maintains the
counters); then one evaluation of all six conditions is timed three ways over the same rows:

* ours      — ``RetrainingTrigger.evaluate(buffer.stats(con))``: the state row plus the distinct-cause rows;
* sql_agg   — the same figures recomputed by a GROUP BY over every buffered row, then evaluated;
* py_scan   — every buffered row fetched into Python and counted, then evaluated.

and the whole sensor tick as the daemon runs it (``evaluate_trigger_sensor`` with a Dagster
instance and the Dagster resources, buffer state from the state file the buffer publishes):

* tick_same — the cursor is at the current buffer version (the common tick: nothing new);
* tick_eval — no cursor: all six conditions evaluated, none holds (thresholds set out of reach).

Usage: .venv/bin/python bench/trigger_tick.py [--sizes 1000 100000 1000000] [--causes 5]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agenttune_lib.closed_loop import RetrainingTrigger, TrainingBuffer  # noqa: E402
from agenttune_lib.closed_loop.types import TrainingExample  # noqa: E402
from agenttune_lib.warehouse import Warehouse  # noqa: E402

CAUSES5 = ("wrong_tool", "wrong_routing", "incomplete_reasoning", "hallucinated_output", "loop_collapse")


def fill(buf: TrainingBuffer, n: int, n_causes: int, batch: int = 50_000) -> float:
    causes = CAUSES5 if n_causes <= 5 else tuple(f"cause_{i}" for i in range(n_causes))
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        exs = [
            TrainingExample(
                example_id=f"e{i}", failure_id=f"f{i}", trajectory_id=f"t{i}",
                root_cause=causes[0] if i % 10 < 7 else causes[i % len(causes)],
                prompt=[], chosen="c", rejected="r", accepted=(i % 3 != 0), source=f"s{i % 97}",
            )
            for i in range(start, min(n, start + batch))
        ]
        buf.add(exs)
    return time.perf_counter() - t0


def timed(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sql_aggregate_stats(con, buf: TrainingBuffer, base):
    rows = con.execute(
        "SELECT root_cause, count(*), count(*) FILTER (WHERE accepted) FROM training_buffer WHERE buffer = ? GROUP BY 1",
        [buf.name],
    ).fetchall()
    return _from_counts(base, {c: n for c, n, _ in rows}, sum(a for _, _, a in rows))


def python_scan_stats(con, buf: TrainingBuffer, base):
    rows = con.execute("SELECT root_cause, accepted FROM training_buffer WHERE buffer = ?", [buf.name]).fetchall()
    counts = Counter(c for c, _ in rows)
    return _from_counts(base, dict(counts), sum(1 for _, a in rows if a))


def _from_counts(base, counts, accepted):
    size = sum(counts.values())
    leader, leader_n = max(counts.items(), key=lambda kv: kv[1], default=(None, 0))
    return dataclasses.replace(base, size=size, accepted=accepted, counts=counts, leader_cause=leader, leader_n=leader_n)


def sensor_ticks(wh: Warehouse, buf: TrainingBuffer, reps: int = 50) -> tuple[float, float]:
    """Median ms of a whole T1 sensor tick: (cursor at the current version, no cursor)."""
    import json

    import dagster as dg

    from agenttune_assets.defs.resources import ClosedLoopResource, WarehouseResource
    from agenttune_assets.defs.sensors import evaluate_trigger_sensor

    res_wh = WarehouseResource(path=wh.path)
    out_of_reach = 10**12
    cl = ClosedLoopResource(buffer=buf.name, capacity=buf.capacity, min_buffer=out_of_reach, min_accepted=out_of_reach,
                            novel_min_count=out_of_reach, dominance_ratio=1.0, staleness_hours=1e6, max_drop_rate=1.0)
    with dg.instance_for_test() as instance:
        cursor = json.dumps({"version": buf.cached_stats().version})
        same = timed(lambda: evaluate_trigger_sensor("T1", instance, cursor, res_wh, cl), reps)
        fresh = timed(lambda: evaluate_trigger_sensor("T1", instance, None, res_wh, cl), reps)
        result = evaluate_trigger_sensor("T1", instance, None, res_wh, cl)
        assert not result.run_requests, "the bench's thresholds must keep every condition false"
    return same, fresh


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    ap.add_argument("--causes", type=int, default=5)
    args = ap.parse_args()
    trigger = RetrainingTrigger()
    print(f"{'buffered':>10} {'causes':>6} {'fill s':>7} {'ours ms':>9} {'ours+connect ms':>15} {'sql_agg ms':>10} {'py_scan ms':>10} {'sql/ours':>8} {'scan/ours':>9} {'tick_same ms':>12} {'tick_eval ms':>12}")
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            wh = Warehouse(Path(tmp) / "bench.duckdb")
            buf = TrainingBuffer(wh, capacity=max(n, 1))
            fill_s = fill(buf, n, args.causes)
            fresh = timed(lambda: trigger.evaluate(buf.stats()), 10)
            with wh.connect() as con:
                base = buf.stats(con)
                ours_d = trigger.evaluate(base)
                agg_d = trigger.evaluate(sql_aggregate_stats(con, buf, base))
                scan_d = trigger.evaluate(python_scan_stats(con, buf, base))
                same = [f.trigger for f in ours_d.firings] == [f.trigger for f in agg_d.firings] == [f.trigger for f in scan_d.firings]
                assert same and base.size == n, "the three paths disagree"
                ours = timed(lambda: trigger.evaluate(buf.stats(con)), 200)
                agg = timed(lambda: trigger.evaluate(sql_aggregate_stats(con, buf, base)), 10)
                scan = timed(lambda: trigger.evaluate(python_scan_stats(con, buf, base)), 3 if n >= 1_000_000 else 10)
            tick_same, tick_eval = sensor_ticks(wh, buf)
            print(f"{n:>10} {args.causes:>6} {fill_s:>7.1f} {ours * 1e3:>9.3f} {fresh * 1e3:>15.2f} {agg * 1e3:>10.2f} {scan * 1e3:>10.1f} "
                  f"{agg / ours:>8.1f} {scan / ours:>9.1f} {tick_same * 1e3:>12.2f} {tick_eval * 1e3:>12.2f}", flush=True)


if __name__ == "__main__":
    main()
