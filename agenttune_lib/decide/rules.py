"""The rules grammar: a hand-written AST walker, never ``eval``.

Allowed: comparisons ``== != < <= > >=`` (chains too), ``and``/``or``/``not``, dotted
lookups into the pipeline namespace (``extract.output.age``), and JSON literals (strings,
numbers, ``true``/``false``/``null`` or their Python spellings, lists, objects). Anything
else — calls, subscripts, arithmetic, lambdas, comprehensions, private names — is rejected
when the template is loaded.
"""
from __future__ import annotations

import ast
import dataclasses
import operator
from collections.abc import Mapping
from typing import Any

from agenttune_lib.decide.errors import RuleError

__all__ = ["Rule", "compile_rule", "evaluate_rule", "json_equal", "lookup_path", "MISSING"]

MAX_RULE_CHARS = 2000
MAX_DEPTH = 32

_JSON_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


def lookup_path(namespace: Mapping[str, Any], path: str) -> Any:
    """Follow a dotted path through nested mappings; ``MISSING`` when any step is absent."""
    value: Any = namespace
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        else:
            return MISSING
    return value


@dataclasses.dataclass(frozen=True)
class Rule:
    """A validated condition: its source text and the checked expression tree."""

    source: str
    tree: ast.Expression = dataclasses.field(repr=False, compare=False)

    def evaluate(self, namespace: Mapping[str, Any]) -> bool:
        return evaluate_rule(self, namespace)


def _dotted(node: ast.AST, source: str) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise RuleError(f"rule {source!r}: attribute access is allowed only on dotted names, got {type(node).__name__}")
    parts.append(node.id)
    parts.reverse()
    for part in parts:
        if part.startswith("_"):
            raise RuleError(f"rule {source!r}: private name {part!r} is not allowed")
    return ".".join(parts)


def _check(node: ast.AST, source: str, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise RuleError(f"rule {source!r}: expression nests deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Expression):
        _check(node.body, source, depth + 1)
    elif isinstance(node, ast.BoolOp):
        if not isinstance(node.op, (ast.And, ast.Or)):
            raise RuleError(f"rule {source!r}: boolean operator {type(node.op).__name__} is not allowed")
        for value in node.values:
            _check(value, source, depth + 1)
    elif isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            _check(node.operand, source, depth + 1)
        elif isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) and _is_number(node.operand.value):
            return
        else:
            raise RuleError(f"rule {source!r}: unary operator {type(node.op).__name__} is not allowed")
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _COMPARE:
                raise RuleError(f"rule {source!r}: comparison {type(op).__name__} is not allowed (only == != < <= > >=)")
        _check(node.left, source, depth + 1)
        for comparator in node.comparators:
            _check(comparator, source, depth + 1)
    elif isinstance(node, ast.Attribute):
        _dotted(node, source)
    elif isinstance(node, ast.Name):
        if node.id.startswith("_"):
            raise RuleError(f"rule {source!r}: private name {node.id!r} is not allowed")
    elif isinstance(node, ast.Constant):
        if not (node.value is None or isinstance(node.value, (str, bool, int, float))):
            raise RuleError(f"rule {source!r}: literal {node.value!r} is not a JSON literal")
    elif isinstance(node, (ast.List, ast.Tuple)):
        for element in node.elts:
            _check_literal(element, source, depth + 1)
    elif isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if key is None or not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise RuleError(f"rule {source!r}: object keys must be string literals")
            _check_literal(value, source, depth + 1)
    elif isinstance(node, ast.Call):
        raise RuleError(f"rule {source!r}: function calls are not allowed")
    elif isinstance(node, ast.Subscript):
        raise RuleError(f"rule {source!r}: subscripts are not allowed; use dotted lookups")
    else:
        raise RuleError(f"rule {source!r}: {type(node).__name__} is not allowed in a rule")


def _check_literal(node: ast.AST, source: str, depth: int) -> None:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return
    if isinstance(node, (ast.Constant, ast.List, ast.Tuple, ast.Dict)) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    ):
        _check(node, source, depth)
        return
    raise RuleError(f"rule {source!r}: list and object elements must be JSON literals, got {type(node).__name__}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def json_equal(left: Any, right: Any) -> bool:
    """Equality with JSON semantics: a boolean equals only a boolean (``1 == true`` is false, unlike Python),
    numbers compare by value (``1 == 1.0``), arrays and objects element by element."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left is right
    if _is_number(left) and _is_number(right):
        return left == right
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return len(left) == len(right) and all(json_equal(a, b) for a, b in zip(left, right))
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(json_equal(left[k], right[k]) for k in left)
    if _is_number(left) or _is_number(right):
        return False
    return type(left) is type(right) and left == right


def compile_rule(source: Any) -> Rule:
    """Parse and check ``source`` against the grammar; raise RuleError naming what is not allowed."""
    if not isinstance(source, str):
        raise RuleError(f"rule must be a string, got {type(source).__name__}: {source!r}")
    text = source.strip()
    if not text:
        raise RuleError("rule is empty")
    if len(text) > MAX_RULE_CHARS:
        raise RuleError(f"rule is longer than {MAX_RULE_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise RuleError(f"rule {text!r} is not valid syntax: {exc.msg} (column {exc.offset})") from None
    _check(tree, text)
    return Rule(text, tree)


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp):
        return -_literal(node.operand)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    raise RuleError(f"not a literal: {type(node).__name__}")


def _eval(node: ast.AST, ns: Mapping[str, Any], source: str) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body, ns, source)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for value in node.values:
                result = _truth(_eval(value, ns, source), source)
                if not result:
                    return False
            return True
        for value in node.values:
            if _truth(_eval(value, ns, source), source):
                return True
        return False
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            return not _truth(_eval(node.operand, ns, source), source)
        return _literal(node)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, ns, source)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, ns, source)
            if isinstance(op, _ORDERING):
                same_kind = (_is_number(left) and _is_number(right)) or (isinstance(left, str) and isinstance(right, str))
                if not same_kind:
                    raise RuleError(
                        f"rule {source!r}: cannot order {left!r} ({type(left).__name__}) against {right!r} ({type(right).__name__})"
                    )
            if isinstance(op, (ast.Eq, ast.NotEq)):
                if json_equal(left, right) != isinstance(op, ast.Eq):
                    return False
            elif not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES and node.id not in ns:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.Name, ast.Attribute)):
        path = _dotted(node, source)
        value = lookup_path(ns, path)
        if value is MISSING:
            raise RuleError(f"rule {source!r}: {path!r} is not in the pipeline state")
        return value
    return _literal(node)


def _truth(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    raise RuleError(f"rule {source!r}: and/or/not need booleans, got {value!r}")


def evaluate_rule(rule: Rule | str, namespace: Mapping[str, Any]) -> bool:
    """Evaluate a rule over ``namespace``; a non-boolean result or a missing lookup raises RuleError."""
    compiled = rule if isinstance(rule, Rule) else compile_rule(rule)
    result = _eval(compiled.tree, namespace, compiled.source)
    if not isinstance(result, bool):
        if isinstance(result, (list, dict)) or result is None or isinstance(result, (int, float, str)):
            raise RuleError(f"rule {compiled.source!r} must evaluate to true or false, got {result!r}")
    return bool(result)
