"""Calibration at a size that means something: every held-out suite, base model (and an adapter when given), paired intervals.

Defaults: the whole QA validation split (with the agent's search tool), the whole τ² test split
(40 tasks; the 4 whose gold state is the initial state are flagged and excluded from success),
and 50 items per BFCL category under both decoders (strict = BFCL's own, platform = the
``<tool_call>`` contract). Greedy, batched. With ``--adapter`` the adapter is compared with the
base model on the same items (diff, 95 % interval, MDE); without it, the base model alone.
Rows and comparisons go to the given warehouse (``evaluation_items`` / ``evaluation_comparisons``).

    AGENTTUNE_HOME=/work/team/home-eval .venv/bin/python bench/calibration.py \\
        --warehouse /work/team/home-eval/warehouse.duckdb --artifacts /work/team/home-eval/artifacts --out /tmp/calibration.json

``--qa-limit 40 --tau2-n 6 --tau2-max-actions 2 --bfcl-limit 0`` times the main job's evaluation for one model.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]


def _fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", type=Path, required=True, help="DuckDB file with qa_items; rows and comparisons are written here")
    ap.add_argument("--artifacts", type=Path, required=True, help="artifacts dir holding rag/index")
    ap.add_argument("--base", default="", help="converted base checkpoint (default: the packaged SmolLM2 under $AGENTTUNE_HOME/models)")
    ap.add_argument("--adapter", default="", help="PEFT adapter dir to compare with the base model")
    ap.add_argument("--qa-limit", type=int, default=-1, help="-1: the whole validation split; 0: skip QA")
    ap.add_argument("--qa-max-steps", type=int, default=6, help="the cap on each item's steps")
    ap.add_argument("--qa-fixed-steps", action="store_true", help="every QA item gets --qa-max-steps (default: one search per gold hop + the answer, capped)")
    ap.add_argument("--search-backend", default="hybrid")
    ap.add_argument("--tau2-n", type=int, default=-1, help="-1: the whole test split; 0: skip τ²; n: the n tasks with fewest gold actions")
    ap.add_argument("--tau2-max-actions", type=int, default=None)
    ap.add_argument("--bfcl-categories", default="simple_python,multiple,parallel,irrelevance")
    ap.add_argument("--bfcl-limit", type=int, default=50, help="items per category; 0 skips BFCL")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="QA/τ² turns (BFCL always gets >= 256)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None, help="torch threads")
    ap.add_argument("--dtype", default="auto", help="float32, bfloat16 or auto (bfloat16 where the hardware has it natively)")
    ap.add_argument("--min-gain", type=float, default=0.1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import torch

    from agenttune_lib.evaluation.batched import resolve_eval_dtype
    from agenttune_lib.evaluation.compare import EvalRunConfig, ModelSpec, comparison_table, run_comparison
    from agenttune_lib.evaluation.suites import BFCLSuiteConfig, QASuiteConfig, Tau2SuiteConfig, select_tau2_tasks
    from agenttune_lib.models.base import ensure_base_model
    from agenttune_lib.warehouse import Warehouse

    if args.threads:
        torch.set_num_threads(args.threads)
    home = Path(os.environ.get("AGENTTUNE_HOME", Path.home() / ".agenttune"))
    if args.base:
        base_path, base_id = args.base, f"base:{Path(args.base).name}"
    else:
        info = ensure_base_model(home / "models")
        base_path, base_id = str(info.path), f"base:{info.name}@{info.version}"
    wh = Warehouse(args.warehouse)
    qa_items, search = [], None
    if args.qa_limit != 0:
        from agenttune_lib.rag import SearchCorpusTool, load_backend
        from agenttune_lib.rag.splits import load_qa_split
        from agenttune_lib.rag.workflow import RagPaths

        qa_items = load_qa_split(wh, "validation")
        search = SearchCorpusTool(load_backend(RagPaths.under(args.artifacts).index, args.search_backend))
    tasks = None
    if args.tau2_n != 0:
        tasks = select_tau2_tasks("test", None if args.tau2_n < 0 else args.tau2_n, args.tau2_max_actions)
        if args.tau2_n < 0 and args.tau2_max_actions is None:
            from agenttune_lib.spine.tau2 import load_tau2_tasks

            tasks = load_tau2_tasks("test")  # the whole split, flagged no-op tasks included (reported separately)
    cats = tuple(c for c in args.bfcl_categories.split(",") if c)
    config = EvalRunConfig(
        qa=QASuiteConfig(max_steps=args.qa_max_steps, hop_steps=not args.qa_fixed_steps) if args.qa_limit != 0 else None, qa_limit=None if args.qa_limit < 0 else args.qa_limit,
        tau2=Tau2SuiteConfig() if args.tau2_n != 0 else None,
        bfcl=BFCLSuiteConfig(categories=cats, limit=args.bfcl_limit) if args.bfcl_limit > 0 and cats else None,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, min_gain=args.min_gain, dtype=resolve_eval_dtype(args.dtype),
    )
    t0, c0 = time.perf_counter(), time.process_time()
    log = lambda msg: print(f"[{time.perf_counter() - t0:7.1f}s wall, {time.process_time() - c0:7.1f}s cpu] {msg}", flush=True)  # noqa: E731
    # The adapter's id is its directory name, as in the warehouse's adapters table and evaluation_report's candidate id,
    # so the asset's "bfcl_latest_stored" table finds these rows.
    cand = ModelSpec(Path(args.adapter).name, base_path, args.adapter) if args.adapter else None
    report = run_comparison(wh, ModelSpec(base_id, base_path), cand, config, qa_items=qa_items, search_tool=search, tau2_tasks=tasks,
                            reuse_base=False, progress=log)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    table = comparison_table(report)
    print(f"\nreport {report.report_id}: {total:.1f}s wall, {cpu:.1f}s CPU (this process, all threads) in all; per model {json.dumps({k: round(v, 1) for k, v in report.seconds.items()})}")
    print(f"{'suite':<16}{'metric':<10}{'n':>4}{'flag':>5} {'base':>7} {'cand':>7} {'do-nothing':>11} {'diff':>7}  95% CI            MDE")
    for r in table:
        ci = "" if r["ci_low"] is None else f"[{r['ci_low']:+.1%}, {r['ci_high']:+.1%}]"
        print(f"{r['suite']:<16}{r['metric']:<10}{r['n']:>4}{r['excluded']:>5} {_fmt(r['base'])} {_fmt(r['candidate'])} {_fmt(r['do_nothing']):>11} "
              f"{_fmt(r['diff'])}  {ci:<18}{_fmt(r['mde'])}")
    per_cat = {}
    for suite, pair in report.results.items():
        for label, res in pair.items():
            if res is None:
                continue
            cats_ = res.categories() if suite.startswith("bfcl") else [None]
            per_cat[f"{suite}:{label}"] = {str(c or "all"): {"mean": res.mean("success" if suite == "tau2" else "score", c), "n": sum(1 for r in res.rows if not r.get("excluded") and (c is None or r.get("category") == c))} for c in cats_}
            extra = {m: res.mean(m) for m in ("exact_match", "containment", "doc_at_8", "searches", "action_recall", "communicate_info") if res.mean(m) is not None}
            if extra:
                per_cat[f"{suite}:{label}"]["metrics"] = extra
            print(f"  {suite}:{label}: " + ", ".join(f"{k}={v['mean']:.3f} (n={v['n']})" for k, v in per_cat[f"{suite}:{label}"].items() if k != "metrics" and v["mean"] is not None)
                  + ("  " + ", ".join(f"{k}={v:.3f}" for k, v in extra.items()) if extra else "") + f"  gen={res.config.get('policy')}")
    if args.out:
        args.out.write_text(json.dumps({"report_id": report.report_id, "seconds": total, "cpu_seconds": cpu, "per_model_seconds": report.seconds, "table": table,
                                        "comparisons": report.summary_rows(), "per_category": per_cat,
                                        "config": {s: {k: v for k, v in (p.get("base") or p.get("candidate")).config.items()} for s, p in report.results.items()}},
                                       indent=1, default=str))


if __name__ == "__main__":
    main()
