"""Search backends over a chunk index directory: BM25 (bm25s), dense (sentence-transformers), hybrid (RRF).

Every backend holds paths and settings only; indexes load lazily per process, so backends pickle
into rollout workers.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agenttune_lib.rag.chunking import Chunk
from agenttune_lib.rag.embedding import Embedder, SentenceTransformerEmbedder, encode_texts, normalise_rows

__all__ = [
    "BM25Backend",
    "DenseBackend",
    "HybridBackend",
    "SearchBackend",
    "SearchHit",
    "SearchIndexError",
    "SQLiteFTSBackend",
    "build_index",
    "load_backend",
    "BACKEND_KINDS",
]

BACKEND_KINDS = ("bm25", "dense", "hybrid", "sqlite_fts")
_CHUNKS = "chunks.parquet"


class SearchIndexError(RuntimeError):
    """An index directory is missing or inconsistent."""


@runtime_checkable
class SearchBackend(Protocol):
    """Ranked retrieval of chunks for a text query."""

    name: str

    def search(self, query: str, k: int = 8) -> list["SearchHit"]: ...


class SearchHit(dict):
    """One retrieved chunk: chunk_id, doc_id, title, text, score, rank (a dict, so it serialises as-is)."""

    @property
    def chunk_id(self) -> str:
        return self["chunk_id"]

    @property
    def doc_id(self) -> str:
        return self["doc_id"]

    @property
    def text(self) -> str:
        return self["text"]

    @property
    def score(self) -> float:
        return self["score"]


def _write_chunks(chunks: Sequence[Chunk], path: Path) -> None:
    table = pa.table(
        {
            "chunk_id": [c.chunk_id for c in chunks],
            "doc_id": [c.doc_id for c in chunks],
            "ord": [c.ord for c in chunks],
            "title": [c.title for c in chunks],
            "text": [c.text for c in chunks],
        }
    )
    pq.write_table(table, path / _CHUNKS)


class _IndexBase:
    name = "base"

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._chunks: dict[str, list[Any]] | None = None

    def _root(self) -> Path:
        root = Path(self.path)
        if not (root / _CHUNKS).exists():
            raise SearchIndexError(f"no chunk index at {root} (missing {_CHUNKS}); build it with build_index()")
        return root

    def chunks(self) -> dict[str, list[Any]]:
        if self._chunks is None:
            self._chunks = pq.read_table(self._root() / _CHUNKS).to_pydict()
        return self._chunks

    def __len__(self) -> int:
        return len(self.chunks()["chunk_id"])

    def _hit(self, row: int, score: float, rank: int) -> SearchHit:
        c = self.chunks()
        return SearchHit(chunk_id=c["chunk_id"][row], doc_id=c["doc_id"][row], title=c["title"][row], text=c["text"][row], score=float(score), rank=rank)

    def __getstate__(self) -> dict[str, Any]:
        return {k: (None if k.startswith("_") else v) for k, v in self.__dict__.items()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"


def _tokenize_queries(queries: Sequence[str]) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)


class BM25Backend(_IndexBase):
    """Lexical BM25 over the ``bm25/`` sub-index written by bm25s (ships with the install)."""

    name = "bm25"

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self._retriever: Any = None

    @staticmethod
    def build(chunks: Sequence[Chunk], path: str | Path) -> "BM25Backend":
        import bm25s

        root = Path(path)
        (root / "bm25").mkdir(parents=True, exist_ok=True)
        if not (root / _CHUNKS).exists():
            _write_chunks(chunks, root)
        tokens = bm25s.tokenize([f"{c.title}\n{c.text}" for c in chunks], stopwords="en", show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        retriever.save(str(root / "bm25"), show_progress=False)
        return BM25Backend(root)

    def _load(self) -> Any:
        if self._retriever is None:
            import bm25s

            sub = self._root() / "bm25"
            if not sub.exists():
                raise SearchIndexError(f"no BM25 index at {sub}")
            self._retriever = bm25s.BM25.load(str(sub), show_progress=False)
        return self._retriever

    def search_many(self, queries: Sequence[str], k: int = 8) -> list[list[SearchHit]]:
        retriever = self._load()
        vocab = retriever.vocab_dict
        out: list[list[SearchHit]] = []
        n = len(self)
        for tokens in _tokenize_queries(queries):
            tokens = [t for t in tokens if t in vocab]
            if not tokens or n == 0:
                out.append([])
                continue
            docs, scores = retriever.retrieve([tokens], k=min(k, n), show_progress=False, n_threads=1)
            hits = [self._hit(int(d), float(s), r) for r, (d, s) in enumerate(zip(docs[0], scores[0])) if s > 0]
            out.append(hits)
        return out

    def search(self, query: str, k: int = 8) -> list[SearchHit]:
        return self.search_many([query], k)[0]


class SQLiteFTSBackend(_IndexBase):
    """Lexical BM25 ranking through SQLite FTS5 (standard library) in ``fts.sqlite``; the paper's lexical backend."""

    name = "sqlite_fts"

    @staticmethod
    def build(chunks: Sequence[Chunk], path: str | Path) -> "SQLiteFTSBackend":
        import sqlite3

        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        if not (root / _CHUNKS).exists():
            _write_chunks(chunks, root)
        db = root / "fts.sqlite"
        db.unlink(missing_ok=True)
        con = sqlite3.connect(db)
        try:
            con.execute("CREATE VIRTUAL TABLE chunks_fts USING fts5(row UNINDEXED, title, text, tokenize='porter unicode61')")
            con.executemany("INSERT INTO chunks_fts(row, title, text) VALUES (?, ?, ?)", [(i, c.title, c.text) for i, c in enumerate(chunks)])
            con.commit()
        finally:
            con.close()
        return SQLiteFTSBackend(root)

    def search_many(self, queries: Sequence[str], k: int = 8) -> list[list[SearchHit]]:
        import sqlite3

        db = self._root() / "fts.sqlite"
        if not db.exists():
            raise SearchIndexError(f"no SQLite FTS index at {db}")
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            out = []
            for query in queries:
                terms = [t for t in _tokenize_queries([query])[0]]
                if not terms:
                    out.append([])
                    continue
                match = " OR ".join(f'"{t}"' for t in dict.fromkeys(terms))
                rows = con.execute("SELECT row, bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts) LIMIT ?", (match, k)).fetchall()
                out.append([self._hit(int(r), -float(score), rank) for rank, (r, score) in enumerate(rows)])
            return out
        finally:
            con.close()

    def search(self, query: str, k: int = 8) -> list[SearchHit]:
        return self.search_many([query], k)[0]


