"""The evaluation conditions a score depends on (seed paper §3): seeds, multi-turn template, thinking history, system prompt."""
from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["EvalSettings", "serialize_history", "strip_thinking", "prompt_hash"]

TEMPLATE_MODES = ("native", "context")
_THINK = re.compile(r"<think>.*?</think>\s*", re.S)


def prompt_hash(text: str) -> str:
    """sha256 of a system prompt template (first 16 hex digits), so reports name the exact prompt."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def strip_thinking(text: str) -> str:
    """Remove ``<think>…</think>`` blocks from an assistant message."""
    return _THINK.sub("", text)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Conditions every reported score records: 3 seeds by default, native template, thinking history kept."""

    seeds: tuple[int, ...] = (0, 1, 2)
    template_mode: str = "native"
    keep_thinking_history: bool = True
    temperature: float = 0.7
    max_new_tokens: int = 128

    def __post_init__(self) -> None:
        if self.template_mode not in TEMPLATE_MODES:
            raise ValueError(f"template_mode must be one of {TEMPLATE_MODES}, got {self.template_mode!r}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))

    def record(self, system_prompt: str) -> dict[str, Any]:
        """What a report stores about these conditions, with the system prompt's hash."""
        return {
            "seeds": list(self.seeds),
            "template_mode": self.template_mode,
            "keep_thinking_history": self.keep_thinking_history,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "system_prompt_sha256": prompt_hash(system_prompt),
        }


def serialize_history(
    system_prompt: str | None, history: Sequence[dict[str, Any]], settings: EvalSettings
) -> list[dict[str, Any]]:
    """Chat messages for the next model turn.

    ``native`` keeps role/content messages for the tokenizer's chat template; ``context`` puts
    the system prompt and the whole dialogue (tool I/O included) into one user turn, as some
    prior work does. Without thinking history, ``<think>`` blocks leave earlier assistant turns.
    """
    msgs = []
    for m in history:
        m = dict(m)
        if m.get("role") == "assistant" and not settings.keep_thinking_history:
            m["content"] = strip_thinking(str(m.get("content", "")))
        msgs.append(m)
    if settings.template_mode == "native":
        return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + msgs
    lines = [system_prompt] if system_prompt else []
    if len(msgs) == 1 and msgs[0].get("role") == "user":
        lines.append(str(msgs[0].get("content", "")))
    else:
        lines.append("Conversation so far:")
        lines += [f"[{m.get('role')}] {m.get('content', '')}" for m in msgs]
    return [{"role": "user", "content": "\n\n".join(lines)}]
