"""Structured decoding (models.constrained): a random-init model under the constraint always emits valid output."""
from __future__ import annotations

import json
import os
import re

import jsonschema
import pytest

from agenttune_lib.models.constrained import (
    decoding_schema,
    json_schema_logits_processor,
    schema_token_budget,
    tool_call_logits_processor,
    tool_call_schema,
)
from agenttune_lib.models.generate import ChatGenerator, GenerationConfig
from agenttune_lib.models.tiny import build_tiny_model

SCHEMA = {
    "type": "object",
    "properties": {
        "decision": {"type": "string", "enum": ["approve", "deny", "escalate"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "reason": {"type": "string", "maxLength": 40},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 4},
        "pep": {"type": "boolean"},
    },
    "required": ["decision", "confidence", "age", "reason", "flags", "pep"],
}

TOOLS = [
    {"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 30}}, "required": ["query"]}},
    {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}},
]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(seed=3)


def test_random_model_under_json_schema_always_yields_schema_valid_json(tiny):
    model, tok = tiny
    budget = schema_token_budget(SCHEMA)
    gen = ChatGenerator(model, tok, GenerationConfig(max_new_tokens=budget, temperature=1.3, stop_strings=(), json_schema=SCHEMA, constrained=True))
    for i in range(4):
        out = gen([{"role": "user", "content": f"case {i}"}])
        value = json.loads(out.text)  # strict JSON: no raw control characters either
        jsonschema.validate(value, SCHEMA)
        assert len(out.completion_ids) <= budget


def test_unconstrained_random_model_does_not_yield_json(tiny):
    """The control: without the processor the same model emits no valid object, so the test above measures the constraint."""
    model, tok = tiny
    gen = ChatGenerator(model, tok, GenerationConfig(max_new_tokens=40, temperature=1.3, stop_strings=()))
    valid = 0
    for i in range(3):
        try:
            jsonschema.validate(json.loads(gen([{"role": "user", "content": f"case {i}"}]).text), SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    assert valid == 0


def test_per_call_override_and_config_errors(tiny):
    model, tok = tiny
    gen = ChatGenerator(model, tok, GenerationConfig(max_new_tokens=schema_token_budget(SCHEMA), stop_strings=()))
    out = gen("x", json_schema=SCHEMA, constrained=True)
    jsonschema.validate(json.loads(out.text), SCHEMA)
    with pytest.raises(ValueError, match="needs json_schema or tool_schemas"):
        gen("x", constrained=True)
    with pytest.raises(ValueError, match="not both"):
        gen("x", constrained=True, json_schema=SCHEMA, tool_schemas=tuple(TOOLS))


def test_tool_call_schema_names_each_tool_with_its_parameters():
    schema = tool_call_schema(TOOLS)
    jsonschema.validate({"name": "search", "arguments": {"query": "q"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "search", "arguments": {"x": 1}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "delete_all", "arguments": {}}, schema)
    with pytest.raises(ValueError, match="at least one tool"):
        tool_call_schema([])
    with pytest.raises(ValueError, match="appears twice"):
        tool_call_schema([TOOLS[0], TOOLS[0]])


def test_random_model_tool_call_or_text(tiny):
    model, tok = tiny
    schema = tool_call_schema(TOOLS)
    budget = schema_token_budget(schema) + len("<tool_call></tool_call>")
    strict = ChatGenerator(model, tok, GenerationConfig(max_new_tokens=budget, temperature=1.0, tool_schemas=tuple(TOOLS), constrained=True, allow_text=False))
    for i in range(3):
        text = strict(f"call {i}").text
        m = re.fullmatch(r"<tool_call>(.*)</tool_call>", text, re.S)
        assert m, text
        jsonschema.validate(json.loads(m.group(1)), schema)
    free = ChatGenerator(model, tok, GenerationConfig(max_new_tokens=30, temperature=1.0, tool_schemas=tuple(TOOLS), constrained=True))
    for i in range(4):
        out = free(f"maybe {i}")
        if out.text.startswith("<tool_call>") and out.text.endswith("</tool_call>"):
            jsonschema.validate(json.loads(out.text[len("<tool_call>"):-len("</tool_call>")]), schema)
        elif out.text.startswith("<"):
            assert out.text.startswith("<tool_call>") and len(out.completion_ids) == 30, out.text  # cut by the budget
        else:
            assert out.text


def test_direct_processors_and_bounds(tiny):
    model, tok = tiny
    assert decoding_schema({"type": "string"})["maxLength"] > 0
    assert decoding_schema({"type": "array", "items": {"type": "integer"}})["maxItems"] > 0
    assert schema_token_budget({"enum": ["a", "bb"]}) < schema_token_budget(SCHEMA)
    p = json_schema_logits_processor(tok, {"type": "boolean"}, vocab_size=model.config.vocab_size)
    q = tool_call_logits_processor(tok, TOOLS, vocab_size=model.config.vocab_size)
    assert callable(p) and callable(q) and p is not json_schema_logits_processor(tok, {"type": "boolean"})
    with pytest.raises(TypeError, match="JSON schema object"):
        json_schema_logits_processor(tok, "not a schema")


def _base_model_dir():
    home = os.environ.get("AGENTTUNE_HOME")
    return os.path.join(home, "models") if home else None


@pytest.mark.slow
def test_smollm2_constrained_reply_is_schema_valid():
    from agenttune_lib.models.base import ensure_base_model, load_base_model

    models = _base_model_dir() or str(pytest.importorskip("tempfile").mkdtemp())
    info = ensure_base_model(models)
    model, tok = load_base_model(info.path)
    schema = {
        "type": "object",
        "properties": {"risk": {"type": "string", "enum": ["low", "medium", "high"]}, "reason": {"type": "string", "maxLength": 60}},
        "required": ["risk", "reason"],
    }
    gen = ChatGenerator(model, tok, GenerationConfig(max_new_tokens=schema_token_budget(schema), json_schema=schema, constrained=True, stop_strings=()))
    out = gen([{"role": "user", "content": "Customer from a sanctioned country wires 90k. Assess the risk as JSON."}])
    jsonschema.validate(json.loads(out.text), schema)
    call = ChatGenerator(model, tok, GenerationConfig(max_new_tokens=80, tool_schemas=tuple(TOOLS), constrained=True, allow_text=False))
    text = call([{"role": "user", "content": "Search for the termination clause."}]).text
    m = re.fullmatch(r"<tool_call>(.*)</tool_call>", text, re.S)
    assert m, text
    jsonschema.validate(json.loads(m.group(1)), tool_call_schema(TOOLS))
