"""Retrieval backends on the full licensedcode-data corpus (2,310 texts): indexing throughput and query
latency of our BM25 (bm25s), dense (all-MiniLM-L6-v2) and hybrid (RRF) backends against a pure-Python
BM25 baseline (rank-bm25), measured side by side in one run; also SQLite FTS5 (the paper's lexical backend).

    .venv/bin/python bench/retrieval.py [--queries 200] [--no-dense]
"""
from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--no-dense", action="store_true", help="skip the dense and hybrid backends")
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()

    from rank_bm25 import BM25Okapi

    from agenttune_lib.corpus import load_licensedcode
    from agenttune_lib.rag.backends import BM25Backend, DenseBackend, HybridBackend, SQLiteFTSBackend
    from agenttune_lib.rag.chunking import Chunk
    from agenttune_lib.rag.embedding import SentenceTransformerEmbedder
    from agenttune_lib.rag.synthesis.annotate import STOPWORDS

    load = load_licensedcode(categories=("*",))
    docs = load.documents
    chunks = [Chunk(f"d{i}", d.doc_id, 0, d.text, d.title, d.path) for i, d in enumerate(docs)]
    mb = sum(len(d.text.encode()) for d in docs) / 1e6
    rng = random.Random(0)
    sample = rng.sample(range(len(docs)), min(args.queries, len(docs)))
    queries = [docs[i].title for i in sample]  # a licence's name should find its own text
    print(f"corpus: {len(docs)} texts with text (of {len(docs) + len(load.problems)} files), {mb:.1f} MB; {len(queries)} title queries, k={args.k}")
    rows = []

    # pure-Python baseline: same lower-case word tokens and stopwords as bm25s' English list
    def tok(text: str) -> list[str]:
        return [w for w in re.findall(r"(?u)\b\w\w+\b", text.lower()) if w not in STOPWORDS]

    t0 = time.perf_counter()
    baseline = BM25Okapi([tok(f"{c.title}\n{c.text}") for c in chunks])
    base_build = time.perf_counter() - t0
    lat, hits = [], 0
    for q, i in zip(queries, sample):
        t = time.perf_counter()
        scores = baseline.get_scores(tok(q))
        top = sorted(range(len(scores)), key=lambda j: -scores[j])[: args.k]
        lat.append(time.perf_counter() - t)
        hits += i in top
    rows.append(("rank-bm25 (baseline)", base_build, lat, hits))

    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        BM25Backend.build(chunks, root)
        build = time.perf_counter() - t0
        bm25 = BM25Backend(root)
        bm25.search("warm up", 1)
        lat, hits = [], 0
        for q, i in zip(queries, sample):
            t = time.perf_counter()
            got = bm25.search(q, args.k)
            lat.append(time.perf_counter() - t)
            hits += f"d{i}" in {h["chunk_id"] for h in got}
        rows.append(("bm25 (bm25s)", build, lat, hits))
        t0 = time.perf_counter()
        SQLiteFTSBackend.build(chunks, root)
        build = time.perf_counter() - t0
        fts = SQLiteFTSBackend(root)
        lat, hits = [], 0
        for q, i in zip(queries, sample):
            t = time.perf_counter()
            got = fts.search(q, args.k)
            lat.append(time.perf_counter() - t)
            hits += f"d{i}" in {h["chunk_id"] for h in got}
        rows.append(("sqlite fts5 bm25 (stdlib)", build, lat, hits))
        if not args.no_dense:
            embedder = SentenceTransformerEmbedder()
            embedder.encode(["warm up"])
            t0 = time.perf_counter()
            DenseBackend.build(chunks, root, embedder)
            build = time.perf_counter() - t0
            for name, backend in (("dense (MiniLM-L6, 128 tok)", DenseBackend(root, embedder)), ("hybrid (RRF k=60)", HybridBackend(root, dense=DenseBackend(root, embedder)))):
                backend.search("warm up", 1)
                lat, hits = [], 0
                for q, i in zip(queries, sample):
                    t = time.perf_counter()
                    got = backend.search(q, args.k)
                    lat.append(time.perf_counter() - t)
                    hits += f"d{i}" in {h["chunk_id"] for h in got}
                rows.append((name, build if name.startswith("dense") else float("nan"), lat, hits))

    base_build, base_lat = rows[0][1], statistics.median(rows[0][2])
    print(f"\n{'backend':28} {'index s':>8} {'texts/s':>9} {'x base':>7} {'p50 ms':>8} {'p95 ms':>8} {'x base':>7} {'hit@' + str(args.k):>7}")
    for name, build, lat, hits in rows:
        p50, p95 = statistics.median(lat), sorted(lat)[int(0.95 * (len(lat) - 1))]
        speed = len(docs) / build if build == build else float("nan")
        print(f"{name:28} {build:8.2f} {speed:9.0f} {base_build / build if build == build else float('nan'):7.2f} {p50 * 1e3:8.2f} {p95 * 1e3:8.2f} {base_lat / p50:7.2f} {hits / len(queries):7.3f}")
    print("\nx base: the baseline's time divided by this backend's (higher is faster); hybrid's index is the BM25 + dense build.")


if __name__ == "__main__":
    main()
