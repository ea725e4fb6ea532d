"""Retrieval metrics on a QA split (paper §5.1.2): gold-chunk R@k, ans@k, Doc@k, answer reachability."""
from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["normalise_answer", "answer_in", "retrieval_metrics", "compare_backends"]


def normalise_answer(text: str) -> str:
    """Lower-case, strip accents and punctuation, collapse whitespace (SQuAD-style)."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode().lower()
    text = re.sub(r"[^a-z0-9]+", " ", text)
    return " ".join(text.split())


def answer_in(answer: str, text: str) -> bool:
    """Whether the normalised answer occurs in the normalised text on word boundaries."""
    a = normalise_answer(answer)
    return bool(a) and f" {a} " in f" {normalise_answer(text)} "


def _get(item: Any, key: str) -> Any:
    return item[key] if isinstance(item, Mapping) else getattr(item, key)


def retrieval_metrics(backend: Any, items: Sequence[Any], chunk_text: Mapping[str, str], chunk_doc: Mapping[str, str], k: int = 8) -> dict[str, Any]:
    """Per-question averages (paper §5.1.2): R@k (the exact gold chunk, the one holding the answer, is in the
    top k; ``answer_chunk_id`` or the first gold id), ans@k (any gold evidence chunk retrieved), Doc@k (a gold
    chunk's document retrieved), gold_recall@k (share of all gold chunks retrieved), reachability (answer
    string in the retrieved text) and its perfect-retrieval ceiling (answer string in the gold chunks)."""
    items = list(items)
    if not items:
        return {"n": 0, "k": k}
    questions = [str(_get(i, "question")) for i in items]
    t0 = time.perf_counter()
    if hasattr(backend, "search_many"):
        results = backend.search_many(questions, k)
    else:
        results = [backend.search(q, k) for q in questions]
    latency = (time.perf_counter() - t0) / len(items)
    exact = recall = ans = doc = reach = ceiling = 0.0
    for item, hits in zip(items, results):
        gold = list(_get(item, "gold_chunk_ids"))
        got = [h["chunk_id"] for h in hits[:k]]
        gold_docs = {chunk_doc.get(g) for g in gold}
        answer_chunk = (item.get("answer_chunk_id") if isinstance(item, Mapping) else getattr(item, "answer_chunk_id", None)) or (gold[0] if gold else None)
        exact += float(answer_chunk in got)
        recall += len(set(gold) & set(got)) / max(1, len(gold))
        ans += float(bool(set(gold) & set(got)))
        doc += float(bool(gold_docs & {h["doc_id"] for h in hits[:k]}))
        answer = str(_get(item, "answer"))
        reach += float(answer_in(answer, "\n".join(h["text"] for h in hits[:k])))
        ceiling += float(answer_in(answer, "\n".join(chunk_text.get(g, "") for g in gold)))
    n = len(items)
    return {
        "n": n,
        "k": k,
        f"R@{k}": exact / n,
        f"gold_recall@{k}": recall / n,
        f"ans@{k}": ans / n,
        f"doc@{k}": doc / n,
        "reachability": reach / n,
        "reachability_perfect": ceiling / n,
        "query_latency_ms": round(latency * 1000, 3),
    }


def compare_backends(backends: Mapping[str, Any], items: Sequence[Any], chunk_text: Mapping[str, str], chunk_doc: Mapping[str, str], k: int = 8) -> dict[str, dict[str, Any]]:
    """retrieval_metrics for each named backend on the same items."""
    return {name: retrieval_metrics(b, items, chunk_text, chunk_doc, k) for name, b in backends.items()}
