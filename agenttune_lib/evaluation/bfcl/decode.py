"""Decode a model's text into BFCL's call form ``[{name: {param: value}}]``.

Accepts BFCL's default Python-list syntax ``[f(a=1), g(b='x')]`` (parsed with ``ast``, never
evaluated), the platform's ``<tool_call>{json}</tool_call>`` contract, and a JSON list of
``{"name"|"function", "arguments"|"parameters"}`` objects.
"""
from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any

from agenttune_lib.tools.parsing import parse_tool_calls

__all__ = ["BFCLDecodeError", "decode_calls", "decode_strict", "decode_platform", "is_empty_decoded", "render_python_calls"]


class BFCLDecodeError(ValueError):
    """The text is not a function call in any accepted format."""


_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}


def _value(node: ast.AST) -> Any:
    """A literal value from an argument node, following BFCL's decoder (names become strings)."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _value(node.operand)
        if not isinstance(inner, (int, float)):
            raise BFCLDecodeError(f"unary sign on a non-number: {ast.unparse(node)}")
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _value(node.left), _value(node.right)
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (left, right)):
            raise BFCLDecodeError(f"arithmetic on non-numbers: {ast.unparse(node)}")
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise BFCLDecodeError(f"exponent too large: {ast.unparse(node)}")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return ast.unparse(node)
    if isinstance(node, ast.Call):
        return _call(node) if node.keywords else ast.unparse(node)
    raise BFCLDecodeError(f"unsupported argument expression: {ast.unparse(node)[:80]}")


def _func_name(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise BFCLDecodeError(f"function name is not a dotted name: {ast.unparse(node)}")
    parts.append(node.id)
    return ".".join(reversed(parts))


def _call(node: ast.Call) -> dict[str, dict[str, Any]]:
    return {_func_name(node.func): {kw.arg: _value(kw.value) for kw in node.keywords if kw.arg is not None}}


def _decode_python(text: str) -> list[dict[str, dict[str, Any]]]:
    body = text.strip("`\n ")
    if not body.startswith("["):
        body = "[" + body
    if not body.endswith("]"):
        body = body + "]"
    try:
        tree = ast.parse(body.strip().strip("'"), mode="eval")
    except SyntaxError as exc:
        raise BFCLDecodeError(f"not a Python call list: {exc.msg}") from None
    node = tree.body
    elts = [node] if isinstance(node, ast.Call) else getattr(node, "elts", None)
    if elts is None:
        raise BFCLDecodeError("not a list of calls")
    calls = []
    for elem in elts:
        if not isinstance(elem, ast.Call):
            raise BFCLDecodeError(f"list item is not a call: {ast.unparse(elem)[:80]}")
        calls.append(_call(elem))
    return calls


def _decode_json(data: Any) -> list[dict[str, dict[str, Any]]]:
    items = data if isinstance(data, list) else [data]
    calls = []
    for item in items:
        if not isinstance(item, dict):
            raise BFCLDecodeError(f"JSON call is not an object: {item!r:.80}")
        name = item.get("name", item.get("function"))
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                raise BFCLDecodeError(f"arguments of {name!r} are not JSON") from None
        if not isinstance(name, str) or not isinstance(args, dict):
            raise BFCLDecodeError(f"JSON call needs a string name and object arguments: {item!r:.80}")
        calls.append({name: args})
    return calls


def decode_calls(text: str) -> list[dict[str, dict[str, Any]]]:
    """Calls in ``text`` as ``[{name: {param: value}}]``; raises ``BFCLDecodeError`` when it holds no call syntax."""
    if not isinstance(text, str):
        raise BFCLDecodeError(f"model output must be text, got {type(text).__name__}")
    if "<tool_call>" in text or "<function=" in text:
        parsed = parse_tool_calls(text)
        if parsed.errors:
            raise BFCLDecodeError(parsed.errors[0].message)
        return [{c.name: dict(c.arguments)} for c in parsed.calls]
    match = re.search(r"<TOOLCALL>(.*?)</TOOLCALL>", text, re.S)
    if match:
        text = match.group(1)
    fenced = re.fullmatch(r"\s*```(?:json|python)?\s*(.*?)\s*```\s*", text, re.S)
    if fenced:
        text = fenced.group(1)
    stripped = text.strip()
    if stripped.startswith(("{", "[{")):
        try:
            return _decode_json(json.loads(stripped))
        except json.JSONDecodeError:
            pass
    return _decode_python(stripped)


def decode_strict(text: str) -> list[dict[str, dict[str, Any]]]:
    """BFCL's own prompting decoder: the reply (markdown fence removed) must be a Python list of calls; nothing else is accepted."""
    if not isinstance(text, str):
        raise BFCLDecodeError(f"model output must be text, got {type(text).__name__}")
    body = text.strip()
    fenced = re.fullmatch(r"```(?:python)?\s*(.*?)\s*```", body, re.S)
    if fenced:
        body = fenced.group(1)
    return _decode_python(body)


def decode_platform(text: str) -> list[dict[str, dict[str, Any]]]:
    """The platform's contract: ``<tool_call>{json}</tool_call>`` blocks; a reply without one holds no call (``[]``)."""
    if not isinstance(text, str):
        raise BFCLDecodeError(f"model output must be text, got {type(text).__name__}")
    parsed = parse_tool_calls(text)
    if parsed.errors:
        raise BFCLDecodeError(parsed.errors[0].message)
    return [{c.name: dict(c.arguments)} for c in parsed.calls]


def is_empty_decoded(decoded: Any) -> bool:
    """BFCL's relevance rule: ``[]``, ``[{}]`` or anything not in call form is no call."""
    if not isinstance(decoded, list) or not all(isinstance(c, dict) and all(isinstance(v, dict) for v in c.values()) for c in decoded):
        return True
    return len(decoded) == 0 or (len(decoded) == 1 and len(decoded[0]) == 0)


def render_python_calls(calls: list[dict[str, dict[str, Any]]]) -> str:
    """Calls in BFCL's Python-list syntax (``repr`` of each value), the inverse of ``decode_calls``."""
    parts = []
    for call in calls:
        for name, args in call.items():
            parts.append(f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")")
    return "[" + ", ".join(parts) + "]"
