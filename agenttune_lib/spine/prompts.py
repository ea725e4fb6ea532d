"""Chat messages a strategy sends its model: a tool-contract system prompt plus the episode so far."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.events import Event, EventKind, render_tool_call
from agenttune_lib.spine.state import Generation

__all__ = ["ModelFn", "system_prompt", "messages_from_events", "call_model", "render_prompt"]

#: A model: chat messages (or a prompt string) in, text (or a Generation) out.
ModelFn = Callable[[Any], "str | Generation"]

TOOL_CONTRACT = (
    "You are a helpful agent that solves the user's task by calling tools.\n"
    "Available tools:\n<tools>\n{tools}\n</tools>\n"
    "To call a tool, reply with exactly one line "
    '<tool_call>{{"name": "<tool name>", "arguments": {{"<parameter>": "<value>"}}}}</tool_call> and nothing after it. '
    "Tool results come back in the next message. When the task is done, reply with the final answer "
    "as plain text without a tool call."
)


def _compact_signature(fn: dict[str, Any]) -> str:
    params = fn.get("parameters", {}) or {}
    required = set(params.get("required", []))
    names = [p if p in required else f"{p}?" for p in (params.get("properties") or {})]
    return f"{fn['name']}({', '.join(names)}): {fn.get('description', '')}"


def system_prompt(
    tools: Sequence[dict[str, Any]], instructions: str | None = None, extra: Sequence[str] = (), tool_format: str = "json"
) -> str:
    """The tool-contract system prompt; ``instructions`` (e.g. a domain policy) and ``extra`` notes follow it.

    ``tool_format="compact"`` lists one ``name(param, optional?): description`` line per tool,
    a fraction of the JSON schemas' tokens for small-context or CPU-bound models.
    """
    if tool_format not in ("json", "compact"):
        raise ValueError(f"tool_format must be 'json' or 'compact', got {tool_format!r}")
    if tool_format == "compact":
        listing = "\n".join(_compact_signature(t["function"]) for t in tools)
    else:
        listing = "\n".join(
            json.dumps(
                {"name": t["function"]["name"], "description": t["function"].get("description", ""), "parameters": t["function"].get("parameters", {})},
                sort_keys=True,
            )
            for t in tools
        )
    parts = [TOOL_CONTRACT.format(tools=listing)]
    if instructions:
        parts.append(instructions.strip())
    parts.extend(e.strip() for e in extra if e and e.strip())
    return "\n\n".join(parts)


def _content(event: Event) -> str:
    for key in ("content", "text", "observation"):
        if key in event.payload:
            value = event.payload[key]
            # ensure_ascii=False: a passage's text reaches the model as written, not as \\uXXXX escapes
            return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    return json.dumps(event.payload, sort_keys=True, ensure_ascii=False)


def messages_from_events(system: str | None, events: Sequence[Event], max_tool_chars: int | None = None) -> list[dict[str, str]]:
    """Chat messages for the episode: observations as user turns, agent events merged into assistant turns.

    ``max_tool_chars`` clips long tool results in the prompt (the log keeps them whole).
    """
    messages: list[dict[str, str]] = []
    if system:
        messages.append({"role": "system", "content": system})
    assistant: list[str] = []

    def flush() -> None:
        if assistant:
            messages.append({"role": "assistant", "content": "\n".join(assistant)})
            assistant.clear()

    for event in events:
        kind = event.kind
        if kind in (EventKind.REASONING, EventKind.TEXT):
            assistant.append(_content(event))
        elif kind is EventKind.TOOL_CALL:
            assistant.append(render_tool_call(event.payload))
        elif kind is EventKind.TOOL_RESULT:
            flush()
            body = _content(event)
            if max_tool_chars is not None and len(body) > max_tool_chars:
                body = body[:max_tool_chars] + f"… [{len(body) - max_tool_chars} more characters]"
            messages.append({"role": "tool", "content": body})
        elif kind is EventKind.OBSERVATION:
            flush()
            messages.append({"role": "user", "content": _content(event)})
        elif kind is EventKind.MEMORY_OP and event.payload.get("op") == "recall":
            flush()
            messages.append({"role": "user", "content": "Relevant memory:\n" + _content(event)})
    flush()
    return messages


def render_prompt(messages: Sequence[dict[str, str]]) -> str:
    """Plain-text rendering for models that take a prompt string instead of messages."""
    body = "\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages)
    return body + "\nASSISTANT:"


def call_model(model: ModelFn, messages: list[dict[str, str]], input_format: str = "messages") -> tuple[str, Generation]:
    """Call the injected model; returns its text and a Generation that remembers the messages it came from.

    A model that returns plain text (light tier) gets a token-less Generation; one that
    returns a Generation (full tier) keeps its ids and logprobs exactly as returned.
    """
    arg: Any = messages if input_format == "messages" else render_prompt(messages)
    out = model(arg)
    sent = [dict(m) for m in messages]
    if isinstance(out, Generation):
        gen = dataclasses.replace(out, messages=sent)  # a copy: the model may reuse its object
    elif isinstance(out, str):
        gen = Generation(out, messages=sent)
    else:
        raise TypeError(f"model returned {type(out).__name__}; expected str or Generation")
    return gen.text, gen
