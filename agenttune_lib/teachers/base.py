"""What every teacher shares: its identity for provenance, and scripted turns rendered as the student's own tokens.

An expert teacher is a scripted policy: it decides each turn's text from ground truth, and
returns a ``Generation`` whose ids are exactly what the student's chat template and
tokenizer produce for that turn, so the spine logs full-tier episodes the student can be
trained on token for token (TEAM contract 7).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agenttune_lib.events import render_tool_call
from agenttune_lib.spine.state import Generation

__all__ = ["TeacherInfo", "scripted_generation", "tool_call_text", "count_assistant_turns"]


@dataclasses.dataclass(frozen=True)
class TeacherInfo:
    """Which teacher produced a trajectory: ``kind`` (expert_tau2, expert_qa, llm_endpoint, self_rejection) and ``version``."""

    kind: str
    version: str

    def to_dict(self) -> dict[str, str]:
        return {"teacher_kind": self.kind, "teacher_version": self.version}


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def scripted_generation(tokenizer: Any, messages: Sequence[dict[str, str]], text: str) -> Generation:
    """``text`` as the next assistant turn after ``messages``, with the ids the student's chat template renders.

    ``prompt_ids`` are the prompt with the generation header (what the student would be fed);
    ``completion_ids`` are the turn's body up to and including the template's end-of-turn
    token (what the student would have to generate to say exactly this).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("scripted_generation needs a tokenizer with a chat template (the student's)")
    msgs = [dict(m) for m in messages]
    prompt_text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    full_text = tokenizer.apply_chat_template(msgs + [{"role": "assistant", "content": text}], tokenize=False)
    if not full_text.startswith(prompt_text):
        raise ValueError("the student's chat template is not prefix-stable: the assistant turn does not extend the prompt")
    turn = full_text[len(prompt_text):]
    if not turn.startswith(text):
        raise ValueError(f"the chat template rewrites the assistant turn; cannot script it exactly: {turn[:80]!r}")
    end = getattr(tokenizer, "eos_token", None)
    tail = turn[len(text):]
    completion = text + (tail[: tail.index(end) + len(end)] if end and end in tail else "")
    return Generation(text=text, prompt_ids=_encode(tokenizer, prompt_text), completion_ids=_encode(tokenizer, completion), logprobs=None)


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """The tool-call turn exactly as the spine renders a TOOL_CALL back into the prompt."""
    return render_tool_call({"name": name, "arguments": arguments})


def count_assistant_turns(messages: Sequence[dict[str, str]]) -> int:
    """How many assistant turns the episode holds so far (the scripted policy's step index)."""
    return sum(1 for m in messages if m.get("role") == "assistant")
