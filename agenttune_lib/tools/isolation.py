"""Process isolation for tools: each call runs in a confined, pooled worker process (``tools.sandbox``).

A crashing, hanging or hostile tool cannot take down the rollout loop, read its memory or
environment, signal it, reach the network, write outside its private directory or outlive
its call (where the OS allows: see ``SandboxWorker.protections``, recorded per call in
``metadata["sandbox"]``). When isolation is impossible (the tool does not pickle, the worker
does not start) the call falls back to in-process execution if allowed; which path ran is
recorded in ``metadata["isolation"]``. ``require_isolation=True`` turns every fallback into an
error result. Crashes and timeouts fall back only when ``allow_fallback=True`` (all reasons);
an in-process fallback still runs under the timeout, in a daemon thread.
"""
from __future__ import annotations

import json
import math
import pickle
import threading
from collections.abc import Iterable
from typing import Any

from agenttune_lib.tools.base import BaseTool, ToolResult, as_tool, as_tools
from agenttune_lib.tools.sandbox import SandboxConfig, SandboxError, acquire_worker, release_worker

__all__ = ["IsolatedTool", "isolate_tools", "FALLBACK_REASONS", "SandboxConfig"]

#: Why isolation can fail; ``allow_fallback`` names the ones that may fall back in process.
FALLBACK_REASONS = ("unpicklable", "start_failed", "crash", "timeout")
_DEFAULT_FALLBACK = ("unpicklable", "start_failed")


class IsolatedTool(BaseTool):
    """The wrapped tool's interface, each call executed in a fresh confined process of a pooled sandbox worker."""

    def __init__(
        self,
        tool: Any,
        timeout: float = 30.0,
        require_isolation: bool = False,
        allow_fallback: bool | Iterable[str] = _DEFAULT_FALLBACK,
        sandbox: SandboxConfig | None = None,
    ) -> None:
        self.tool = as_tool(tool)
        self.name = self.tool.name
        self.description = self.tool.description
        self.parameters = self.tool.parameters
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a positive finite number of seconds, got {timeout!r}")
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
        self.sandbox = sandbox or SandboxConfig()

    def _modules(self) -> tuple[str, ...]:
        """Modules the wrapped tool lives in (for the worker to import once)."""
        names = {type(self.tool).__module__}
        fn = getattr(self.tool, "fn", None) or getattr(self.tool, "func", None)
        if fn is not None and getattr(fn, "__module__", None):
            names.add(fn.__module__)
        return tuple(sorted(n for n in names if n and n != "__main__"))

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
        try:
            worker = acquire_worker(self.sandbox)
        except SandboxError as exc:
            return self._failed("start_failed", str(exc), args)
        try:
            reply = worker.call(blob, args, self.timeout, self._modules())
        except SandboxError as exc:
            return self._failed("crash", f"tool {self.name!r}: {exc}", args)
        finally:
            release_worker(worker)
        status = reply.get("status")
        if status == "timeout":
            return self._failed("timeout", f"tool {self.name!r} did not finish within {self.timeout}s; its process group was killed", args)
        if status == "crash":
            return self._failed("crash", f"tool {self.name!r} worker died (exit code {reply.get('exitcode')})", args)
        body = json.loads(reply["body"]) if status == "reply" else {"status": "error", "message": reply.get("message")}
        if body.get("status") != "ok":
            return self._failed("crash", f"tool {self.name!r} could not run in the sandbox: {body.get('message')}", args)
        result = ToolResult(self.name, str(body.get("content", "")), error=body.get("error"), metadata=dict(body.get("metadata") or {}), value=body.get("value"))
        result.metadata["isolation"] = "process"
        result.metadata["sandbox"] = {k: v for k, v in worker.protections.items() if k != "reasons"}
        return result


def isolate_tools(tools: Any, **kwargs: Any) -> dict[str, IsolatedTool]:
    """Wrap every tool (mapping or sequence of tool-likes) in an IsolatedTool with the same settings."""
    return {name: IsolatedTool(tool, **kwargs) for name, tool in as_tools(tools).items()}
