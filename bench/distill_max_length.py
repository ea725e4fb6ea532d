"""Which assistant turns the distillation rows keep at a max_length, and what an adapter trained at it does on held-out QA.

Reads a home that has materialized ``teacher_trajectories`` (``agenttune materialize -s ... -s teacher_trajectories``).

    python bench/distill_max_length.py rows  --home <AGENTTUNE_HOME> --max-length 1024 1536 2048
    python bench/distill_max_length.py train --home <AGENTTUNE_HOME> --max-length 1536 --items 24 --out runs/L1536

``rows``: per teacher kind, assistant turns (tool calls vs answers) kept and dropped by the default row builder.
``train``: the default profile's distillation (30 steps, batch 4, lr 3e-3) at that max_length, then base vs adapter on
the first ``--items`` QA validation items (greedy, paired, the evaluation_report's QA settings).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _logs(home: Path):
    from transformers import AutoTokenizer

    from agenttune_lib.models.base import ensure_base_model
    from agenttune_lib.rl import distill
    from agenttune_lib.rl.lineage import latest_teacher_logs
    from agenttune_lib.warehouse import Warehouse

    info = ensure_base_model(home / "models")
    tok = AutoTokenizer.from_pretrained(info.path)
    wh = Warehouse(home / "warehouse.duckdb")
    return info, tok, wh, latest_teacher_logs(wh)


def rows(home: Path, lengths: list[int]) -> None:
    from agenttune_assets.defs.assets.train import DistillSettings
    from agenttune_lib.rl import distill

    info, tok, _, logs = _logs(home)
    d = DistillSettings()
    report = distill.filter_teacher_trajectories([distill.as_full_tier(log, tok) for log in logs], success_threshold=d.success_threshold)
    kept = report.kept[: d.max_trajectories]
    print(f"teacher logs {len(logs)}, kept {len(kept)} {report.counts}")
    for max_length in lengths:
        agg: collections.Counter = collections.Counter()
        for log in kept:
            kind = str(log.metadata.get("teacher", "?")).split(":")[0]
            _, st = distill.turn_rows(distill.clip_tool_results(log, d.max_tool_chars), tok, d.loss, max_length)
            agg[(kind, "answers")] += st["answer_turns"]
            agg[(kind, "answers dropped")] += st["answer_turns_dropped"]
            agg[(kind, "calls")] += st["turns"] - st["answer_turns"]
            agg[(kind, "calls dropped")] += st["turns_dropped"] - st["answer_turns_dropped"]
        for kind in sorted({k for k, _ in agg}):
            print(f"max_length {max_length} {kind}: answers {agg[(kind, 'answers')] - agg[(kind, 'answers dropped')]}/{agg[(kind, 'answers')]} kept, "
                  f"calls {agg[(kind, 'calls')] - agg[(kind, 'calls dropped')]}/{agg[(kind, 'calls')]} kept")


def train(home: Path, max_length: int, items: int, out: Path) -> None:
    from agenttune_assets.defs.assets.evaluate import EvaluationReportConfig
    from agenttune_assets.defs.assets.train import DistillSettings, TrainedAdapterConfig
    from agenttune_lib.evaluation.compare import ModelSpec, run_comparison
    from agenttune_lib.rag import SearchCorpusTool, load_backend
    from agenttune_lib.rag.splits import load_qa_split
    from agenttune_lib.rag.workflow import RagPaths
    from agenttune_lib.rl.train import train_adapter
    from agenttune_lib.warehouse import Warehouse

    info, _, wh, logs = _logs(home)
    cfg = TrainedAdapterConfig(distill=DistillSettings(max_steps=30, max_length=max_length, learning_rate=3e-3)).to_lib("distill", False, 0)
    t0 = time.time()
    res = train_adapter(cfg, info.path, logs, out / "adapter", log_fn=print)
    print(json.dumps({"max_length": max_length, "train_s": round(time.time() - t0), "steps": res.steps, "tokens_seen": res.tokens_seen,
                      "row_stats": res.row_stats, "loss_first_last": [res.loss_curve[0], res.loss_curve[-1]]}), flush=True)
    lib = EvaluationReportConfig(qa_limit=items, qa_max_steps=6, tau2_n_tasks=0).to_lib()
    search = SearchCorpusTool(load_backend(RagPaths.under(home / "artifacts").index, "hybrid"))
    t0 = time.time()
    report = run_comparison(Warehouse(out / "eval.duckdb"), ModelSpec("base", info.path), ModelSpec(f"L{max_length}", info.path, str(res.adapter_dir)),
                            lib, qa_items=load_qa_split(wh, "validation"), search_tool=search)
    print(f"evaluation {round(time.time() - t0)} s")
    for r in report.summary_rows():
        print(json.dumps({k: r.get(k) for k in ("suite", "metric", "n", "base", "candidate", "diff", "ci_low", "ci_high")}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["rows", "train"])
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--max-length", type=int, nargs="+", default=[1024])
    ap.add_argument("--items", type=int, default=24)
    ap.add_argument("--out", type=Path, default=Path("runs/distill_max_length"))
    args = ap.parse_args()
    if args.what == "rows":
        rows(args.home, args.max_length)
    else:
        train(args.home, args.max_length[0], args.items, args.out)


if __name__ == "__main__":
    main()
