"""extract_json: direct parse, then fenced block, then balanced-brace scan, for messy LLM output."""
from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["extract_json", "JSONExtractionError"]

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


class JSONExtractionError(ValueError):
    """No JSON value could be recovered from the text."""


def _balanced(text: str, start: int) -> str | None:
    opener = text[start]
    closer = "}" if opener == "{" else "]"
    depth = 0
    in_string = False
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return text[start : i + 1] if ch == closer else None
    return None


def extract_json(text: str) -> Any:
    """The first JSON object or array in ``text``: whole-text parse, then ```json fences, then a brace scan."""
    if not isinstance(text, str):
        raise JSONExtractionError(f"expected model text, got {type(text).__name__}")
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    for block in _FENCE.findall(text):
        try:
            return json.loads(block.strip())
        except json.JSONDecodeError:
            continue
    for match in re.finditer(r"[\{\[]", text):
        candidate = _balanced(text, match.start())
        if candidate is None:
            continue
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    preview = stripped[:80].replace("\n", " ")
    raise JSONExtractionError(f"no JSON object found in model output: {preview!r}")
