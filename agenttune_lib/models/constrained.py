"""Structured decoding: transformers LogitsProcessors that only let a model emit JSON valid against a schema,
or a ``<tool_call>{...}</tool_call>`` naming a real tool with valid arguments (or plain text).

Why xgrammar: it is verified here on CPU with SmolLM2-135M (no measurable per-token slowdown, STACK.md), it compiles a
JSON schema into a token mask once per (tokenizer, schema) with bounded strings/numbers/arrays (so decoding provably
ends within a computed token budget), and it ships a transformers LogitsProcessor.
"""
from __future__ import annotations

import copy
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "json_schema_logits_processor",
    "tool_call_schema",
    "tool_call_logits_processor",
    "decoding_schema",
    "schema_token_budget",
    "DEFAULT_MAX_STRING",
]

#: Strings without ``maxLength`` are capped at this many characters while decoding, so output is bounded.
DEFAULT_MAX_STRING = 160
#: Arrays without ``maxItems`` are capped at this many items while decoding.
DEFAULT_MAX_ITEMS = 8
#: Characters budgeted for a number without both bounds, or a free-form value.
_FREE_NUMBER_CHARS = 24
_FREE_VALUE_CHARS = 256

_lock = threading.Lock()
_compilers: dict[tuple[int, int], tuple[Any, Any]] = {}
_control_ids: dict[tuple[int, int, str], tuple[Any, Any]] = {}


def _compiler(tokenizer: Any, vocab_size: int | None) -> Any:
    """One xgrammar GrammarCompiler per (tokenizer, vocab size); compiled grammars are cached inside it."""
    import xgrammar as xgr

    size = int(vocab_size) if vocab_size is not None else len(tokenizer)
    key = (id(tokenizer), size)
    with _lock:
        hit = _compilers.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=size)
        compiler = xgr.GrammarCompiler(info, max_threads=2)
        _compilers[key] = (tokenizer, compiler)
        return compiler


def _control_token_ids(tokenizer: Any, vocab_size: int | None, keep: str = "") -> Any:
    """Ids of tokens whose text holds a raw control character (U+0000-U+001F).

    xgrammar's bounded-string rule admits them, but strict JSON does not, and compact JSON never needs one
    outside a string; masking them keeps every constrained reply parseable by ``json.loads``.
    """
    import torch

    size = int(vocab_size) if vocab_size is not None else len(tokenizer)
    key = (id(tokenizer), size, keep)
    with _lock:
        hit = _control_ids.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    bad = []
    for i in range(min(size, len(tokenizer))):
        if i in special:
            continue
        text = tokenizer.decode([i])
        if any(ord(ch) < 0x20 and ch not in keep for ch in text):
            bad.append(i)
    ids = torch.tensor(bad, dtype=torch.long)
    with _lock:
        _control_ids[key] = (tokenizer, ids)
    return ids


def _processor(compiled: Any, banned: Any) -> Any:
    """xgrammar's HF processor, then the control-character mask; one instance per ``generate()`` call."""
    import transformers
    import xgrammar as xgr

    class ConstrainedLogitsProcessor(transformers.LogitsProcessor):
        """Grammar mask (xgrammar) plus a mask of raw control-character tokens."""

        def __init__(self) -> None:
            self.grammar = xgr.contrib.hf.LogitsProcessor(compiled)
            self.banned = banned

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            scores = self.grammar(input_ids, scores)
            if self.banned.numel():
                scores[:, self.banned.to(scores.device)] = float("-inf")
            return scores

    return ConstrainedLogitsProcessor()


def _check_schema(schema: Any, what: str = "schema") -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        raise TypeError(f"{what} must be a JSON schema object (a dict), got {type(schema).__name__}")
    try:
        json.dumps(schema)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serializable: {exc}") from None
    return dict(schema)


def decoding_schema(schema: Mapping[str, Any], max_string: int = DEFAULT_MAX_STRING, max_items: int = DEFAULT_MAX_ITEMS) -> dict[str, Any]:
    """The schema used for decoding: the same constraints, plus ``maxLength``/``maxItems`` where missing, so that
    every value the grammar admits has a bounded length (a model cannot ramble inside a string forever)."""

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: walk(v) for k, v in node.items()}
        kinds = out.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if "string" in kinds and not {"enum", "const", "pattern", "format", "maxLength"} & out.keys():
            out["maxLength"] = max(int(out.get("minLength", 0)), max_string)
        if "array" in kinds and "maxItems" not in out:
            out["maxItems"] = max(int(out.get("minItems", 0)), max_items)
        return out

    return walk(copy.deepcopy(dict(schema)))


