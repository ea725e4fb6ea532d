"""An AST matcher that follows BFCL's published scoring rules for single-turn Python categories.

Rules (as BFCL's ``ast_checker`` applies them): the function name must match; every required
parameter must be present; every given parameter must be both documented and listed in the
ground truth; a value must have the documented type (int is accepted for float; a value of the
ground truth's own type is accepted as a "variable"); strings compare after removing spaces and
``,./-_*^`` and lower-casing; lists and dicts compare element-wise under the same rule; a
ground-truth parameter whose acceptable values include ``""`` is optional; parallel categories
match calls to answers in any order (first match wins, as in BFCL); multiple categories need
exactly one call, the right one. Written here rather than imported because BFCL's checker
imports every provider SDK at import time.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agenttune_lib.evaluation.bfcl.decode import BFCLDecodeError, decode_calls, decode_platform, decode_strict, is_empty_decoded

_DECODERS = {"any": decode_calls, "strict": decode_strict, "platform": decode_platform}

__all__ = ["CheckResult", "check_ast", "check_entry_output", "ground_truth_calls", "standardize_string"]

_PY_TYPES: dict[str, type] = {
    "string": str, "integer": int, "float": float, "boolean": bool,
    "array": list, "tuple": list, "dict": dict, "any": str,
}
_NESTED = ("array", "tuple")


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """Whether an output is correct, with BFCL-style error text and error type when not."""

    valid: bool
    error: str = ""
    error_type: str = ""


_OK = CheckResult(True)


def standardize_string(text: str) -> str:
    """BFCL's string normal form: drop spaces and ``,./-_*^``, lower-case, single to double quotes."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _std(v: Any) -> Any:
    return standardize_string(v) if type(v) is str else v


def _answer_type(options: Sequence[Any]) -> type | None:
    for opt in options:
        if opt != "":
            return type(opt)
    return None


def _type_ok(value: Any, options: Sequence[Any], expected: type, nested: type | None) -> tuple[bool, bool]:
    """(valid, is_variable) for one value under BFCL's type rule."""
    answer_type = _answer_type(options)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for option in options:
            if type(option) is list:
                if all(_type_ok(item, option, nested, None)[0] for item in value):
                    return True, is_variable
            else:
                return True, is_variable
        return False, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, is_variable


def _dict_ok(value: Mapping[str, Any], options: Sequence[Any]) -> bool:
    for option in options:
        if option == "":
            continue
        if not isinstance(option, Mapping):
            continue
        if any(k not in option or _std(v) not in [_std(x) for x in option[k]] for k, v in value.items()):
            continue
        if any(k not in value and "" not in opts for k, opts in option.items()):
            continue
        return True
    return False


def _list_dict_ok(value: Sequence[Any], options: Sequence[Any]) -> bool:
    for option in options:
        if not isinstance(option, (list, str)) or len(option) != len(value):
            continue
        if all(isinstance(v, Mapping) and _dict_ok(v, [o]) for v, o in zip(value, option)):
            return True
    return False


def _check_one(func: Mapping[str, Any], output: Mapping[str, Any], answer: Mapping[str, Any]) -> CheckResult:
    """One call against one ground-truth call ``{name: {param: [acceptable values]}}``."""
    options_by_param = next(iter(answer.values()))
    name = func["name"]
    if name not in output:
        return CheckResult(False, f"Function name {name!r} not found in model output.", "simple_function_checker:wrong_func_name")
    args = output[name]
    props = func["parameters"]["properties"]
    for param in func["parameters"].get("required", []):
        if param not in args:
            return CheckResult(False, f"Missing required parameter: {param!r}.", "simple_function_checker:missing_required")
    for param, value in args.items():
        if param not in props or param not in options_by_param:
            return CheckResult(False, f"Unexpected parameter: {param!r}.", "simple_function_checker:unexpected_param")
        type_name = props[param]["type"]
        if type_name not in _PY_TYPES:
            raise ValueError(f"BFCL function {name!r} parameter {param!r} has unsupported type {type_name!r}")
        expected = _PY_TYPES[type_name]
        nested = _PY_TYPES[props[param]["items"]["type"]] if type_name in _NESTED else None
        if type_name == "tuple" and type(value) is tuple:
            value = list(value)
        if type_name == "float" and type(value) is int:
            value = float(value)
        options = options_by_param[param]
        ok, is_variable = _type_ok(value, options, expected, nested)
        if not ok:
            return CheckResult(False, f"Incorrect type for parameter {param!r}. Expected type {type_name}, got {type(value).__name__}.", "type_error")
        if not is_variable:
            if expected is dict:
                if not _dict_ok(value, options):
                    return CheckResult(False, f"Invalid value for parameter {param!r}: {value!r}.", "value_error:dict")
                continue
            if expected is list and nested is dict:
                if not _list_dict_ok(value, options):
                    return CheckResult(False, f"Invalid value for parameter {param!r}: {value!r}.", "value_error:list_dict")
                continue
            if expected is str:
                if standardize_string(value) not in [standardize_string(o) for o in options if type(o) is str]:
                    return CheckResult(False, f"Invalid value for parameter {param!r}: {value!r}. Expected one of {options}.", "value_error:string")
                continue
            if expected is list:
                std_options = [[_std(x) for x in o] for o in options if isinstance(o, (list, str))]
                if [_std(x) for x in value] not in std_options:
                    return CheckResult(False, f"Invalid value for parameter {param!r}: {value!r}. Expected one of {options}.", "value_error:list")
                continue
        if value not in options:
            return CheckResult(False, f"Invalid value for parameter {param!r}: {value!r}. Expected one of {options}.", "value_error:others")
    for param, options in options_by_param.items():
        if param not in args and "" not in options:
            return CheckResult(False, f"Optional parameter {param!r} not provided and not marked as optional.", "simple_function_checker:missing_optional")
    return _OK


