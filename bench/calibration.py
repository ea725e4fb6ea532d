"""Calibration of the packaged base model on BFCL and τ²-bench retail over seeds (seed paper §2.3, §3).

Prints per-category accuracy as mean ± std over seeds, τ² task success, the recorded
conditions, and side by side: our AST checker's accuracy vs BFCL's own checker on the very
same decoded model outputs (their ratio should be 1.00).

    .venv/bin/python bench/calibration.py --bfcl-limit 3 --tau2-limit 2 --tau2-max-steps 2 --seeds 0,1,2 --out /tmp/calibration.json
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
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--categories", default="simple_python,multiple,parallel,irrelevance")
    ap.add_argument("--bfcl-limit", type=int, default=3)
    ap.add_argument("--sample-seed", type=int, default=0)
    ap.add_argument("--tau2-split", default="test")
    ap.add_argument("--tau2-limit", type=int, default=2)
    ap.add_argument("--tau2-max-steps", type=int, default=2)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--template", default="native")
    ap.add_argument("--model", default="base", help="'base' or a checkpoint directory")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 avoids spin-waiting on a shared machine)")
    ap.add_argument("--warehouse", type=Path, default=None, help="DuckDB file to record the report in (default: $AGENTTUNE_HOME's)")
    ap.add_argument("--record-json", type=Path, default=None, help="only record a result file written earlier with --out")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)

    from _eval_helpers import load_bfcl_reference_checker, reference_verdict
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.evaluation.bfcl import BFCLDecodeError, decode_calls, load_bfcl, run_bfcl
    from agenttune_lib.evaluation.generation import load_eval_generator
    from agenttune_lib.evaluation.report_model import EvaluationConfig, build_report, write_report
    from agenttune_lib.warehouse import Warehouse
    from agenttune_lib.evaluation.settings import EvalSettings
    from agenttune_lib.evaluation.tau2 import run_tau2
    from agenttune_lib.models.base import ensure_base_model

    settings = EvalSettings(seeds=tuple(int(s) for s in args.seeds.split(",")), template_mode=args.template,
                            temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    cats = [c for c in args.categories.split(",") if c]
    config = EvaluationConfig(bfcl_categories=tuple(cats), bfcl_limit=args.bfcl_limit, bfcl_sample_seed=args.sample_seed,
                              tau2_split=args.tau2_split, tau2_limit=args.tau2_limit, tau2_max_steps=args.tau2_max_steps, settings=settings)
    if args.model == "base":
        info = ensure_base_model(PlatformPaths.from_env().ensure().models)
        path, model_id = str(info.path), f"base:{info.name}@{info.version}"
    else:
        path, model_id = args.model, f"base:{Path(args.model).name}"
    warehouse = Warehouse(args.warehouse or PlatformPaths.from_env().ensure().warehouse)

    def record(bfcl_dict: dict, tau_dict: dict) -> None:
        for item in bfcl_dict.get("items", []):
            item["output"] = item["output"][:300]
        report = build_report(model_id, model_id, config, bfcl_dict, tau_dict, model_kind="base", source="calibration")
        write_report(warehouse, report)
        print(f"recorded report {report.report_id} for {model_id} in {warehouse.path}")

    if args.record_json:
        saved = json.loads(args.record_json.read_text())
        record(saved["bfcl"], saved["tau2"])
        return
    t0 = time.perf_counter()
    generate = load_eval_generator(path)
    print(f"model {args.model} loaded in {time.perf_counter() - t0:.1f}s", flush=True)

    done = {"n": 0}

    def progress(name: str, n: int) -> None:
        done["n"] += n
        print(f"  {name}: {done['n']} generations, {time.perf_counter() - t0:.0f}s", flush=True)

    bfcl = run_bfcl(generate, cats, limit=args.bfcl_limit, settings=settings, sample_seed=args.sample_seed, progress=progress)

    ref = load_bfcl_reference_checker()
    entries = {e.id: e for c in cats for e in load_bfcl(c, limit=args.bfcl_limit, sample_seed=args.sample_seed)}
    ours = theirs = compared = 0
    for item in bfcl.items:
        entry = entries[item["id"]]
        if entry.ground_truth is None or ref is None:
            continue
        try:
            decoded = decode_calls(item["output"])
        except BFCLDecodeError:
            decoded = None
        their_ok = False if decoded is None else reference_verdict(ref, entry, decoded)
        ours += item["valid"]
        theirs += their_ok
        compared += 1

    tau = run_tau2(generate, split=args.tau2_split, limit=args.tau2_limit, settings=settings, max_steps=args.tau2_max_steps, progress=progress)

    print("\n== BFCL (accuracy, mean ± std over seeds) ==")
    for cat, agg in bfcl.categories.items():
        print(f"{cat:20s} {agg['mean']:.3f} ± {agg['std']:.3f}  per seed {agg['per_seed']}  n={bfcl.settings['n_per_category'][cat]}")
    print(f"{'overall':20s} {bfcl.overall['mean']:.3f} ± {bfcl.overall['std']:.3f}")
    if compared:
        ratio = (ours / theirs) if theirs else (1.0 if ours == 0 else float("inf"))
        print(f"ours vs BFCL's own checker on the same {compared} AST outputs: {ours} vs {theirs} correct (ratio {ratio:.2f})")
    print("\n== τ² retail ==")
    print(f"success {tau.success['mean']:.3f} ± {tau.success['std']:.3f} per seed {tau.success['per_seed']}  tasks={tau.settings['n_tasks']}")
    for m, agg in sorted(tau.trajectory.items()):
        print(f"  {m:5s} {agg['mean']:.3f} ± {agg['std']:.3f}")
    print("\n== conditions ==")
    print(json.dumps({"bfcl": {k: bfcl.settings[k] for k in ('template_mode', 'keep_thinking_history', 'system_prompt_sha256', 'seeds', 'temperature', 'max_new_tokens')},
                      "tau2": {k: tau.settings[k] for k in ('template_mode', 'keep_thinking_history', 'system_prompt_sha256', 'max_steps')}}, indent=1))
    print(f"total {time.perf_counter() - t0:.0f}s")
    if args.out:
        args.out.write_text(json.dumps({"bfcl": bfcl.to_dict(), "tau2": tau.to_dict(), "checker_agreement": {"ours": ours, "bfcl": theirs, "n": compared}},
                                       indent=1, default=str))
    record(bfcl.to_dict(), tau.to_dict())


if __name__ == "__main__":
    main()