class DenseBackend(_IndexBase):
    """Cosine search over normalised vectors stored with the index (``dense/vectors.npy``)."""

    name = "dense"

    def __init__(self, path: str | Path, embedder: Embedder | None = None) -> None:
        super().__init__(path)
        self.embedder = embedder
        self._vectors: np.ndarray | None = None

    @staticmethod
    def build(chunks: Sequence[Chunk], path: str | Path, embedder: Embedder | None = None, vectors: np.ndarray | None = None) -> "DenseBackend":
        root = Path(path)
        (root / "dense").mkdir(parents=True, exist_ok=True)
        if not (root / _CHUNKS).exists():
            _write_chunks(chunks, root)
        embedder = embedder or SentenceTransformerEmbedder()
        if vectors is None:
            vectors = encode_texts(embedder, [c.text for c in chunks])
        vectors = normalise_rows(np.asarray(vectors, dtype=np.float32))
        if vectors.shape[0] != len(chunks):
            raise SearchIndexError(f"{vectors.shape[0]} vectors for {len(chunks)} chunks")
        np.save(root / "dense" / "vectors.npy", vectors)
        meta = {"embedder": getattr(embedder, "name", type(embedder).__name__), "dim": int(vectors.shape[1]) if vectors.ndim == 2 else 0, "n": len(chunks)}
        inner = getattr(embedder, "embedder", embedder)
        if isinstance(inner, SentenceTransformerEmbedder):
            meta.update(model_path=inner.model_path, max_seq_length=inner.max_seq_length, **inner.truncation([c.text for c in chunks]))
        (root / "dense" / "meta.json").write_text(json.dumps(meta, indent=1))
        return DenseBackend(root, embedder)

    def meta(self) -> dict[str, Any]:
        path = self._root() / "dense" / "meta.json"
        if not path.exists():
            raise SearchIndexError(f"no dense index at {path.parent}")
        return json.loads(path.read_text())

    def vectors(self) -> np.ndarray:
        """The stored chunk vectors, aligned with ``chunks()['chunk_id']``."""
        if self._vectors is None:
            self.meta()
            self._vectors = np.load(self._root() / "dense" / "vectors.npy")
        return self._vectors

    def _embedder(self) -> Embedder:
        if self.embedder is None:
            meta = self.meta()
            self.embedder = SentenceTransformerEmbedder(meta.get("model_path"), meta.get("max_seq_length", 128))
        return self.embedder

    def search_many(self, queries: Sequence[str], k: int = 8) -> list[list[SearchHit]]:
        matrix = self.vectors()
        if not len(queries) or matrix.shape[0] == 0:
            return [[] for _ in queries]
        q = encode_texts(self._embedder(), list(queries))
        scores = q @ matrix.T
        out = []
        k = min(k, matrix.shape[0])
        for row in scores:
            top = np.argpartition(-row, k - 1)[:k]
            top = top[np.argsort(-row[top], kind="stable")]
            out.append([self._hit(int(i), float(row[i]), r) for r, i in enumerate(top)])
        return out

    def search(self, query: str, k: int = 8) -> list[SearchHit]:
        return self.search_many([query], k)[0]

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["embedder"] = self.embedder
        return state


