"""Agentic RAG: search backends, SearchCorpusTool, retrieval metrics, and the six-stage QA synthesis pipeline."""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Chunk": "chunking", "ChunkingConfig": "chunking", "chunk_documents": "chunking", "chunk_text": "chunking", "doc_id_for": "chunking", "chunk_id_for": "chunking",
    "Embedder": "embedding", "SentenceTransformerEmbedder": "embedding",
    "SearchBackend": "backends", "SearchHit": "backends", "BM25Backend": "backends", "DenseBackend": "backends", "HybridBackend": "backends", "SQLiteFTSBackend": "backends",
    "build_index": "backends", "load_backend": "backends",
    "SearchCorpusTool": "tool",
    "retrieval_metrics": "metrics", "compare_backends": "metrics", "answer_in": "metrics",
    "split_by_gold_chunks": "splits", "SplitReport": "splits", "load_qa_split": "splits", "write_qa_items": "splits",
    "build_curriculum": "curriculum", "CurriculumSampler": "curriculum",
    "StateCompressor": "memory",
    "extract_json": "synthesis.jsonx",
    "run_pipeline": "synthesis.pipeline", "SynthesisConfig": "synthesis.pipeline", "SynthesisPipeline": "synthesis.pipeline", "SynthesisError": "synthesis.pipeline",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"agenttune_lib.rag.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'agenttune_lib.rag' has no attribute {name!r}")
