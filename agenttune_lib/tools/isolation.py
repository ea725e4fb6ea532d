"""Process isolation for tools (Level 1): run each call in a separate OS process with a timeout.

A crashing or hanging tool cannot take down the rollout loop or read the caller's memory.
When isolation is impossible (the tool does not pickle, the process does not start) the
call falls back to in-process execution if allowed; which path ran is recorded in the
result's ``metadata["isolation"]``. ``require_isolation=True`` turns every fallback into an
error result. Crashes and timeouts fall back only when ``allow_fallback=True`` (all reasons);
an in-process fallback still runs under the timeout, in a daemon thread.
"""
from __future__ import annotations

import multiprocessing
import pickle
import threading
import time
from collections.abc import Iterable
from typing import Any

from agenttune_lib.tools.base import BaseTool, ToolResult, as_tool, as_tools

__all__ = ["IsolatedTool", "isolate_tools", "FALLBACK_REASONS"]

#: Why isolation can fail; ``allow_fallback`` names the ones that may fall back in process.
FALLBACK_REASONS = ("unpicklable", "start_failed", "crash", "timeout")
_DEFAULT_FALLBACK = ("unpicklable", "start_failed")


def _worker(conn: Any, blob: bytes, arguments: dict[str, Any]) -> None:
    tool = pickle.loads(blob)
    result = tool.invoke(arguments)
    try:
        pickle.dumps(result.value)
        value = result.value
    except Exception:  # an unpicklable return value travels as its text only
        value = None
    conn.send({"content": result.content, "error": result.error, "metadata": result.metadata, "value": value})
    conn.close()


class IsolatedTool(BaseTool):
    """The wrapped tool's interface, each call executed in a fresh ``spawn``-ed process."""

    def __init__(
        self,
        tool: Any,
        timeout: float = 30.0,
        require_isolation: bool = False,
        allow_fallback: bool | Iterable[str] = _DEFAULT_FALLBACK,
        start_method: str = "spawn",
    ) -> None:
        self.tool = as_tool(tool)
        self.name = self.tool.name
        self.description = self.tool.description
        self.parameters = self.tool.parameters
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.timeout = float(timeout)
        self.require_isolation = require_isolation
        if allow_fallback is True:
            self.fallback_on = set(FALLBACK_REASONS)
        elif allow_fallback is False:
            self.fallback_on = set()
        else:
            self.fallback_on = set(allow_fallback)
            unknown = self.fallback_on - set(FALLBACK_REASONS)
            if unknown:
                raise ValueError(f"unknown fallback reasons {sorted(unknown)}; expected some of {FALLBACK_REASONS}")
        self._ctx = multiprocessing.get_context(start_method)

    def execute(self, **kwargs: Any) -> Any:
        result = self.invoke(kwargs, validate=False)
        if result.error is not None:
            from agenttune_lib.tools.base import ToolError

            raise ToolError(result.error.get("message", "isolated call failed"), type=result.error.get("type", "tool_error"))
        return result.value if result.value is not None else result.content

    def _failed(self, reason: str, message: str, arguments: dict[str, Any], path: str = "process") -> ToolResult:
        if self.require_isolation or reason not in self.fallback_on:
            kind = "isolation_required" if self.require_isolation and reason in ("unpicklable", "start_failed") else reason
            result = ToolResult(self.name, f"error: {message}", error={"type": kind, "message": message, "tool": self.name})
            result.metadata["isolation"] = path if not self.require_isolation else "refused"
            result.metadata["isolation_failure"] = reason
            return result
        return self._in_process(arguments, reason)

    def _in_process(self, arguments: dict[str, Any], reason: str) -> ToolResult:
        box: dict[str, ToolResult] = {}
        thread = threading.Thread(target=lambda: box.setdefault("r", self.tool.invoke(arguments, validate=False)), daemon=True)
        thread.start()
        thread.join(self.timeout)
        if "r" not in box:
            message = f"tool {self.name!r} did not finish within {self.timeout}s (in-process fallback; its thread is abandoned)"
            result = ToolResult(self.name, f"error: {message}", error={"type": "timeout", "message": message, "tool": self.name})
        else:
            result = box["r"]
        result.metadata["isolation"] = "in_process"
        result.metadata["isolation_failure"] = reason
        return result

    def invoke(self, arguments: dict[str, Any] | None = None, validate: bool = True) -> ToolResult:
        args = dict(arguments or {})
        if validate:
            problems = self.tool.validate(args)
            if problems:
                result = self.tool.invoke(args)  # the plain tool's structured invalid-arguments result
                result.metadata["isolation"] = "not_run"
                return result
        try:
            blob = pickle.dumps(self.tool)
        except Exception as exc:  # locks, sockets, lambdas, closures
            return self._failed("unpicklable", f"tool {self.name!r} cannot be sent to a worker process ({type(exc).__name__}: {exc})", args)
        parent, child = self._ctx.Pipe(duplex=False)
        try:
            proc = self._ctx.Process(target=_worker, args=(child, blob, args), daemon=True)
            proc.start()
        except Exception as exc:
            return self._failed("start_failed", f"could not start a worker process ({type(exc).__name__}: {exc})", args)
        child.close()
        start = time.monotonic()
        payload = None
        try:
            if parent.poll(self.timeout):
                try:
                    payload = parent.recv()
                except (EOFError, OSError):
                    payload = None
            timed_out = payload is None and time.monotonic() - start >= self.timeout
        finally:
            parent.close()
        if payload is None:
            proc.join(0.5)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
            if timed_out:
                return self._failed("timeout", f"tool {self.name!r} did not finish within {self.timeout}s; worker killed", args)
            return self._failed("crash", f"tool {self.name!r} worker died (exit code {proc.exitcode})", args)
        proc.join(2.0)
        result = ToolResult(self.name, payload["content"], error=payload["error"], metadata=dict(payload["metadata"] or {}), value=payload["value"])
        result.metadata["isolation"] = "process"
        return result


def isolate_tools(tools: Any, **kwargs: Any) -> dict[str, IsolatedTool]:
    """Wrap every tool (mapping or sequence of tool-likes) in an IsolatedTool with the same settings."""
    return {name: IsolatedTool(tool, **kwargs) for name, tool in as_tools(tools).items()}
