"""BaseTool, as_tool and tool-call parsing."""
from __future__ import annotations

import pytest

from agenttune_lib.tools import BaseTool, ToolCall, ToolCallParseError, as_tool, as_tools, parse_tool_calls


class Weather(BaseTool):
    name = "weather"
    description = "Current weather for a city."
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

    def execute(self, city: str) -> dict:
        return {"city": city, "temp_c": 21}


def lookup(order_id: str, verbose: bool = False) -> str:
    """Look up an order.

    Args:
        order_id: the order's id, like #W123
        verbose: include line items
    """
    return f"order {order_id} verbose={verbose}"


def test_basetool_schema_and_invoke():
    tool = Weather()
    schema = tool.to_schema()
    assert schema["type"] == "function" and schema["function"]["name"] == "weather"
    assert schema["function"]["parameters"]["required"] == ["city"]
    ok = tool.invoke({"city": "Paris"})
    assert ok.ok and '"temp_c": 21' in ok.content
    bad = tool.invoke({})
    assert bad.error["type"] == "invalid_arguments" and "city" in bad.error["message"]
    assert bad.to_payload("c1")["error"]["type"] == "invalid_arguments"


def test_callable_becomes_tool_with_derived_schema():
    tool = as_tool(lookup)
    params = tool.to_schema()["function"]["parameters"]
    assert tool.description == "Look up an order."
    assert params["properties"]["order_id"] == {"type": "string", "description": "the order's id, like #W123"}
    assert params["properties"]["verbose"]["type"] == "boolean"
    assert params["required"] == ["order_id"]
    assert tool.invoke({"order_id": "#W1"}).content == "order #W1 verbose=False"


def test_object_with_name_and_to_schema_becomes_tool():
    class Duck:
        name = "echo"

        def to_schema(self):
            return {"name": "echo", "description": "Echo.", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}

        def run(self, x):
            return x * 2

    tool = as_tool(Duck())
    assert tool.name == "echo" and tool.invoke({"x": 4}).value == 8
    assert tool.invoke({"x": "no"}).error is not None


def test_raising_tool_is_structured_error_not_exception():
    def boom(x: int) -> int:
        """Always fails."""
        raise RuntimeError("kaput")

    result = as_tool(boom).invoke({"x": 1})
    assert result.error["type"] == "exception" and result.error["exception"] == "RuntimeError"
    assert "kaput" in result.content


def test_as_tools_mapping_and_bad_input():
    tools = as_tools({"dbl": lambda x: x * 2, "weather": Weather()})
    assert set(tools) == {"dbl", "weather"} and tools["dbl"].execute(x=2) == 4
    with pytest.raises(TypeError, match="cannot make a tool"):
        as_tool(42)


def test_parse_json_and_xml_calls_in_order():
    text = (
        'Let me check. <tool_call>{"name": "lookup", "arguments": {"order_id": "#W1"}}</tool_call>'
        "<function=weather><parameter=city>Paris</parameter></function>"
        '<tool_call>{"name": "x", "arguments": "{\\"a\\": 1}", "id": "c9"}</tool_call>'
    )
    result = parse_tool_calls(text)
    assert result.ok and [c.name for c in result.calls] == ["lookup", "weather", "x"]
    assert result.calls[0].arguments == {"order_id": "#W1"}
    assert result.calls[1].format == "xml" and result.calls[1].arguments == {"city": "Paris"}
    assert result.calls[2].arguments == {"a": 1} and result.calls[2].id == "c9"
    assert result.text == "Let me check."


def test_xml_inside_tool_call_tag_and_schema_coercion():
    text = "<tool_call>\n<function=get>\n<parameter=code>\n42\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"
    plain = parse_tool_calls(text)
    assert plain.calls[0].arguments == {"code": 42, "n": 3}
    typed = parse_tool_calls(text, schemas={"get": {"properties": {"code": {"type": "string"}}}})
    assert typed.calls[0].arguments == {"code": "42", "n": 3}


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "must be an object"),
        ('<tool_call>{"name": "a", "arguments": {}', "not closed"),
        ("<tool_call></tool_call>", "empty"),
        ("<function=a><parameter=k>v</function>", "not closed"),
        ("<function=a><parameter=k>v</parameter>", "not closed"),
        ("<function=>x</function>", "empty tool name"),
        ('{"name": "a"}</tool_call>', "without an opening"),
    ],
)
def test_malformed_calls_become_structured_errors(text, fragment):
    result = parse_tool_calls(text)
    assert not result.ok and not result.calls
    err = result.errors[0]
    assert isinstance(err, ToolCallParseError) and fragment in err.message
    assert err.to_error()["type"] == "parse_error"


def test_plain_text_has_no_calls():
    result = parse_tool_calls("The answer is 4.")
    assert not result and result.text == "The answer is 4."
    assert isinstance(parse_tool_calls(None).errors[0], ToolCallParseError)  # type: ignore[arg-type]
    assert ToolCall("a", {}).to_payload() == {"name": "a", "arguments": {}, "id": None}
