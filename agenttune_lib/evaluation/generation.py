"""The evaluation's generate callable: the spine's ChatGenerator, seeded per call, with optional LoRA adapter."""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

__all__ = ["SeededChatGenerate", "load_eval_generator"]


class SeededChatGenerate:
    """``generate(messages, seed=, temperature=, max_new_tokens=) -> text`` over a ``models.generate.ChatGenerator``.

    The n-th call under a seed reseeds torch with ``(seed, n)``, so a seed names a reproducible
    run regardless of what ran before it. Temperature 0 decodes greedily.
    """

    def __init__(self, chat_generator: Any) -> None:
        self.inner = chat_generator
        self._calls: Counter[int] = Counter()

    def __call__(self, messages: list[dict[str, Any]], seed: int = 0, temperature: float = 0.0, max_new_tokens: int = 128) -> str:
        import torch

        self.inner.config = dataclasses.replace(self.inner.config, seed=None, temperature=temperature, max_new_tokens=max_new_tokens)
        torch.manual_seed(seed * 1_000_003 + self._calls[seed])
        self._calls[seed] += 1
        out = self.inner(messages)
        return out if isinstance(out, str) else out.text


def load_eval_generator(base_path: str, adapter_path: str | None = None) -> SeededChatGenerate:
    """A seeded generator over the converted checkpoint at ``base_path``, with the PEFT adapter at ``adapter_path`` applied."""
    from agenttune_lib.models.base import load_base_model
    from agenttune_lib.models.generate import ChatGenerator

    model, tokenizer = load_base_model(base_path)
    if adapter_path:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path).eval()
    return SeededChatGenerate(ChatGenerator(model, tokenizer, stop_strings=()))
