"""``{input_text}`` and ``{stage_id.output.field}`` interpolation over the pipeline namespace.

Only identifier paths in braces are references, so JSON examples in a prompt
(``{"decision": …}``) pass through untouched; ``{{`` and ``}}`` are literal braces.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from agenttune_lib.decide.rules import MISSING, lookup_path

__all__ = ["interpolate", "interpolate_value", "references", "InterpolationError"]

_REF = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)\}")


class InterpolationError(KeyError):
    """A ``{reference}`` that names nothing in the pipeline state."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


def references(text: str) -> list[str]:
    """Every ``{path}`` reference in ``text``."""
    return [m.group(1) for m in _REF.finditer(text) if m.group(1)]


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _resolve(path: str, namespace: Mapping[str, Any]) -> Any:
    value = lookup_path(namespace, path)
    if value is MISSING:
        head = path.split(".")[0]
        known = sorted(k for k in namespace if not k.startswith("_"))
        hint = "" if head in namespace else f" (no stage or field {head!r}; known: {known})"
        raise InterpolationError(f"reference {{{path}}} is not in the pipeline state{hint}")
    return value


def interpolate(text: str, namespace: Mapping[str, Any]) -> str:
    """Replace each ``{path}`` in ``text``; raise InterpolationError naming an unknown path."""

    def sub(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        return _render(_resolve(match.group(1), namespace))

    return _REF.sub(sub, text)


def interpolate_value(value: Any, namespace: Mapping[str, Any]) -> Any:
    """Interpolate strings inside lists and mappings; a string that is one whole reference keeps its type."""
    if isinstance(value, str):
        match = _REF.fullmatch(value.strip())
        if match and match.group(1):
            return _resolve(match.group(1), namespace)
        return interpolate(value, namespace)
    if isinstance(value, Mapping):
        return {k: interpolate_value(v, namespace) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [interpolate_value(v, namespace) for v in value]
    return value
