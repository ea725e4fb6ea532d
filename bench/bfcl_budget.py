"""BFCL per-category budgets vs one shared 256-token budget: wall time and scores, side by side in one process.

What a user calls either way: ``run_bfcl_suite`` on the platform arm with the packaged SmolLM2 (greedy, batch 8),
the same items. Ours: ``BFCLSuiteConfig()`` (each category its own budget from its ground truth, 128 where no call
is correct). Baseline: ``max_new_tokens=256`` for every category (the budget before per-category budgets). The
order of the two arms alternates per repeat so a load drift hits both.

Usage: python bench/bfcl_budget.py BASE_CHECKPOINT [N_PER_CATEGORY] [REPEATS]
(e.g. ``.agenttune/models/smollm2-135m-instruct 20 2`` after ``agenttune materialize``).
"""
from __future__ import annotations

import statistics
import sys
import time

from agenttune_lib.evaluation.batched import BatchedChatPolicy
from agenttune_lib.evaluation.suites.bfcl import BFCLSuiteConfig, run_bfcl_suite
from agenttune_lib.models.serving import load_served

CATEGORIES = ("simple_python", "irrelevance")


def timed(policy: BatchedChatPolicy, config: BFCLSuiteConfig) -> tuple[float, dict[str, float]]:
    start = time.perf_counter()
    res = run_bfcl_suite(policy, config)["bfcl_platform"]
    seconds = time.perf_counter() - start
    scores = {c: statistics.mean(r["score"] for r in res.rows if r["category"] == c) for c in config.categories}
    return seconds, scores


def main(base: str, n: int = 20, repeats: int = 2) -> None:
    model, tokenizer = load_served(base, None)
    policy = BatchedChatPolicy(model, tokenizer, batch_size=8)
    arms = {
        "ours (per-category budgets)": BFCLSuiteConfig(categories=CATEGORIES, limit=n, arms=("platform",)),
        "baseline (256 tokens for all)": BFCLSuiteConfig(categories=CATEGORIES, limit=n, arms=("platform",), max_new_tokens=256),
    }
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    scores: dict[str, dict[str, float]] = {}
    for rep in range(repeats):
        for name, config in (list(arms.items()) if rep % 2 == 0 else list(arms.items())[::-1]):
            s, sc = timed(policy, config)
            seconds[name].append(s)
            scores[name] = sc
    ours, baseline = (statistics.median(v) for v in seconds.values())
    for name in arms:
        print(f"{name}: {statistics.median(seconds[name]):.1f} s (runs {[round(x, 1) for x in seconds[name]]}), scores {scores[name]}")
    print(f"ratio baseline/ours: {baseline / ours:.2f}x faster, {len(CATEGORIES)} categories x {n} items, {repeats} repeats")


if __name__ == "__main__":
    main(sys.argv[1], *(int(x) for x in sys.argv[2:4]))