def _max_chars(node: Any, depth: int = 0) -> int:
    """Upper bound of the compact JSON length (``", "`` and ``": "`` separators) of any value valid for ``node``."""
    if depth > 16 or not isinstance(node, Mapping) or not node:
        return _FREE_VALUE_CHARS
    if "const" in node:
        return len(json.dumps(node["const"]))
    if "enum" in node:
        return max((len(json.dumps(v)) for v in node["enum"]), default=4)
    for key in ("anyOf", "oneOf"):
        if key in node:
            return max((_max_chars(n, depth + 1) for n in node[key]), default=_FREE_VALUE_CHARS)
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    best = 0
    for kind in kinds:
        if kind == "string":
            # Escapes (\uXXXX) can make one character six; plain characters dominate model output.
            best = max(best, 2 + int(node.get("maxLength", DEFAULT_MAX_STRING)) * 2)
        elif kind in ("integer", "number"):
            lo, hi = node.get("minimum"), node.get("maximum")
            if lo is not None and hi is not None:
                width = max(len(str(int(lo))), len(str(int(hi)))) + 1
                best = max(best, width if kind == "integer" else width + 8)
            else:
                best = max(best, _FREE_NUMBER_CHARS)
        elif kind == "boolean":
            best = max(best, 5)
        elif kind == "null":
            best = max(best, 4)
        elif kind == "array":
            items = int(node.get("maxItems", DEFAULT_MAX_ITEMS))
            best = max(best, 2 + items * (_max_chars(node.get("items") or {}, depth + 1) + 2))
        elif kind == "object" or (kind is None and "properties" in node):
            props = node.get("properties") or {}
            if not props:
                best = max(best, _FREE_VALUE_CHARS)
            else:
                best = max(best, 2 + sum(len(json.dumps(k)) + 4 + _max_chars(v, depth + 1) for k, v in props.items()))
        else:
            best = max(best, _FREE_VALUE_CHARS)
    return best or _FREE_VALUE_CHARS


def schema_token_budget(schema: Mapping[str, Any], slack: int = 8, cap: int = 2048) -> int:
    """``max_new_tokens`` that lets any value of ``decoding_schema(schema)`` finish: every token adds at least one
    character, so the longest compact serialization (plus end-of-sequence and slack) bounds the token count."""
    return min(cap, _max_chars(decoding_schema(schema)) + slack)


def json_schema_logits_processor(tokenizer: Any, schema: dict, vocab_size: int | None = None, bound: bool = True) -> Any:
    """A fresh transformers LogitsProcessor (xgrammar) constraining a reply to compact JSON valid against ``schema``.

    Use one per ``generate()`` call (it keeps per-sequence matcher state). ``vocab_size`` is the model's logits
    width (``model.config.vocab_size``) when it is larger than the tokenizer. With ``bound`` the decoding schema
    caps unbounded strings and arrays (see ``decoding_schema``).
    """
    schema = _check_schema(schema)
    target = decoding_schema(schema) if bound else schema
    compiled = _compiler(tokenizer, vocab_size).compile_json_schema(json.dumps(target), any_whitespace=False, strict_mode=True)
    return _processor(compiled, _control_token_ids(tokenizer, vocab_size))


def tool_call_schema(tools: Sequence[Mapping[str, Any]]) -> dict:
    """JSON schema of ``{"name": <one of the tools>, "arguments": <that tool's parameters schema>}``.

    A tool is ``{"name", "parameters"}`` or the OpenAI form ``{"type": "function", "function": {...}}``.
    """
    if not tools:
        raise ValueError("tool_call_schema needs at least one tool")
    branches = []
    seen = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise TypeError(f"tool #{i} must be a mapping with 'name' and 'parameters', got {type(tool).__name__}")
        spec = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool #{i} has no name: {dict(tool)!r}")
        if name in seen:
            raise ValueError(f"tool name {name!r} appears twice")
        seen.add(name)
        params = spec.get("parameters") or {"type": "object", "properties": {}}
        params = _check_schema(params, f"tool {name!r} parameters")
        branches.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def tool_call_logits_processor(tokenizer: Any, tools: Sequence[Mapping[str, Any]], allow_text: bool = True, vocab_size: int | None = None) -> Any:
    """A fresh LogitsProcessor constraining a reply to ``<tool_call>{valid call JSON}</tool_call>`` or, with
    ``allow_text``, a plain-text final answer (any text not starting with ``<``)."""
    import xgrammar as xgr

    call = xgr.Grammar.from_json_schema(
        json.dumps(decoding_schema(tool_call_schema(tools))), any_whitespace=False, strict_mode=True
    )
    wrapped = xgr.Grammar.concat(
        xgr.Grammar.from_ebnf('root ::= "<tool_call>"'), call, xgr.Grammar.from_ebnf('root ::= "</tool_call>"')
    )
    grammar = xgr.Grammar.union(wrapped, xgr.Grammar.from_ebnf("root ::= [^<] [^\\0]*")) if allow_text else wrapped
    compiled = _compiler(tokenizer, vocab_size).compile_grammar(grammar)
    # Plain text may hold line breaks (the call's JSON cannot: xgrammar's string rule excludes them).
    return _processor(compiled, _control_token_ids(tokenizer, vocab_size, keep="\n\r" if allow_text else ""))
