"""Parse tool calls out of model text: JSON ``<tool_call>{…}</tool_call>`` and XML ``<function=…>``.

A malformed call becomes a ``ToolCallParseError`` in the result (with a structured
``to_error()`` the caller turns into an error observation); parsing never raises.
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["ToolCall", "ToolCallParseError", "ParseResult", "parse_tool_calls"]


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One well-formed call: tool name, argument object, optional call id, and the raw span."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None
    raw: str = ""
    format: str = "json"

    def to_payload(self) -> dict[str, Any]:
        """The TOOL_CALL payload (``name``, ``arguments``, ``id``)."""
        return {"name": self.name, "arguments": dict(self.arguments), "id": self.id}


@dataclasses.dataclass(frozen=True)
class ToolCallParseError:
    """A call the model attempted but did not form correctly."""

    message: str
    raw: str = ""
    format: str = "json"
    name: str | None = None

    def to_error(self) -> dict[str, Any]:
        """Structured error for a TOOL_RESULT payload."""
        err = {"type": "parse_error", "format": self.format, "message": self.message, "raw": self.raw[:2000]}
        if self.name:
            err["tool"] = self.name
        return err


@dataclasses.dataclass(frozen=True)
class ParseResult:
    """Calls and parse errors in text order, plus the text outside every call."""

    items: tuple[ToolCall | ToolCallParseError, ...]
    text: str

    @property
    def calls(self) -> list[ToolCall]:
        return [i for i in self.items if isinstance(i, ToolCall)]

    @property
    def errors(self) -> list[ToolCallParseError]:
        return [i for i in self.items if isinstance(i, ToolCallParseError)]

    @property
    def ok(self) -> bool:
        return not self.errors

    def __iter__(self) -> Iterator[ToolCall | ToolCallParseError]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)


_TAGGED = re.compile(r"<tool_call>(.*?)(</tool_call>|(?=<tool_call>)|\Z)", re.S)
_FUNCTION = re.compile(r"<function=([^>\s]*)\s*>(.*?)(</function>|(?=<function=)|(?=</tool_call>)|\Z)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]*)\s*>(.*?)(</parameter>|(?=<parameter=)|\Z)", re.S)


def _coerce_xml_value(raw: str, prop_schema: Mapping[str, Any] | None) -> Any:
    """An XML parameter value: JSON-decoded unless the schema says it is a string."""
    value = raw.strip("\n")
    stripped = value.strip()
    if prop_schema is not None and prop_schema.get("type") == "string":
        return stripped
    try:
        return json.loads(stripped)
    except (json.JSONDecodeError, ValueError):
        return stripped


def _parse_function_block(name: str, body: str, closed: bool, raw: str, schemas: Mapping[str, Any] | None) -> ToolCall | ToolCallParseError:
    name = name.strip()
    if not name:
        return ToolCallParseError("<function=…> has an empty tool name", raw=raw, format="xml")
    if not closed:
        return ToolCallParseError(f"<function={name}> is not closed with </function>", raw=raw, format="xml", name=name)
    props = {}
    if schemas and isinstance(schemas.get(name), Mapping):
        props = schemas[name].get("properties") or {}
    arguments: dict[str, Any] = {}
    consumed = 0
    for match in _PARAMETER.finditer(body):
        pname = match.group(1).strip()
        if not pname:
            return ToolCallParseError(f"<function={name}>: a <parameter=…> has an empty name", raw=raw, format="xml", name=name)
        if not match.group(3):
            return ToolCallParseError(
                f"<function={name}>: <parameter={pname}> is not closed with </parameter>", raw=raw, format="xml", name=name
            )
        arguments[pname] = _coerce_xml_value(match.group(2), props.get(pname))
        consumed += len(match.group(0))
    leftover = _PARAMETER.sub("", body).strip()
    if leftover:
        return ToolCallParseError(
            f"<function={name}>: unexpected text outside <parameter> tags: {leftover[:80]!r}", raw=raw, format="xml", name=name
        )
    return ToolCall(name=name, arguments=arguments, raw=raw, format="xml")


def _from_json_object(obj: Any, raw: str) -> ToolCall | ToolCallParseError:
    if not isinstance(obj, Mapping):
        return ToolCallParseError(f"tool call must be a JSON object, got {type(obj).__name__}", raw=raw)
    fn = obj.get("function") if isinstance(obj.get("function"), Mapping) else obj
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallParseError('tool call JSON needs a non-empty string "name"', raw=raw)
    args = fn.get("arguments", fn.get("parameters", fn.get("args", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCallParseError(f'"arguments" of {name!r} is a string that is not JSON ({exc.msg})', raw=raw, name=name)
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        return ToolCallParseError(f'"arguments" of {name!r} must be an object, got {type(args).__name__}', raw=raw, name=name)
    call_id = obj.get("id")
    return ToolCall(name=name.strip(), arguments=dict(args), id=str(call_id) if call_id is not None else None, raw=raw)


def _parse_json_body(body: str, raw: str) -> list[ToolCall | ToolCallParseError]:
    stripped = body.strip()
    if stripped.startswith("```"):
        stripped = re.sub(r"^```(?:json)?\s*|\s*```$", "", stripped)
    if not stripped:
        return [ToolCallParseError("empty <tool_call> block", raw=raw)]
    try:
        obj = json.loads(stripped)
    except json.JSONDecodeError as exc:
        name_match = re.search(r'"name"\s*:\s*"([^"]+)"', stripped)
        return [
            ToolCallParseError(
                f"tool call is not valid JSON: {exc.msg} at position {exc.pos}",
                raw=raw,
                name=name_match.group(1) if name_match else None,
            )
        ]
    if isinstance(obj, list):
        if not obj:
            return [ToolCallParseError("empty list of tool calls", raw=raw)]
        return [_from_json_object(o, raw) for o in obj]
    return [_from_json_object(obj, raw)]


def parse_tool_calls(text: str, schemas: Mapping[str, Mapping[str, Any]] | None = None) -> ParseResult:
    """All tool calls in ``text``, in order; malformed ones become ``ToolCallParseError`` items.

    ``schemas`` (tool name → JSON-schema parameters) keeps XML string parameters as strings
    instead of JSON-decoding values such as ``"42"``.
    """
    if not isinstance(text, str):
        return ParseResult((ToolCallParseError(f"model output must be text, got {type(text).__name__}"),), "")
    items: list[ToolCall | ToolCallParseError] = []
    outside: list[str] = []
    pos = 0
    spans: list[tuple[int, int, list[ToolCall | ToolCallParseError]]] = []
    for match in _TAGGED.finditer(text):
        raw = match.group(0)
        body = match.group(1)
        closed = match.group(2) == "</tool_call>"
        if body.lstrip().startswith("<function="):
            parsed = _parse_xml_region(body, raw, schemas)
        elif not closed:
            parsed = [ToolCallParseError("<tool_call> is not closed with </tool_call>", raw=raw)]
            name_match = re.search(r'"name"\s*:\s*"([^"]+)"', body)
            if name_match:
                parsed = [dataclasses.replace(parsed[0], name=name_match.group(1))]
        else:
            parsed = _parse_json_body(body, raw)
        spans.append((match.start(), match.end(), parsed))
    # Bare XML <function=…> blocks outside any <tool_call> tag.
    covered = [(s, e) for s, e, _ in spans]
    for match in _FUNCTION.finditer(text):
        if any(s <= match.start() < e for s, e in covered):
            continue
        raw = match.group(0)
        spans.append(
            (match.start(), match.end(), [_parse_function_block(match.group(1), match.group(2), match.group(3) == "</function>", raw, schemas)])
        )
    spans.sort(key=lambda s: s[0])
    for start, end, parsed in spans:
        outside.append(text[pos:start])
        items.extend(parsed)
        pos = end
    outside.append(text[pos:])
    # A stray closing tag with no opening one is an attempted call too.
    rest = "".join(outside)
    if "</tool_call>" in rest and not spans:
        items.append(ToolCallParseError("</tool_call> without an opening <tool_call>", raw=rest[-200:]))
    return ParseResult(tuple(items), rest.replace("</tool_call>", "").strip())


def _parse_xml_region(body: str, raw: str, schemas: Mapping[str, Any] | None) -> list[ToolCall | ToolCallParseError]:
    out: list[ToolCall | ToolCallParseError] = []
    for match in _FUNCTION.finditer(body):
        out.append(_parse_function_block(match.group(1), match.group(2), match.group(3) == "</function>", raw, schemas))
    leftover = _FUNCTION.sub("", body).strip()
    if leftover and not out:
        out.append(ToolCallParseError("unparseable <function=…> block", raw=raw, format="xml"))
    return out
