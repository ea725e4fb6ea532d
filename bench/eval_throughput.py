"""Batched vs one-at-a-time generation throughput for evaluation (SmolLM2, greedy, first-turn τ² prompts).

    AGENTTUNE_HOME=/work/team/home-eval .venv/bin/python bench/eval_throughput.py --n 16 --max-new-tokens 64
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 avoids spin-waiting on a shared machine)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from agenttune_lib.evaluation.batched import BatchedChatPolicy
    from agenttune_lib.models.base import ensure_base_model, load_base_model
    from agenttune_lib.spine import tau2 as spine_tau2
    from agenttune_lib.spine.prompts import system_prompt

    home = Path(os.environ.get("AGENTTUNE_HOME", Path.home() / ".agenttune"))
    info = ensure_base_model(home / "models")
    model, tok = load_base_model(info.path)
    tools = list(spine_tau2.tau2_tool_schemas())
    system = system_prompt(tools, None, [spine_tau2.TAU2_EXAMPLE], "compact")
    convs = [[{"role": "system", "content": system}, {"role": "user", "content": t.prompt}] for t in spine_tau2.load_tau2_tasks("test")[: args.n]]
    out = {}
    for label, bs in (("batched", args.batch_size), ("unbatched", 1)):
        policy = BatchedChatPolicy(model, tok, max_new_tokens=args.max_new_tokens, batch_size=bs, stop_strings=())
        t0, c0 = time.perf_counter(), time.process_time()
        policy.generate_batch(convs)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        s = policy.stats
        out[label] = {"batch_size": bs, "rows": s.rows, "new_tokens": s.new_tokens, "prompt_tokens": s.prompt_tokens, "seconds": round(wall, 1),
                      "cpu_seconds": round(cpu, 1), "new_tokens_per_s": round(s.new_tokens / wall, 2),
                      "new_tokens_per_cpu_s": round(s.new_tokens / cpu, 2)}
        print(label, json.dumps(out[label]), flush=True)
    out["speedup_wall"] = round(out["batched"]["new_tokens_per_s"] / out["unbatched"]["new_tokens_per_s"], 2)
    out["speedup_cpu"] = round(out["batched"]["new_tokens_per_cpu_s"] / out["unbatched"]["new_tokens_per_cpu_s"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
