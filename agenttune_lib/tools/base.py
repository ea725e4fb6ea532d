"""The tool contract: a name, a description, a JSON-schema parameter object and ``execute``.

``as_tool`` turns a BaseTool, any object with ``.name`` and ``.to_schema()``, or a plain
annotated callable (schema derived from its signature and docstring) into a BaseTool.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "BaseTool",
    "FunctionTool",
    "ObjectTool",
    "ToolError",
    "ToolResult",
    "as_tool",
    "as_tools",
    "schema_from_callable",
]


class ToolError(Exception):
    """A tool failed in a way the caller should report as a structured error observation."""

    def __init__(self, message: str, type: str = "tool_error", **details: Any) -> None:
        super().__init__(message)
        self.type = type
        self.details = details

    def to_error(self) -> dict[str, Any]:
        return {"type": self.type, "message": str(self), **self.details}


@dataclasses.dataclass
class ToolResult:
    """The outcome of one tool invocation: text content, a structured error or None, metadata."""

    name: str
    content: str
    error: dict[str, Any] | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    value: Any = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_payload(self, call_id: str | None = None) -> dict[str, Any]:
        """The TOOL_RESULT payload: ``name``, ``content``, ``id`` and (on failure) ``error``."""
        payload: dict[str, Any] = {"name": self.name, "content": self.content, "id": call_id}
        if self.error is not None:
            payload["error"] = _jsonable(self.error)
        if self.metadata:
            payload["metadata"] = _jsonable(self.metadata)
        return payload


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def render_content(value: Any) -> str:
    """Tool output as the text an agent reads: strings as-is, everything else as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


class BaseTool:
    """Subclass with ``name``, ``description``, ``parameters`` (JSON schema) and ``execute(**kwargs)``."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def execute(self, **kwargs: Any) -> Any:
        raise NotImplementedError(f"tool {self.name!r} does not implement execute()")

    def __call__(self, **kwargs: Any) -> Any:
        return self.execute(**kwargs)

    def to_schema(self) -> dict[str, Any]:
        """OpenAI function-calling format."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, arguments: Mapping[str, Any]) -> list[str]:
        """JSON-schema violations of ``arguments`` (empty when valid)."""
        import jsonschema

        if not isinstance(arguments, Mapping):
            return [f"arguments must be an object, got {type(arguments).__name__}"]
        validator = jsonschema.Draft202012Validator(self.parameters or {"type": "object"})
        return [
            f"{'/'.join(str(p) for p in err.absolute_path) or '<root>'}: {err.message}"
            for err in sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
        ]

    def invoke(self, arguments: Mapping[str, Any] | None = None, validate: bool = True) -> ToolResult:
        """Validate and execute; any failure becomes a ToolResult with a structured ``error``, never a raise."""
        args = dict(arguments or {}) if isinstance(arguments, Mapping) else arguments
        if validate:
            problems = self.validate(args)  # type: ignore[arg-type]
            if problems:
                return ToolResult(
                    self.name,
                    f"error: invalid arguments for {self.name}: {'; '.join(problems)}",
                    error={"type": "invalid_arguments", "message": "; ".join(problems), "tool": self.name},
                )
        try:
            value = self.execute(**args)  # type: ignore[arg-type]
        except ToolError as exc:
            return ToolResult(self.name, f"error: {exc}", error={**exc.to_error(), "tool": self.name})
        except Exception as exc:  # a tool's own failure is an observation, not a crash
            return ToolResult(
                self.name,
                f"error: {type(exc).__name__}: {exc}",
                error={"type": "exception", "exception": type(exc).__name__, "message": str(exc), "tool": self.name},
            )
        return ToolResult(self.name, render_content(value), value=value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


# -- schemas from signatures --------------------------------------------------------

_PRIMITIVES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    dict: {"type": "object"},
    list: {"type": "array"},
    tuple: {"type": "array"},
    type(None): {"type": "null"},
}


