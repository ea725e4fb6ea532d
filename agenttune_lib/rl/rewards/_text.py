"""Views of a completion that reward functions share: final text, messages, tool calls, numbers."""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_NUM = re.compile(r"[-+]?\$?\(?\d[\d,]*(?:\.\d+)?\)?\s*(?:%|percent|million|billion|thousand|k\b|m\b|bn\b)?", re.I)
_WORD = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    "a an the of and or to in on at for with by from is are was were be been it this that these those as "
    "what which who whom how why when where do does did not no yes i you he she we they them his her its our "
    "their there here than then so if but about into over under can could should would will may might must".split()
)


def messages_of(completion: Any) -> list[dict[str, Any]]:
    """A completion as chat messages: a string is one assistant message."""
    if isinstance(completion, str):
        return [{"role": "assistant", "content": completion}]
    if isinstance(completion, Mapping):
        return [dict(completion)]
    if isinstance(completion, Sequence):
        return [dict(m) if isinstance(m, Mapping) else {"role": "assistant", "content": str(m)} for m in completion]
    raise TypeError(f"completion must be text or a list of chat messages, got {type(completion).__name__}")


def content_text(message: Mapping[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return " ".join(c.get("text", "") if isinstance(c, Mapping) else str(c) for c in content)
    return json.dumps(content, default=str)


def full_text(completion: Any) -> str:
    """Every assistant message's text joined: where tool calls and answers are looked for."""
    return "\n".join(content_text(m) for m in messages_of(completion) if m.get("role", "assistant") == "assistant")


def final_answer(completion: Any) -> str:
    """The final answer: the last assistant message's text outside any tool call, ``<answer>`` body if tagged."""
    from agenttune_lib.tools.parsing import parse_tool_calls

    msgs = [m for m in messages_of(completion) if m.get("role", "assistant") == "assistant"]
    text = content_text(msgs[-1]) if msgs else ""
    if "<tool_call>" in text or "<function=" in text:
        text = parse_tool_calls(text).text
    tagged = re.search(r"<answer>(.*?)</answer>", text, re.S)
    if tagged:
        return tagged.group(1).strip()
    marker = re.search(r"(?:final answer|answer)\s*[:：]\s*(.+)", text, re.I | re.S)
    return (marker.group(1) if marker else text).strip()


def tool_results(completion: Any, retrieved: Any = None) -> list[str]:
    """Tool outputs seen by the agent: ``role: tool`` messages plus any ``retrieved`` passages given."""
    out = [content_text(m) for m in messages_of(completion) if m.get("role") == "tool"]
    if retrieved is not None:
        if isinstance(retrieved, str):
            out.append(retrieved)
        else:
            out.extend(str(r.get("text", r.get("content", r))) if isinstance(r, Mapping) else str(r) for r in retrieved)
    return out


def tool_calls(completion: Any) -> tuple[list[Any], int]:
    """(well-formed calls, malformed attempts) across assistant messages, via the spine's parser."""
    from agenttune_lib.tools.parsing import parse_tool_calls

    calls: list[Any] = []
    errors = 0
    for m in messages_of(completion):
        if m.get("role", "assistant") != "assistant":
            continue
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", tc) if isinstance(tc, Mapping) else {}
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    errors += 1
                    continue
            calls.append(_Call(str(fn.get("name", "")), dict(args) if isinstance(args, Mapping) else {}))
        parsed = parse_tool_calls(content_text(m))
        calls.extend(_Call(c.name, c.arguments) for c in parsed.calls)
        errors += len(parsed.errors)
    return calls, errors


class _Call:
    __slots__ = ("name", "arguments")

    def __init__(self, name: str, arguments: dict[str, Any]) -> None:
        self.name = name
        self.arguments = arguments

    def key(self) -> str:
        return f"{self.name}:{json.dumps(self.arguments, sort_keys=True, default=str)}"


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in STOPWORDS and len(w) > 1}


_SCALE = {"%": 0.01, "percent": 0.01, "thousand": 1e3, "k": 1e3, "million": 1e6, "m": 1e6, "billion": 1e9, "bn": 1e9}


def parse_number(text: str, scaled: bool = False) -> float | None:
    """First number in ``text``; with ``scaled``, units (%, million, …) and accounting negatives apply."""
    nums = parse_numbers(text, scaled=scaled)
    return nums[0] if nums else None


def parse_numbers(text: str, scaled: bool = False) -> list[float]:
    out = []
    for m in _NUM.finditer(str(text)):
        raw = m.group(0).strip()
        neg = raw.startswith("-") or (raw.startswith("(") and raw.endswith(")"))
        digits = re.search(r"\d[\d,]*(?:\.\d+)?", raw)
        if not digits:
            continue
        try:
            value = float(digits.group(0).replace(",", ""))
        except ValueError:
            continue
        if scaled:
            unit = re.search(r"(%|percent|million|billion|thousand|k|m|bn)\s*$", raw, re.I)
            if unit:
                value *= _SCALE[unit.group(1).lower()]
        out.append(-value if neg else value)
    return out


def per_item(kwargs: Mapping[str, Any], key: str, n: int, required: bool, fn_name: str) -> list[Any]:
    """A per-completion kwarg column (TRL passes dataset columns as lists); clear error when required and absent."""
    value = kwargs.get(key)
    if value is None:
        if required:
            raise ValueError(f"{fn_name} needs the {key!r} column (one value per completion); it was not passed")
        return [None] * n
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        return [value] * n
    if len(value) != n:
        raise ValueError(f"{fn_name}: {key!r} has {len(value)} values for {n} completions")
    return list(value)