def _find(functions: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    for func in functions:
        if func["name"] == name:
            return func
    raise ValueError(f"ground truth names function {name!r}, which the entry does not offer")


def check_ast(
    functions: Sequence[Mapping[str, Any]],
    decoded: Sequence[Mapping[str, Any]],
    ground_truth: Sequence[Mapping[str, Any]],
    category: str,
) -> CheckResult:
    """Score decoded calls against an entry's ground truth under BFCL's rules for ``category``."""
    if "parallel" in category:
        if len(decoded) != len(ground_truth):
            return CheckResult(False, "Wrong number of functions.", "parallel:wrong_count")
        used: set[int] = set()
        for i, answer in enumerate(ground_truth):
            func = _find(functions, next(iter(answer)))
            for j, out in enumerate(decoded):
                if j not in used and _check_one(func, out, answer).valid:
                    used.add(j)
                    break
            else:
                return CheckResult(False, f"No model call matches answer {i}.", "parallel:cannot_find_match")
        return _OK
    if "multiple" in category:
        if len(decoded) != len(ground_truth):
            return CheckResult(False, "Wrong number of functions.", "multiple:wrong_count")
        return _check_one(_find(functions, next(iter(ground_truth[0]))), decoded[0], ground_truth[0])
    if len(decoded) != 1:
        return CheckResult(False, "Wrong number of functions.", "simple:wrong_count")
    return _check_one(functions[0], decoded[0], ground_truth[0])


def check_entry_output(entry: Any, text: str, decoder: str = "any") -> CheckResult:
    """Score one model output for a ``BFCLEntry``: AST match, or (ir)relevance by whether a call was decoded.

    ``decoder``: ``strict`` is BFCL's own (a Python call list, comparable with the leaderboard),
    ``platform`` the ``<tool_call>`` JSON contract, ``any`` accepts either (and JSON lists).
    """
    if decoder not in _DECODERS:
        raise ValueError(f"decoder must be one of {sorted(_DECODERS)}, got {decoder!r}")
    try:
        decoded = _DECODERS[decoder](text)
        has_call = not is_empty_decoded(decoded)
        decode_error = ""
    except BFCLDecodeError as exc:
        decoded, has_call, decode_error = None, False, str(exc)
    if entry.ground_truth is None:
        if "irrelevance" in entry.category:
            return _OK if not has_call else CheckResult(False, "Decoded a call where none should be made.", "irrelevance:decoder_success")
        return _OK if has_call else CheckResult(False, f"No call decoded. {decode_error}", "relevance:decoder_failed")
    if decoded is None:
        return CheckResult(False, f"Invalid syntax. Failed to decode AST. {decode_error}", "ast_decoder:decoder_failed")
    if is_empty_decoded(decoded) and decoded:
        return CheckResult(False, "Did not output in the function-call format.", "ast_decoder:decoder_wrong_output_format")
    return check_ast(entry.functions, decoded, entry.ground_truth, entry.category)


def _first(options: Sequence[Any]) -> tuple[bool, Any]:
    for opt in options:
        if opt != "":
            return True, opt
    return False, None


def _concrete(value: Any, schema: Mapping[str, Any]) -> Any:
    """A concrete value from one acceptable answer: dict and list-of-dict answers hold option lists per key."""
    kind = schema.get("type")
    if kind == "dict" and isinstance(value, Mapping):
        out = {}
        for k, opts in value.items():
            present, v = _first(opts)
            if present and "" not in opts:
                out[k] = v
        return out
    if kind == "array" and schema.get("items", {}).get("type") == "dict" and isinstance(value, list):
        return [_concrete(v, {"type": "dict"}) for v in value]
    return value


def ground_truth_calls(entry: Any) -> list[dict[str, dict[str, Any]]]:
    """One correct output for an AST entry: each parameter's first acceptable value; optional ones omitted.

    A parameter is optional when its acceptable values include ``""`` and the function does not
    require it.

    A calibration oracle: scoring these must give 100%, and perturbing them must drop the score.
    """
    if entry.ground_truth is None:
        raise ValueError(f"BFCL entry {entry.id} ({entry.category}) has no ground truth; it is scored by relevance")
    calls = []
    for answer in entry.ground_truth:
        name, params = next(iter(answer.items()))
        func = _find(entry.functions, name)
        props = func["parameters"]["properties"]
        required = set(func["parameters"].get("required", []))
        args = {}
        for param, options in params.items():
            present, value = _first(options)
            if present and ("" not in options or param in required):
                args[param] = _concrete(value, props.get(param, {}))
        calls.append({name: args})
    return calls