def _annotation_schema(annotation: Any) -> dict[str, Any]:
    """JSON schema for a Python annotation; unknown annotations accept anything."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation in _PRIMITIVES:
        return dict(_PRIMITIVES[annotation])
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return {"enum": [m.value for m in annotation]}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:
            return _annotation_schema(non_null[0])
        return {"anyOf": [_annotation_schema(a) for a in args]}
    if origin in (list, tuple, set, frozenset, Sequence, typing.Sequence):
        schema: dict[str, Any] = {"type": "array"}
        if args and args[-1] is not Ellipsis:
            schema["items"] = _annotation_schema(args[0])
        return schema
    if origin in (dict, Mapping, typing.Mapping):
        return {"type": "object"}
    if typing.get_origin(annotation) is typing.Annotated:
        return _annotation_schema(args[0])
    return {}


_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def _docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, per-parameter descriptions) from a Google- or reST-style docstring."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    lines = doc.splitlines()
    desc_lines: list[str] = []
    params: dict[str, str] = {}
    section = "desc"
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        low = stripped.lower()
        if low in ("args:", "arguments:", "parameters:", "params:"):
            section, current = "args", None
            continue
        if low in ("returns:", "return:", "raises:", "yields:", "examples:", "example:"):
            section, current = "other", None
            continue
        rest = re.match(r"^:param\s+(?:\w+\s+)?(\w+):\s*(.*)$", stripped)
        if rest:
            params[rest.group(1)] = rest.group(2).strip()
            current, section = rest.group(1), "rest"
            continue
        if stripped.startswith(":"):
            section, current = "other", None
            continue
        if section == "desc":
            desc_lines.append(line)
        elif section == "args":
            match = _ARG_LINE.match(line)
            if match and (len(line) - len(line.lstrip())) <= 4:
                current = match.group(1).lstrip("*")
                params[current] = match.group(3).strip()
            elif current and stripped:
                params[current] = (params[current] + " " + stripped).strip()
        elif section == "rest" and current and stripped:
            params[current] = (params[current] + " " + stripped).strip()
    description = "\n".join(desc_lines).strip()
    return description, params


def schema_from_callable(fn: Callable[..., Any]) -> dict[str, Any]:
    """Object schema from ``fn``'s annotated signature; defaults make a parameter optional."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot derive a tool schema from {fn!r}: {exc}") from None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to raw annotations
        hints = {}
    _, param_docs = _docstring_parts(inspect.getdoc(fn))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in signature.parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if pname in ("self", "cls"):
            continue
        prop = _annotation_schema(hints.get(pname, param.annotation))
        if pname in param_docs:
            prop["description"] = param_docs[pname]
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        else:
            try:
                json.dumps(param.default)
                prop["default"] = param.default
            except (TypeError, ValueError):
                pass
        properties[pname] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        schema["additionalProperties"] = False
    return schema


class FunctionTool(BaseTool):
    """A plain callable as a tool; its schema comes from the signature and docstring."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionTool needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__
        if self.name == "<lambda>":
            raise ValueError("a lambda has no usable tool name; pass name=… or register it under a dict key")
        doc_desc, _ = _docstring_parts(inspect.getdoc(fn))
        self.description = description if description is not None else (doc_desc or self.name)
        self.parameters = schema_from_callable(fn)

    def execute(self, **kwargs: Any) -> Any:
        return self.fn(**kwargs)


class ObjectTool(BaseTool):
    """Adapts any object exposing ``.name`` and ``.to_schema()`` plus an execute/run/__call__ method."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        schema = obj.to_schema()
        if not isinstance(schema, Mapping):
            raise TypeError(f"{obj!r}.to_schema() must return a mapping, got {type(schema).__name__}")
        fn_schema = schema.get("function", schema)
        self.name = str(getattr(obj, "name", None) or fn_schema.get("name") or "")
        if not self.name:
            raise ValueError(f"{obj!r} has an empty tool name")
        self.description = str(fn_schema.get("description") or getattr(obj, "description", "") or "")
        params = fn_schema.get("parameters") or fn_schema.get("input_schema") or {"type": "object", "properties": {}}
        self.parameters = dict(params)
        for attr in ("execute", "run", "invoke", "__call__"):
            method = getattr(obj, attr, None)
            if callable(method) and not (attr == "invoke" and isinstance(obj, BaseTool)):
                self._method = method
                break
        else:
            raise TypeError(f"tool object {self.name!r} has no execute/run/__call__ method")

    def execute(self, **kwargs: Any) -> Any:
        return self._method(**kwargs)


def as_tool(obj: Any, name: str | None = None) -> BaseTool:
    """A BaseTool from a BaseTool, a ``.name``/``.to_schema()`` object, or an annotated callable."""
    if isinstance(obj, BaseTool):
        return obj
    if hasattr(obj, "to_schema") and hasattr(obj, "name"):
        return ObjectTool(obj)
    if callable(obj):
        return FunctionTool(obj, name=name)
    raise TypeError(
        f"cannot make a tool from {type(obj).__name__}: need a BaseTool, an object with .name and "
        ".to_schema(), or a callable"
    )


def as_tools(tools: Any) -> dict[str, BaseTool]:
    """Name → BaseTool from a mapping (keys name plain callables) or a sequence of tool-likes."""
    if tools is None:
        return {}
    out: dict[str, BaseTool] = {}
    items = tools.items() if isinstance(tools, Mapping) else ((None, t) for t in tools)
    for key, obj in items:
        tool = as_tool(obj, name=key) if not isinstance(obj, BaseTool) and not hasattr(obj, "to_schema") else as_tool(obj)
        tool_name = key or tool.name
        if tool_name in out:
            raise ValueError(f"duplicate tool name {tool_name!r}")
        out[tool_name] = tool
    return out
