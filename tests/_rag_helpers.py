"""Test-only helpers for the RAG tests: a small licensedcode corpus, a hashing embedder and a scripted LLM."""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence

import numpy as np

from agenttune_lib.rag.synthesis.llm import LLMResponse

SMALL_KEYS = (
    "rar-winrar-eula", "xming", "shavlik-eula", "jetbrains-purchase-terms", "lavantech", "tanuki-maintenance",
    "ej-technologies-eula", "embedthis-tou-2022", "slint-commercial-2.0", "vaadin-cvdl-4.0", "rubyencoder-commercial", "oxygen-xml-webhelp-eula",
)


def licensed_documents(keys: Sequence[str] = SMALL_KEYS):
    """Real Documents from the licensedcode-data package (the corpus module's own parser)."""
    from agenttune_lib.corpus import load_licensedcode

    load = load_licensedcode(categories=(), license_keys=tuple(keys))
    assert load.documents, load.problems
    return load.documents


class HashEmbedder:
    """Test-only: hashed bag-of-words vectors (no model); similar word sets give similar vectors."""

    name = "test-hash-embedder"

    def __init__(self, dim: int = 128) -> None:
        self.dim = dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for w in re.findall(r"[a-z0-9]+", text.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1, norms)


class ScriptedLLM:
    """Test-only LLM client: replies from a function of the messages, counting calls."""

    model = "scripted"

    def __init__(self, reply) -> None:
        self.reply = reply
        self.calls: list[list[dict]] = []

    def complete(self, messages, *, json_mode: bool = False, max_tokens: int = 512) -> LLMResponse:
        self.calls.append(list(messages))
        text = self.reply(messages)
        if not isinstance(text, str):
            text = json.dumps(text)
        return LLMResponse(text, self.model, prompt_tokens=sum(len(m["content"].split()) for m in messages), completion_tokens=len(text.split()), latency_s=0.001, cost_usd=0.0001)
