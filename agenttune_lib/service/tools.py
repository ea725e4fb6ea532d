"""Tools on the wire: validating OpenAI tool specs and tool_choice, rendering them into the prompt, and parsing the
model's ``<tool_call>{...}</tool_call>`` replies (the platform's call contract) into OpenAI ``tool_calls``."""
from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any

from agenttune_lib.service.errors import APIError
from agenttune_lib.service.schemas import ChatCompletionRequest, message_text

__all__ = ["ToolPlan", "plan_tools", "render_messages", "parse_reply", "CALL_RE"]

CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """The tools a request offers (OpenAI function specs), which of them decoding may call, and whether text is allowed."""

    tools: tuple[dict[str, Any], ...] = ()
    callable: tuple[dict[str, Any], ...] = ()
    allow_text: bool = True
    constrained: bool = False

    @property
    def names(self) -> set[str]:
        return {t["name"] for t in self.tools}


def _check_tool(i: int, spec: dict[str, Any]) -> dict[str, Any]:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    name = spec.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise APIError(400, f"tools[{i}].function.name {name!r} must be 1-64 letters, digits, '_' or '-'", "invalid_tool_schema", f"tools[{i}].function.name")
    params = spec.get("parameters") if spec.get("parameters") is not None else {"type": "object", "properties": {}}
    try:
        Draft202012Validator.check_schema(params)
    except SchemaError as exc:
        raise APIError(400, f"tools[{i}] ({name}): parameters is not a valid JSON schema: {exc.message}", "invalid_tool_schema",
                       f"tools[{i}].function.parameters") from None
    if params.get("type", "object") != "object":
        raise APIError(400, f"tools[{i}] ({name}): parameters must describe an object, got type {params.get('type')!r}", "invalid_tool_schema",
                       f"tools[{i}].function.parameters")
    return {"name": name, "description": spec.get("description") or "", "parameters": params}


def plan_tools(req: ChatCompletionRequest) -> ToolPlan:
    """Validate ``tools`` and ``tool_choice``; a bad schema, a duplicate name or an unknown choice is a 400."""
    tools = []
    for i, tool in enumerate(req.tools or []):
        tools.append(_check_tool(i, tool.function.model_dump(exclude_none=True)))
    names = [t["name"] for t in tools]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise APIError(400, f"tool names must be unique; repeated: {sorted(dup)}", "invalid_tool_schema", "tools")
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if isinstance(choice, dict):
        fn = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if fn not in names:
            raise APIError(400, f"tool_choice names function {fn!r}, which is not among the tools {names}", "invalid_tool_choice", "tool_choice")
        picked, allow_text = tuple(t for t in tools if t["name"] == fn), False
    elif choice in ("auto", "none", "required"):
        if choice != "none" and not tools:
            raise APIError(400, f"tool_choice={choice!r} needs tools", "invalid_tool_choice", "tool_choice")
        picked = () if choice == "none" else tuple(tools)
        allow_text = choice != "required"
    else:
        raise APIError(400, f"tool_choice must be 'none', 'auto', 'required' or a function, got {choice!r}", "invalid_tool_choice", "tool_choice")
    return ToolPlan(tuple(tools), picked, allow_text, constrained=bool(req.structured_tool_calls and picked))


def _tools_prompt(plan: ToolPlan) -> str:
    specs = "\n".join(json.dumps(t, sort_keys=True) for t in plan.callable)
    must = "You must call one of them." if not plan.allow_text else "Call one when it helps; otherwise answer in plain text."
    return (f"You can call these tools. {must} To call a tool, reply with exactly "
            f'<tool_call>{{"name": <tool name>, "arguments": <JSON object>}}</tool_call>.\nTools:\n{specs}')


def render_messages(req: ChatCompletionRequest, plan: ToolPlan) -> list[dict[str, str]]:
    """The request as chat-template messages: tool specs in a system message, past calls as ``<tool_call>`` text."""
    out: list[dict[str, str]] = []
    for i, m in enumerate(req.messages):
        try:
            text = message_text(m.content)
        except ValueError as exc:
            raise APIError(400, f"messages[{i}]: {exc}", "invalid_content", f"messages[{i}].content") from None
        role = "system" if m.role == "developer" else m.role
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                try:
                    args = json.loads(c.function.arguments or "{}")
                except ValueError:
                    raise APIError(400, f"messages[{i}].tool_calls: arguments of {c.function.name!r} are not JSON", "invalid_tool_call",
                                   f"messages[{i}].tool_calls") from None
                calls.append("<tool_call>" + json.dumps({"name": c.function.name, "arguments": args}) + "</tool_call>")
            text = (text + "\n" if text else "") + "\n".join(calls)
        out.append({"role": role, "content": text})
    if plan.callable:
        tools_msg = _tools_prompt(plan)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + tools_msg}
        else:
            out.insert(0, {"role": "system", "content": tools_msg})
    return out


def parse_reply(text: str, plan: ToolPlan) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls): each well-formed ``<tool_call>`` naming an offered tool becomes an OpenAI tool call."""
    if not plan.callable:
        return text, []
    calls = []
    for match in CALL_RE.finditer(text):
        try:
            obj = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(obj, dict) or obj.get("name") not in {t["name"] for t in plan.callable} or not isinstance(obj.get("arguments", {}), dict):
            continue
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))}})
    if not calls:
        return text, []
    rest = CALL_RE.sub("", text).strip()
    return (rest or None), calls