class HybridBackend:
    """Reciprocal rank fusion (score = sum 1/(k_rrf + rank)) of a lexical and a dense backend."""

    name = "hybrid"

    def __init__(self, path: str | Path | None = None, lexical: Any = None, dense: Any = None, k_rrf: int = 60, depth: int = 50) -> None:
        if lexical is None or dense is None:
            if path is None:
                raise ValueError("HybridBackend needs an index path or both a lexical and a dense backend")
            lexical = lexical or BM25Backend(path)
            dense = dense or DenseBackend(path)
        self.path = str(path) if path is not None else getattr(lexical, "path", "")
        self.lexical = lexical
        self.dense = dense
        self.k_rrf = k_rrf
        self.depth = depth

    def search_many(self, queries: Sequence[str], k: int = 8) -> list[list[SearchHit]]:
        lex = _search_many(self.lexical, queries, max(k, self.depth))
        den = _search_many(self.dense, queries, max(k, self.depth))
        out = []
        for a, b in zip(lex, den):
            fused: dict[str, float] = {}
            hits: dict[str, SearchHit] = {}
            for ranked in (a, b):
                for rank, hit in enumerate(ranked):
                    fused[hit["chunk_id"]] = fused.get(hit["chunk_id"], 0.0) + 1.0 / (self.k_rrf + rank + 1)
                    hits.setdefault(hit["chunk_id"], hit)
            order = sorted(fused, key=lambda cid: (-fused[cid], cid))[:k]
            out.append([SearchHit({**hits[cid], "score": fused[cid], "rank": r}) for r, cid in enumerate(order)])
        return out

    def search(self, query: str, k: int = 8) -> list[SearchHit]:
        return self.search_many([query], k)[0]

    def __repr__(self) -> str:
        return f"HybridBackend({self.lexical!r}, {self.dense!r}, k_rrf={self.k_rrf})"


def _search_many(backend: Any, queries: Sequence[str], k: int) -> list[list[SearchHit]]:
    if hasattr(backend, "search_many"):
        return backend.search_many(queries, k)
    return [backend.search(q, k) for q in queries]


def build_index(chunks: Sequence[Chunk], path: str | Path, embedder: Embedder | None = None, kinds: Sequence[str] = ("bm25", "dense")) -> dict[str, Any]:
    """Write the chunk table and the BM25 and dense sub-indexes under ``path``; returns build stats."""
    if not chunks:
        raise SearchIndexError("cannot build a search index from zero chunks")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    _write_chunks(chunks, root)
    stats: dict[str, Any] = {"n_chunks": len(chunks), "path": str(root)}
    if "bm25" in kinds:
        t0 = time.perf_counter()
        BM25Backend.build(chunks, root)
        stats["bm25_build_s"] = round(time.perf_counter() - t0, 3)
    if "sqlite_fts" in kinds:
        t0 = time.perf_counter()
        SQLiteFTSBackend.build(chunks, root)
        stats["sqlite_fts_build_s"] = round(time.perf_counter() - t0, 3)
    if "dense" in kinds:
        t0 = time.perf_counter()
        DenseBackend.build(chunks, root, embedder)
        stats["dense_build_s"] = round(time.perf_counter() - t0, 3)
    return stats


def load_backend(path: str | Path, kind: str = "hybrid", embedder: Embedder | None = None) -> Any:
    """A backend of ``kind`` (bm25, dense, hybrid) over an index directory."""
    if kind == "bm25":
        return BM25Backend(path)
    if kind == "dense":
        return DenseBackend(path, embedder)
    if kind == "hybrid":
        return HybridBackend(path, dense=DenseBackend(path, embedder))
    if kind == "sqlite_fts":
        return SQLiteFTSBackend(path)
    raise ValueError(f"unknown backend kind {kind!r}; expected one of {BACKEND_KINDS}")
