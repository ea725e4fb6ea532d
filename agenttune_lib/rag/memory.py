"""MEM1-style running state: each search result is folded into one bounded internal state, so a rollout's
context stays about the same size however many searches the agent runs."""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.rag.synthesis.annotate import STOPWORDS, sentences

__all__ = ["StateCompressor"]


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS and len(w) > 2}


class StateCompressor:
    """Keeps ``state`` under ``max_chars``. The default update keeps the sentences of the old state and the new
    observation that overlap the question most; ``summarizer(question, state, observation) -> str`` (an LLM
    call, for instance) replaces it."""

    def __init__(self, max_chars: int = 1500, summarizer: Callable[[str, str, str], str] | None = None) -> None:
        self.max_chars = max_chars
        self.summarizer = summarizer
        self.state = ""
        self.updates = 0
        self._folded = 0

    def reset(self) -> None:
        self.state, self.updates, self._folded = "", 0, 0

    def update(self, question: str, observation: str) -> str:
        """Fold one observation into the state and return the new state."""
        self.updates += 1
        if self.summarizer is not None:
            self.state = str(self.summarizer(question, self.state, observation))[: self.max_chars]
            return self.state
        q = _content_words(question)
        pool = []
        for text in (self.state, observation):
            for s in sentences(text):
                if s not in pool:
                    pool.append(s)
        scored = sorted(range(len(pool)), key=lambda i: (-len(_content_words(pool[i]) & q), -i))
        keep: list[int] = []
        size = 0
        for i in scored:
            if size + len(pool[i]) + 1 > self.max_chars:
                continue
            keep.append(i)
            size += len(pool[i]) + 1
        self.state = " ".join(pool[i] for i in sorted(keep))
        return self.state

    def compress_messages(self, messages: Sequence[dict[str, Any]], question: str) -> list[dict[str, Any]]:
        """Replace every tool result in a chat history by the running state: system and first user turn, the
        state as one message, then the latest assistant turn."""
        tool_results = [m for m in messages if m.get("role") == "tool"]
        for m in tool_results[self._folded :]:
            self.update(question, str(m.get("content", "")))
        self._folded = len(tool_results)
        head = [m for m in messages[:2] if m.get("role") in ("system", "user")]
        last_assistant = [m for m in messages if m.get("role") == "assistant"][-1:]
        state = {"role": "user", "content": f"<state>\n{self.state}\n</state>"}
        return [*head, state, *last_assistant]
