"""Which assistant turns the distillation rows keep at a max_length, and what an adapter trained at it does on held-out QA.

Reads a home that has materialized ``teacher_trajectories`` (``agenttune materialize -s ... -s teacher_trajectories``).

    python bench/distill_max_length.py rows  --home <AGENTTUNE_HOME> --max-length 1024 1536 2048
    python bench/distill_max_length.py train --home <AGENTTUNE_HOME> --max-length 1536 --items 24 --out runs/L1536
    python bench/distill_max_length.py evaluate --home <AGENTTUNE_HOME> --adapter <dir> --items 24 --bfcl 40 --out runs/x

``rows``: per teacher kind, assistant turns (tool calls vs answers) kept and dropped by the default row builder.
``train``: the default profile's distillation (30 steps, batch 4, lr 3e-3, LoRA r 8 on the top 4 blocks; ``--steps``,
``--learning-rate``, ``--lora-top-layers``, ``--lora-r``, ``--no-tool-repeat`` change one) at that max_length, then base
vs adapter on the first ``--items`` QA validation items (greedy, paired, the evaluation_report's QA settings).
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


def train(home: Path, max_length: int, items: int, out: Path, steps: int = 30, learning_rate: float = 3e-3,
          lora_top_layers: int = 4, lora_r: int = 8, bfcl: int = 0, no_tool_repeat: int = 1,
          no_tool_kinds: tuple[str, ...] = (), answer_weight: float = 1.0) -> None:
    from agenttune_assets.defs.assets.train import DistillSettings, TrainedAdapterConfig
    from agenttune_lib.rl.train import _is_no_tool, train_adapter

    info, _, wh, logs = _logs(home)
    no_tool = [log for log in logs if _is_no_tool(log)]
    cfg = TrainedAdapterConfig(lora_top_layers=lora_top_layers, lora_r=lora_r, distill=DistillSettings(
        max_steps=steps, max_length=max_length, learning_rate=learning_rate, no_tool_repeats=no_tool_repeat,
        no_tool_repeat_kinds=list(no_tool_kinds), answer_weight=answer_weight)).to_lib("distill", False, 0)
    t0 = time.time()
    res = train_adapter(cfg, info.path, logs, out / "adapter", log_fn=print)
    print(json.dumps({"max_length": max_length, "steps_cfg": steps, "learning_rate": learning_rate, "lora_top_layers": lora_top_layers,
                      "lora_r": lora_r, "no_tool_repeat": no_tool_repeat, "no_tool_kinds": list(no_tool_kinds), "answer_weight": answer_weight, "no_tool_logs": len(no_tool), "train_s": round(time.time() - t0),
                      "steps": res.steps, "tokens_seen": res.tokens_seen,
                      "row_stats": res.row_stats, "loss_first_last": [res.loss_curve[0], res.loss_curve[-1]]}), flush=True)
    evaluate(home, res.adapter_dir, items, out, bfcl)


def evaluate(home: Path, adapter: Path, items: int, out: Path, bfcl: int = 0, final_answer: bool = False) -> None:
    """Base vs ``adapter`` on the first ``items`` QA validation items and, with ``bfcl``, that many BFCL irrelevance and
    simple_python items (the platform arm the gate's guards read)."""
    from agenttune_assets.defs.assets.evaluate import EvaluationReportConfig
    from agenttune_lib.evaluation.compare import ModelSpec, run_comparison
    from agenttune_lib.rag import SearchCorpusTool, load_backend
    from agenttune_lib.rag.splits import load_qa_split
    from agenttune_lib.rag.workflow import RagPaths
    from agenttune_lib.warehouse import Warehouse

    info, _, wh, _ = _logs(home)
    lib = EvaluationReportConfig(qa_limit=items, qa_max_steps=6, tau2_n_tasks=0, bfcl_limit=bfcl, qa_final_answer_turn=final_answer,
                                 bfcl_categories=["irrelevance", "simple_python"] if bfcl else []).to_lib()
    search = SearchCorpusTool(load_backend(RagPaths.under(home / "artifacts").index, "hybrid"))
    t0 = time.time()
    report = run_comparison(Warehouse(out / "eval.duckdb"), ModelSpec("base", info.path), ModelSpec(out.name, info.path, str(adapter)),
                            lib, qa_items=load_qa_split(wh, "validation"), search_tool=search)
    print(f"evaluation {round(time.time() - t0)} s")
    for r in report.summary_rows():
        print(json.dumps({k: r.get(k) for k in ("suite", "metric", "n", "base", "candidate", "diff", "ci_low", "ci_high")}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["rows", "train", "evaluate"])
    ap.add_argument("--adapter", type=Path, help="evaluate: the adapter directory (adapter_config.json)")
    ap.add_argument("--final-answer", action="store_true", help="evaluate: ask for the answer before each QA item's last step")
    ap.add_argument("--bfcl", type=int, default=0, help="train/evaluate: also this many BFCL irrelevance and simple_python items")
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--max-length", type=int, nargs="+", default=[1024])
    ap.add_argument("--items", type=int, default=24)
    ap.add_argument("--out", type=Path, default=Path("runs/distill_max_length"))
    ap.add_argument("--steps", type=int, default=30, help="train: optimizer steps (the default profile's 30)")
    ap.add_argument("--learning-rate", type=float, default=3e-3)
    ap.add_argument("--lora-top-layers", type=int, default=4, help="train: LoRA on the top N blocks (0: every block)")
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--no-tool-repeat", type=int, default=1, help="train: each no-tool episode this many times in the rows")
    ap.add_argument("--no-tool-kinds", nargs="*", default=[], help="train: repeat only these no-tool kinds (default: all)")
    ap.add_argument("--answer-weight", type=float, default=1.0, help="train: multiply the weight of answers written after a tool result")
    args = ap.parse_args()
    if args.what == "rows":
        rows(args.home, args.max_length)
    elif args.what == "evaluate":
        evaluate(args.home, args.adapter, args.items, args.out, args.bfcl, args.final_answer)
    else:
        train(args.home, args.max_length[0], args.items, args.out, args.steps, args.learning_rate, args.lora_top_layers,
              args.lora_r, args.bfcl, args.no_tool_repeat, tuple(args.no_tool_kinds), args.answer_weight)


if __name__ == "__main__":
    main()
