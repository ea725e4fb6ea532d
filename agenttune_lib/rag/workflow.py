"""The corpus-to-QA-split steps as file-in/file-out functions over one artifacts directory, so each Dagster
asset (or CLI command) is one call and separate processes hand over through Parquet."""
from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agenttune_lib.rag.chunking import Chunk, ChunkingConfig, chunk_documents

__all__ = ["RagPaths", "make_llm", "run_chunks", "run_index", "run_graph", "run_candidates", "run_verified", "run_splits", "load_chunks", "funnel_png"]


@dataclasses.dataclass(frozen=True)
class RagPaths:
    """Where the RAG artifacts live under the platform's artifacts directory."""

    root: Path

    @classmethod
    def under(cls, artifacts: str | Path) -> "RagPaths":
        return cls(Path(artifacts) / "rag")

    @property
    def chunks(self) -> Path:
        return self.root / "chunks.parquet"

    @property
    def index(self) -> Path:
        return self.root / "index"

    @property
    def synthesis(self) -> Path:
        return self.root / "synthesis"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def retrieval_metrics(self) -> Path:
        return self.root / "retrieval_metrics.json"


def make_llm(kind: str = "extractive", base_url: str = "", model: str = "", model_path: str = "", api_key_env: str = "OPENAI_API_KEY") -> Any:
    """None for the extractive default, else an OpenAI-compatible or local transformers client."""
    if kind == "extractive":
        return None
    from agenttune_lib.rag.synthesis.llm import OpenAICompatLLMClient, TransformersLLMClient

    if kind == "openai":
        if not base_url or not model:
            raise ValueError("generator 'openai' needs llm_base_url and llm_model")
        return OpenAICompatLLMClient(base_url, model, api_key_env)
    if kind == "transformers":
        if not model_path:
            raise ValueError("generator 'transformers' needs llm_model_path (a local checkpoint directory)")
        return TransformersLLMClient(model_path)
    raise ValueError(f"unknown generator {kind!r}; expected extractive, openai or transformers")


def load_chunks(paths: RagPaths) -> list[Chunk]:
    if not paths.chunks.exists():
        raise FileNotFoundError(f"no chunks at {paths.chunks}; materialize corpus_chunks first")
    t = pq.read_table(paths.chunks).to_pylist()
    return [Chunk(r["chunk_id"], r["doc_id"], r["ord"], r["text"], r["title"], r["path"]) for r in t]


def run_chunks(documents: list[Any], paths: RagPaths, warehouse: Any = None, config: ChunkingConfig = ChunkingConfig(), run_id: str | None = None) -> dict[str, Any]:
    """Chunk documents into ``chunks.parquet`` and the warehouse ``chunks`` table; unusable documents are reported."""
    chunks, skipped = chunk_documents(documents, config)
    if not chunks:
        detail = "; ".join(s.message() for s in skipped[:5]) or "no documents"
        raise ValueError(f"no usable text in the corpus: {detail}")
    paths.root.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    table = pa.table(
        {
            "chunk_id": [c.chunk_id for c in chunks], "doc_id": [c.doc_id for c in chunks], "ord": pa.array([c.ord for c in chunks], pa.int32()),
            "text": [c.text for c in chunks], "title": [c.title for c in chunks], "path": [c.path for c in chunks],
            "n_chars": pa.array([len(c.text) for c in chunks], pa.int64()), "run_id": [run_id] * len(chunks),
            "created_at": pa.array([now] * len(chunks), pa.timestamp("us")),
        }
    )
    pq.write_table(table, paths.chunks)
    if warehouse is not None:
        warehouse.upsert_arrow("chunks", table, key="chunk_id")
    lengths = [len(c.text) for c in chunks]
    return {
        "n_documents": len({c.doc_id for c in chunks}), "n_chunks": len(chunks), "skipped": [s.message() for s in skipped],
        "mean_chars": sum(lengths) / len(lengths), "max_chars": max(lengths), "chunk_set": _digest([c.chunk_id for c in chunks]),
    }


def _digest(ids: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:16]


def _embedder(paths: RagPaths, embedder: Any = None, persistent: bool = False) -> Any:
    """Chunk vectors (corpus-deterministic, stage 0/1) persist on disk; question vectors are memoised in memory only."""
    from agenttune_lib.rag.embedding import CachedEmbedder, SentenceTransformerEmbedder

    return CachedEmbedder(embedder or SentenceTransformerEmbedder(), paths.cache / "embeddings" if persistent else None)


def run_index(paths: RagPaths, embedder: Any = None) -> dict[str, Any]:
    """BM25 and dense sub-indexes (vectors cached by content) under ``index/``; hybrid fuses them at query time."""
    import shutil

    from agenttune_lib.rag.backends import build_index

    chunks = load_chunks(paths)
    if paths.index.exists():
        shutil.rmtree(paths.index)
    stats = build_index(chunks, paths.index, _embedder(paths, embedder, persistent=True))
    stats["chunk_set"] = _digest([c.chunk_id for c in chunks])
    meta = _dense(paths).meta()  # the encoder's truncation, as recorded with the index
    stats.update({k: meta[k] for k in ("max_seq_length", "n_truncated", "share_truncated") if k in meta})
    return stats


