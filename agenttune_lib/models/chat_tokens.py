"""The EventLog's SFT projection in tokens: chat-template rendering with a loss weight per token.

Tokenizer code, kept out of the standard-library EventLog module; the loss mask it applies is the one
``EventLog.as_dataset_rows("sft")`` defines (segment weights per message, headers weight 0).
"""
from __future__ import annotations

from typing import Any

from agenttune_lib.events import EventLog

__all__ = ["tokenize_messages", "token_rows"]


def tokenize_messages(tokenizer: Any, messages: list[dict[str, Any]], weights: list[float]) -> tuple[list[int], list[float]]:
    """Token ids of ``messages`` under the chat template with a weight each, rendered prefix by prefix (headers: 0)."""
    ids, token_weights, rendered = [], [], ""

    def take(text: str, weight: float) -> None:
        """Append the tokens of what ``text`` adds to the rendered prefix, each with ``weight``."""
        nonlocal rendered
        if len(text) > len(rendered):
            chunk = list(tokenizer(text[len(rendered):], add_special_tokens=False)["input_ids"])
            ids.extend(chunk)
            token_weights.extend([weight] * len(chunk))
        rendered = text

    for i, (message, weight) in enumerate(zip(messages, weights)):
        if message["role"] == "assistant" and weight > 0.0:
            try:
                header = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            except Exception:  # templates may reject an empty conversation (i == 0): no header then
                if i:
                    raise
                header = ""
            if header.startswith(rendered):
                take(header, 0.0)
        full = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False, add_generation_prompt=False)
        if not full.startswith(rendered):
            raise ValueError("chat template is not prefix-stable; cannot align the loss mask to message boundaries")
        take(full, weight)
    return ids, token_weights


def token_rows(log: EventLog, tokenizer: Any, max_length: int | None = None) -> list[dict[str, Any]]:
    """``log``'s SFT rows as tokens: ``input_ids``, ``completion_mask`` (1 = loss, TRL's polarity), ``token_weights``."""
    (row,) = log.as_dataset_rows("sft")  # the SFT projection gives one row per log
    ids, weights = tokenize_messages(tokenizer, row["messages"], row["segment_weights"])
    ids, weights = ids[:max_length], weights[:max_length]
    return [{"id": row["id"], "input_ids": ids, "completion_mask": [1 if w > 0.0 else 0 for w in weights],
             "token_weights": weights}]
