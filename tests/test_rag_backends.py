"""Search backends, SearchCorpusTool and retrieval metrics on real licence texts."""
from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest

from agenttune_lib.rag.backends import BM25Backend, DenseBackend, HybridBackend, SearchBackend, SQLiteFTSBackend, build_index, load_backend
from agenttune_lib.rag.chunking import chunk_documents
from agenttune_lib.rag.metrics import answer_in, retrieval_metrics
from agenttune_lib.rag.tool import SearchCorpusTool
from agenttune_lib.tools.base import BaseTool
from _rag_helpers import HashEmbedder, licensed_documents


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    chunks, _ = chunk_documents(licensed_documents())
    path = tmp_path_factory.mktemp("rag_index")
    build_index(chunks, path, HashEmbedder(), kinds=("bm25", "dense", "sqlite_fts"))
    return path, chunks


def test_each_backend_finds_a_chunk_by_its_own_words(index):
    path, chunks = index
    target = next(c for c in chunks if "WinRAR" in c.text)
    query = target.text
    backends = (BM25Backend(path), SQLiteFTSBackend(path), DenseBackend(path, HashEmbedder()), HybridBackend(path, dense=DenseBackend(path, HashEmbedder())))
    for backend in backends:
        assert isinstance(backend, SearchBackend)
        hits = backend.search(query, k=5)
        assert hits and hits[0]["chunk_id"] == target.chunk_id, backend
        assert [h["rank"] for h in hits] == list(range(len(hits)))
        assert all(hits[i]["score"] >= hits[i + 1]["score"] for i in range(len(hits) - 1))


def test_lexical_backends_return_nothing_for_unknown_words(index):
    assert BM25Backend(index[0]).search("zzqxv wvwvq", k=5) == []
    assert SQLiteFTSBackend(index[0]).search("zzqxv wvwvq", k=5) == []
    fts = SQLiteFTSBackend(index[0])
    fts.search('"; DROP TABLE chunks_fts; -- NEAR( *', k=5)  # FTS syntax is quoted away, never executed
    assert fts.search("WinRAR", k=1)


def test_hybrid_is_reciprocal_rank_fusion(index):
    path, _ = index
    lex, den = BM25Backend(path), DenseBackend(path, HashEmbedder())
    hybrid = HybridBackend(lexical=lex, dense=den, k_rrf=60, depth=20)
    q = "software licence fee refund"
    a, b = lex.search(q, 20), den.search(q, 20)
    expected: dict[str, float] = {}
    for ranked in (a, b):
        for r, h in enumerate(ranked):
            expected[h["chunk_id"]] = expected.get(h["chunk_id"], 0) + 1 / (61 + r)
    top = hybrid.search(q, 5)
    assert [h["chunk_id"] for h in top] == sorted(expected, key=lambda c: (-expected[c], c))[:5]
    assert top[0]["score"] == pytest.approx(max(expected.values()))


def _search_in_child(backend, query, queue):
    queue.put([h["chunk_id"] for h in backend.search(query, 3)])


def test_backends_pickle_as_paths_and_work_in_another_process(index):
    path, _ = index
    backend = load_backend(path, "bm25")
    backend.search("licence", 3)  # loads the index in this process
    blob = pickle.dumps(backend)
    assert len(blob) < 2000, "a backend must pickle as its path, not its index"
    restored = pickle.loads(blob)
    assert [h["chunk_id"] for h in restored.search("licence fee", 3)] == [h["chunk_id"] for h in backend.search("licence fee", 3)]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_search_in_child, args=(backend, "licence fee", queue))
    proc.start()
    got = queue.get(timeout=120)
    proc.join(60)
    assert got == [h["chunk_id"] for h in backend.search("licence fee", 3)]
    dense = pickle.loads(pickle.dumps(DenseBackend(path, HashEmbedder())))
    assert dense.search("licence fee", 2)


def test_search_corpus_tool_is_a_base_tool(index):
    tool = SearchCorpusTool(BM25Backend(index[0]), k=3)
    assert isinstance(tool, BaseTool)
    assert tool.to_schema()["function"]["name"] == "search_corpus"
    result = tool.invoke({"query": "WinRAR trial period"})
    assert result.ok and len(result.value["results"]) == 3
    assert tool.retrieved_chunk_ids(result.value)[0].startswith("ch-")
    bad = tool.invoke({"query": ""})
    assert not bad.ok and bad.error["type"] == "invalid_arguments"
    assert not tool.invoke({"k": 3}).ok  # missing query: schema violation, not a crash


def test_retrieval_metrics_by_hand(index):
    path, chunks = index
    backend = BM25Backend(path)
    text = {c.chunk_id: c.text for c in chunks}
    doc = {c.chunk_id: c.doc_id for c in chunks}
    target = next(c for c in chunks if "WinRAR" in c.text)
    other = next(c for c in chunks if c.doc_id != target.doc_id)
    answer = target.text.split()[5]
    items = [
        {"question": " ".join(target.text.split()[:30]), "answer": answer, "gold_chunk_ids": [target.chunk_id, other.chunk_id]},
        {"question": "zzqxv", "answer": "nothing-like-this", "gold_chunk_ids": [other.chunk_id]},
    ]
    m = retrieval_metrics(backend, items, text, doc, k=1)
    assert m["R@1"] == pytest.approx(0.5)
    assert m["gold_recall@1"] == pytest.approx(0.25)
    assert m["ans@1"] == pytest.approx(0.5)
    assert m["doc@1"] == pytest.approx(0.5)
    assert m["reachability"] == pytest.approx(0.5 if answer_in(answer, target.text) else 0.0)
    assert m["reachability_perfect"] == pytest.approx(0.5)


def test_cached_embedder_embeds_each_text_once(tmp_path):
    from agenttune_lib.rag.embedding import CachedEmbedder

    class Counting(HashEmbedder):
        def __init__(self):
            super().__init__()
            self.seen = []

        def encode(self, texts):
            self.seen.extend(texts)
            return super().encode(texts)

    inner = Counting()
    first = CachedEmbedder(inner, tmp_path).encode(["a b", "c d", "a b"])
    again = CachedEmbedder(inner, tmp_path).encode(["c d", "e f"])
    assert sorted(inner.seen) == ["a b", "c d", "e f"]
    assert (first[1] == again[0]).all()
    memo = CachedEmbedder(inner)
    memo.encode(["x y"]), memo.encode(["x y"])
    assert inner.seen.count("x y") == 1 and not list(tmp_path.glob("*x*"))


def test_search_corpus_tool_runs_inside_the_spine_harness(index):
    from agenttune_lib.spine.harness import DictToolHarness
    from agenttune_lib.spine.state import Action

    harness = DictToolHarness(tools=[SearchCorpusTool(BM25Backend(index[0]), k=2)])
    assert [t["function"]["name"] for t in harness.action_space()] == ["search_corpus"]
    harness.reset({"question": "How long may WinRAR be evaluated?"})
    step = harness.step(Action(kind="tool_call", name="search_corpus", arguments={"query": "WinRAR evaluation"}, id="c1"))
    assert step.error is None
    payload = step.events[-1].payload
    assert payload["name"] == "search_corpus" and "ch-" in payload["content"]
