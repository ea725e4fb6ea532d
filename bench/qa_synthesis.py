"""QA synthesis on the default corpus (licensedcode Commercial): wall time per step, the funnel, answer-type and
hop distributions, validation spread, retrieval R@8/ans@8/Doc@8 per backend, and the shortcut rate (the answer
chunk in the top 8 of one-shot BM25 on the question alone).

    .venv/bin/python bench/qa_synthesis.py [--out /tmp/qa-bench] [--json results.json]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="artifacts directory (default: a temporary one)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args()

    from agenttune_lib.corpus import CorpusConfig, load_corpus
    from agenttune_lib.rag.backends import load_backend
    from agenttune_lib.rag.workflow import RagPaths, run_candidates, run_chunks, run_graph, run_index, run_splits, run_verified

    root = args.out or tempfile.mkdtemp(prefix="qa-bench-")
    paths = RagPaths.under(root)
    docs = load_corpus(CorpusConfig()).documents
    timings, cpu = {}, {}
    t, c = time.perf_counter(), time.process_time()
    run_chunks(docs, paths)
    timings["chunks"], cpu["chunks"] = time.perf_counter() - t, time.process_time() - c
    for name, step in (("retrieval_index", lambda: run_index(paths)), ("knowledge_graph", lambda: run_graph(paths)), ("qa_candidates", lambda: run_candidates(paths)),
                       ("qa_verified", lambda: run_verified(paths)), ("qa_splits", lambda: run_splits(paths, None, k=args.k))):
        t, c = time.perf_counter(), time.process_time()
        out = step()
        timings[name], cpu[name] = time.perf_counter() - t, time.process_time() - c
    metrics = out
    items = [json.loads(line) for line in (paths.synthesis / "dataset_grpo.jsonl").read_text().splitlines()]
    bm25 = load_backend(paths.index, "bm25")
    hits = bm25.search_many([i["prompt"] for i in items], args.k) if hasattr(bm25, "search_many") else [bm25.search(i["prompt"], args.k) for i in items]
    import pyarrow.parquet as pq

    kept = {r["qa_id"]: r for r in pq.read_table(paths.synthesis / "stage5_difficulty.parquet").to_pylist()}
    shortcut = 0
    for item, got in zip(items, hits):
        answer_chunk = kept.get(item["qa_id"], {}).get("answer_chunk_id") or item["gold_chunk_ids"][0]
        shortcut += answer_chunk in {h["chunk_id"] for h in got[: args.k]}
    val = [i for i in items if i["split"] == "validation"]
    doc_of = {}
    for r in kept.values():
        doc_of[r["qa_id"]] = r["doc_ids"][0]
    figures = {
        "n_items": len(items),
        "unique_answers": len({i["answer"].lower() for i in items}) / max(1, len(items)),
        "answer_types": dict(Counter(kept[i["qa_id"]].get("answer_type") or kept[i["qa_id"]].get("answer_kind", "") for i in items)),
        "hops": dict(sorted(Counter(i["hops"] for i in items).items())),
        "val_items": len(val),
        "val_hops": dict(sorted(Counter(i["hops"] for i in val).items())),
        "val_documents": len({doc_of[i["qa_id"]] for i in val}),
        "val_largest_doc_share": max(Counter(doc_of[i["qa_id"]] for i in val).values(), default=0) / max(1, len(val)),
        f"shortcut_rate_bm25@{args.k}": shortcut / max(1, len(items)),
        "funnel": metrics["funnel"],
        "discard_reasons": metrics["discard_reasons"],
        "retrieval": {split: {b: {m: round(v, 3) for m, v in r.items() if m in (f"R@{args.k}", f"ans@{args.k}", f"doc@{args.k}")} for b, r in res.items()}
                      for split, res in metrics["retrieval"].items()},
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "index_plus_synthesis_s": round(sum(v for k, v in timings.items() if k != "chunks"), 1),
        "cpu_s": {k: round(v, 1) for k, v in cpu.items()},
        "index_plus_synthesis_cpu_s": round(sum(v for k, v in cpu.items() if k != "chunks"), 1),
        "load_average": os.getloadavg()[0],
        "sample_questions": [i["prompt"] for i in items[:: max(1, len(items) // 6)]][:6],
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=1)


if __name__ == "__main__":
    main()
