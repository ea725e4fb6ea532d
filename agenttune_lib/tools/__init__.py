"""Tools: the BaseTool contract, tool-call parsing, workspace built-ins and sandboxed process isolation."""
from agenttune_lib.tools.base import BaseTool, FunctionTool, ObjectTool, ToolError, ToolResult, as_tool, as_tools
from agenttune_lib.tools.builtins import (
    GrepTool,
    ListFilesTool,
    ReadFileTool,
    RunBashTool,
    RunPythonTool,
    Workspace,
    WriteFileTool,
    builtin_tools,
)
from agenttune_lib.tools.isolation import IsolatedTool, isolate_tools
from agenttune_lib.tools.parsing import ParseResult, ToolCall, ToolCallParseError, parse_tool_calls
from agenttune_lib.tools.sandbox import LEVELS, SandboxConfig, SandboxUnavailable

__all__ = [
    "BaseTool",
    "FunctionTool",
    "GrepTool",
    "IsolatedTool",
    "ListFilesTool",
    "ReadFileTool",
    "RunBashTool",
    "RunPythonTool",
    "LEVELS",
    "SandboxConfig",
    "SandboxUnavailable",
    "Workspace",
    "WriteFileTool",
    "builtin_tools",
    "isolate_tools",
    "ObjectTool",
    "ParseResult",
    "ToolCall",
    "ToolCallParseError",
    "ToolError",
    "ToolResult",
    "as_tool",
    "as_tools",
    "parse_tool_calls",
]
