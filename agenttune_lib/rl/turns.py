"""Token-faithful episodes: each assistant turn keeps the ids it sampled; tool turns are masked context ids.

The trainer computes its loss on exactly the ids ``generate`` returned: nothing is decoded,
re-rendered and re-tokenized. Only the environment's context (tool results and the next
turn's role header) is rendered by the chat template, and it never carries loss.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["Turn", "EpisodeTokens", "render_prompt_ids", "context_ids_after_turn", "template_supports_tools", "with_tool_listing", "observation_messages"]


@dataclasses.dataclass
class Turn:
    """One sampled assistant turn: its ids (the end-of-turn token included when sampled), logprobs, and how it ended."""

    ids: list[int]
    logprobs: list[float]
    finished: bool
    text: str

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.ids):
            raise ValueError(f"Turn: {len(self.logprobs)} logprobs for {len(self.ids)} sampled ids")


@dataclasses.dataclass
class EpisodeTokens:
    """An episode as the trainer sees it: prompt ids, then sampled and context ids with a loss mask (1 = sampled)."""

    prompt_ids: list[int]
    completion_ids: list[int] = dataclasses.field(default_factory=list)
    env_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turn_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    truncated: bool = False

    def add_turn(self, turn: Turn) -> tuple[int, int]:
        start = len(self.completion_ids)
        self.completion_ids += list(turn.ids)
        self.env_mask += [1] * len(turn.ids)
        self.logprobs += list(turn.logprobs)
        span = (start, len(self.completion_ids))
        self.turn_spans.append(span)
        self.truncated = not turn.finished
        return span

    def add_context(self, ids: Sequence[int]) -> tuple[int, int]:
        start = len(self.completion_ids)
        self.completion_ids += list(ids)
        self.env_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        return start, len(self.completion_ids)

    def next_prompt(self) -> list[int]:
        """The ids the next turn is generated from: the exact prefix so far."""
        return self.prompt_ids + self.completion_ids

    def clip(self, max_length: int | None) -> None:
        """Cut the episode to ``max_length`` tokens in all; a cut episode counts as truncated."""
        if max_length is None or len(self.prompt_ids) + len(self.completion_ids) <= max_length:
            return
        keep = max_length - len(self.prompt_ids)
        if keep <= 0:
            raise ValueError(
                f"the prompt alone is {len(self.prompt_ids)} tokens, at or over max_length={max_length}: no room for a reply "
                "(raise max_length or shorten the tool listing / system prompt)"
            )
        self.completion_ids, self.env_mask, self.logprobs = self.completion_ids[:keep], self.env_mask[:keep], self.logprobs[:keep]
        self.turn_spans = [(min(s, keep), min(e, keep)) for s, e in self.turn_spans]
        self.truncated = True


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, gen: bool) -> str:
    kwargs = {"tools": list(tools)} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kwargs)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a ``tools=`` listing (Qwen/Hermes-style templates do; plain ChatML does not)."""
    probe = [{"role": "user", "content": "x"}]
    schema = [{"type": "function", "function": {"name": "probe_tool_zz", "description": "", "parameters": {"type": "object", "properties": {}}}}]
    try:
        return "probe_tool_zz" in _render(tokenizer, probe, schema, True)
    except Exception:
        return False


def with_tool_listing(messages: list[dict[str, Any]], tool_schemas: Sequence[dict[str, Any]], tool_format: str = "json") -> list[dict[str, Any]]:
    """For templates without a tool format: the spine's tool contract (schemas + call syntax) leads the system message.

    ``tool_format="compact"`` lists one signature line per tool (many tools on a small context)."""
    from agenttune_lib.spine.prompts import system_prompt

    msgs = [dict(m) for m in messages]
    listing = system_prompt(list(tool_schemas), tool_format=tool_format)
    if msgs and msgs[0].get("role") == "system":
        msgs[0]["content"] = listing + "\n\n" + str(msgs[0].get("content", ""))
    else:
        msgs.insert(0, {"role": "system", "content": listing})
    return msgs


def render_prompt_ids(
    tokenizer: Any, messages: list[dict[str, Any]], tool_schemas: Sequence[dict[str, Any]] | None = None, tool_format: str = "json"
) -> tuple[list[int], list[dict[str, Any]], Sequence[dict[str, Any]] | None]:
    """First-turn prompt ids with the tools shown in the template's own format (or the spine's listing).

    Returns (ids, the messages as rendered, the ``tools=`` passed to the template or None).
    """
    tools = list(tool_schemas or [])
    template_tools: Sequence[dict[str, Any]] | None = None
    if tools and template_supports_tools(tokenizer):
        template_tools = tools
    elif tools:
        messages = with_tool_listing(messages, tools, tool_format)
    text = _render(tokenizer, messages, template_tools, True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]), messages, template_tools


def context_ids_after_turn(
    tokenizer: Any,
    convo: list[dict[str, Any]],
    assistant: dict[str, Any],
    observations: list[dict[str, Any]],
    template_tools: Sequence[dict[str, Any]] | None = None,
    sampled_eos: bool = True,
) -> list[int]:
    """Ids the environment appends after a sampled assistant turn: the template's end of that turn
    (less the end-of-turn token the model already sampled), the observations, and the next assistant header.
    """
    before = _render(tokenizer, convo, template_tools, True)
    head = _render(tokenizer, convo + [assistant], template_tools, False)
    full = _render(tokenizer, convo + [assistant] + observations, template_tools, True)
    if not head.startswith(before) or not full.startswith(head):
        raise ValueError("chat template is not prefix-stable across turns; cannot append tool context to sampled ids")
    rest = head[len(before):]
    content = str(assistant.get("content", ""))
    at = rest.find(content) if content else 0
    if at < 0:
        raise ValueError("chat template rewrites the assistant content; cannot locate the end of the sampled turn")
    trailer = rest[at + len(content):]
    eos = tokenizer.eos_token or ""
    if sampled_eos and eos and trailer.startswith(eos):
        trailer = trailer[len(eos):]
    text = trailer + full[len(head):]
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def observation_messages(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-result events as chat messages (role ``tool``)."""
    out = []
    for ev in results:
        payload = ev["payload"]
        content = payload.get("content", "")
        out.append({"role": "tool", "content": content if isinstance(content, str) else json.dumps(content), "name": payload.get("name", "")})
    return out
