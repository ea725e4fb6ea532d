"""Test-only fakes for DECIDE: a schema-driven scripted model (never used by the product)."""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from agenttune_lib.decide import ModelRequest, ScriptedModel


def value_for(schema: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, name: str = "") -> Any:
    """A value valid under ``schema``: enum[0], true, the midpoint of a numeric range, a short string."""
    overrides = overrides or {}
    if name in overrides:
        return overrides[name]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties", {})
        return {k: value_for(v, overrides, k) for k, v in props.items()}
    if kind == "array":
        item = schema.get("items", {"type": "string"})
        return [] if schema.get("minItems", 0) == 0 and item.get("type") != "string" else [value_for(item, overrides)] * max(1, schema.get("minItems", 1))
    if kind == "boolean":
        return True
    if kind in ("number", "integer"):
        lo, hi = schema.get("minimum", 0), schema.get("maximum", None)
        mid = (lo + hi) / 2 if hi is not None else lo + 1
        return int(mid) if kind == "integer" else round(float(mid), 3)
    if kind == "null":
        return None
    return f"{name or 'text'} value"


def schema_model(overrides: Mapping[str, Any] | None = None, by_stage: Mapping[str, Any] | None = None) -> ScriptedModel:
    """A ScriptedModel answering every request validly from its output_schema or choices.

    ``overrides`` pins field values by property name; ``by_stage`` pins whole replies
    (a string, a dict, or a callable of the request) for given stage ids.
    """
    by_stage = by_stage or {}

    def reply(request: ModelRequest) -> str:
        if request.stage_id in by_stage:
            entry = by_stage[request.stage_id]
            entry = entry(request) if callable(entry) else entry
            return entry if isinstance(entry, str) else json.dumps(entry)
        if request.choices:
            return request.choices[0]
        if request.output_schema is not None:
            return json.dumps(value_for(request.output_schema, overrides))
        return "A short plain-text answer."

    return ScriptedModel(reply)


def replies(fn: Callable[[ModelRequest], Any]) -> ScriptedModel:
    return ScriptedModel(lambda r: (lambda v: v if isinstance(v, str) else json.dumps(v))(fn(r)))