def _pipeline(paths: RagPaths, config: Any = None, llm: Any = None, embedder: Any = None) -> Any:
    from agenttune_lib.rag.synthesis.pipeline import SynthesisConfig, SynthesisPipeline

    return SynthesisPipeline(paths.synthesis, config or SynthesisConfig(), llm=llm, embedder=embedder or _embedder(paths), cache_dir=paths.cache / "stage1")


def _dense(paths: RagPaths) -> Any:
    from agenttune_lib.rag.backends import DenseBackend

    return DenseBackend(paths.index)


def run_graph(paths: RagPaths, config: Any = None, llm: Any = None) -> dict[str, Any]:
    """Stage 1 (annotations, typed graph), reusing the dense index's vectors; cached by content."""
    chunks = load_chunks(paths)
    dense = _dense(paths)
    order = {cid: i for i, cid in enumerate(dense.chunks()["chunk_id"])}
    missing = [c.chunk_id for c in chunks if c.chunk_id not in order]
    if missing:
        raise ValueError(f"retrieval index at {paths.index} is stale: {len(missing)} chunks are not in it; rematerialize retrieval_index")
    vectors = dense.vectors()[[order[c.chunk_id] for c in chunks]]
    return _pipeline(paths, config, llm).stage1(chunks, vectors)


def run_candidates(paths: RagPaths, config: Any = None, llm: Any = None) -> dict[str, Any]:
    """Stages 2-3: path sampling and answer-first generation."""
    pipe = _pipeline(paths, config, llm)
    return {"stage2": pipe.stage2(), "stage3": pipe.stage3()}


def run_verified(paths: RagPaths, config: Any = None, llm: Any = None) -> dict[str, Any]:
    """Stages 4-5: verification with one regeneration, the gate, and the difficulty matrix."""
    from agenttune_lib.rag.backends import load_backend

    pipe = _pipeline(paths, config, llm)
    dense = _dense(paths)
    vectors = dict(zip(dense.chunks()["chunk_id"], dense.vectors()))
    backends = {kind: load_backend(paths.index, kind, embedder=pipe.embedder) for kind in pipe.config.shortcut_backends}  # one memo: each question embedded once
    return {"stage4": pipe.stage4(backends), "stage5": pipe.stage5(vectors)}


def run_splits(paths: RagPaths, warehouse: Any = None, config: Any = None, k: int = 8) -> dict[str, Any]:
    """Stage 6, the ``qa_items`` warehouse table, and retrieval metrics per backend on every kept question."""
    from agenttune_lib.rag.backends import load_backend
    from agenttune_lib.rag.metrics import compare_backends
    from agenttune_lib.rag.splits import write_qa_items

    pipe = _pipeline(paths, config)
    result = pipe.stage6()
    items = result.train + result.validation
    version = result.metrics["dataset_version"]
    if warehouse is not None:
        write_qa_items(warehouse, items, version)
    dense = _dense(paths)
    chunk_table = dense.chunks()
    text = dict(zip(chunk_table["chunk_id"], chunk_table["text"]))
    doc = dict(zip(chunk_table["chunk_id"], chunk_table["doc_id"]))
    embedder = _embedder(paths)
    embedder.seed(paths.synthesis / "stage5_question_vectors.npz")  # stage 5 already embedded these questions
    backends = {kind: load_backend(paths.index, kind, embedder=embedder) for kind in ("bm25", "dense", "hybrid")}  # one memo: each question embedded once
    retrieval = {
        "all": compare_backends(backends, items, text, doc, k),
        "validation": compare_backends(backends, result.validation, text, doc, k),
    }
    paths.retrieval_metrics.write_text(json.dumps(retrieval, indent=1, sort_keys=True))
    metrics = json.loads((paths.synthesis / "metrics.json").read_text())
    metrics["retrieval"] = retrieval
    metrics["dataset_version"] = version
    (paths.synthesis / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
    return metrics


def funnel_png(funnel: dict[str, int], title: str = "QA curation funnel") -> bytes:
    """The Figure-3-shaped funnel (candidates -> verified -> gated) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(funnel)
    values = [funnel[k] for k in labels]
    fig, ax = plt.subplots(figsize=(6, 2.6), dpi=100)
    bars = ax.barh(labels[::-1], values[::-1], color=["#2f7d4f", "#4f9fd1", "#9aa5b1"][: len(values)][::-1])
    for bar, v in zip(bars, values[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v}", va="center")
    ax.set_xlim(0, max(values + [1]) * 1.15)
    ax.set_title(title)
    ax.set_xlabel("questions")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
