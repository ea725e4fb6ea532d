"""BFCL's parameter schemas (types ``dict``, ``float``, ``tuple``, ``any``) as standard JSON Schema, and argument coercion.

BFCL describes functions with Python-flavoured type names; jsonschema, xgrammar and the
platform's tool contract need JSON Schema. Arguments arrive as a dict or, in the OpenAI form,
as a JSON string.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["to_json_schema", "coerce_arguments"]

_TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array", "int": "integer", "bool": "boolean", "str": "string", "list": "array"}


def to_json_schema(schema: Any) -> Any:
    """A copy of ``schema`` with BFCL type names mapped to JSON Schema's (``any`` drops the type); other keys kept."""
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            if value == "any":
                continue
            out[key] = _TYPE_MAP.get(value, value)
        elif key == "type" and isinstance(value, list):
            out[key] = [_TYPE_MAP.get(v, v) for v in value if v != "any"]
        elif key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, Mapping):
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "anyOf", "oneOf", "allOf", "prefixItems"):
            out[key] = to_json_schema(value)
        else:
            out[key] = value
    return out


def coerce_arguments(args: Any) -> dict[str, Any] | None:
    """Arguments as a dict: a mapping as is, a JSON-object string (the OpenAI form) decoded; anything else None."""
    if isinstance(args, Mapping):
        return dict(args)
    if isinstance(args, str):
        try:
            value = json.loads(args)
        except json.JSONDecodeError:
            return None
        return dict(value) if isinstance(value, Mapping) else None
    return None
