"""The gate's generative DECIDE replay, baseline and candidate in turn vs at once in two processes, on a finished home.

Replays what ``gate_decision`` replays (the held-out sample of the home's DECIDE audit, ``gate_holdout_size`` 48)
with the base model as baseline and the home's newest adapter as candidate, once with ``replay_workers=1`` and once
with 2 (the default), in the order given by ``--order``. Prints each arm's seconds, the ratio, and whether the
outcomes are equal case for case.

    .venv/bin/python bench/gate_replay.py --home <run dir>/.agenttune
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, required=True, help="a home where `agenttune materialize` has run")
    ap.add_argument("--holdout", type=int, default=48)
    ap.add_argument("--order", default="1,2", help="replay_workers values, in the order run")
    args = ap.parse_args()

    from agenttune_lib.closed_loop.service import base_checkpoint, candidate_adapter, gate_replay_cases, replay_arms
    from agenttune_lib.warehouse import Warehouse

    home = args.home.resolve()
    wh = Warehouse(home / "warehouse.duckdb")
    cand = candidate_adapter(wh)
    base = base_checkpoint(cand["base_model"], cand["path"])
    cases = gate_replay_cases(sorted(home.rglob("audit.jsonl")), [], args.holdout)
    print(f"{len(cases)} held-out cases; baseline {base.name}, candidate {cand['adapter_id']}", flush=True)
    results, seconds = {}, {}
    for workers in (int(w) for w in args.order.split(",")):
        t0 = time.perf_counter()
        results[workers] = replay_arms(base, None, cand["path"], cases, workers)
        seconds[workers] = round(time.perf_counter() - t0, 1)
        print(f"replay_workers={workers}: {seconds[workers]} s", flush=True)
    first, *rest = results.values()
    verdicts = {w: [sum(bool(o["verdict_correct"]) for o in arm) for arm in r] for w, r in results.items()}
    print(json.dumps({"cases": len(cases), "seconds": seconds, "in_turn_over_at_once": round(seconds[1] / seconds[2], 2) if 1 in seconds and 2 in seconds else None,
                      "outcomes_equal": all(r == first for r in rest), "correct_verdicts_old_new": verdicts}, indent=1))


if __name__ == "__main__":
    main()
