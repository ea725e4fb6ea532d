"""``Warehouse.get_log`` (one id per call) as the trajectories table grows, with the id index and without it.

Both warehouses hold the same full-tier logs (bench/eventlog_side_ours.py's episodes); the baseline is the same
file with its ``trajectories_id`` index dropped (the design before the index), measured in the same run.
Usage: .venv/bin/python bench/get_log_scaling.py [--sizes 2000 20000 40000] [--reads 200]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from eventlog_side_ours import generate_full  # noqa: E402

from agenttune_lib.warehouse import Provenance, Warehouse  # noqa: E402


def _ms_per_get_log(wh: Warehouse, ids: list[str]) -> float:
    for i in ids[:5]:  # warm: the first call attaches, loads the catalog and the index
        wh.get_log(i)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for i in ids:
            wh.get_log(i)
        best = min(best, (time.perf_counter() - t0) / len(ids) * 1000)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000, 40000])
    parser.add_argument("--reads", type=int, default=200)
    args = parser.parse_args()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        indexed, scanned = Warehouse(Path(tmp) / "indexed.duckdb"), Warehouse(Path(tmp) / "scanned.duckdb")
        have = 0
        for size in sorted(args.sizes):
            logs = generate_full(size - have)
            for log in logs:
                log.id = f"{log.id}-{size}"
            for wh in (indexed, scanned):
                wh.append_logs(logs, provenance=Provenance(run_id="bench"))
            scanned.execute("DROP INDEX IF EXISTS trajectories_id")
            have = size
            ids = [logs[(i * 7919) % len(logs)].id for i in range(args.reads)]
            with_index, without = _ms_per_get_log(indexed, ids), _ms_per_get_log(scanned, ids)
            out.append({"logs": size, "get_log_ms_with_index": round(with_index, 3), "get_log_ms_without_index": round(without, 3),
                        "speedup": round(without / with_index, 2)})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
