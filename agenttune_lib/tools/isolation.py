"""Process isolation for tools: each call runs in a fresh bubblewrap sandbox at a stated level (``tools.sandbox``), failing closed.

A crashing, hanging or hostile tool cannot take down the rollout loop, read its memory or
environment, signal it, reach the network or host sockets, write outside its private tmpfs or
outlive its call. When the requested level cannot be had (no bubblewrap, namespaces refused, no
seccomp) the call is refused with an error naming what is missing; it runs only if the caller
explicitly chose a lower ``level``. Every result's ``metadata["sandbox"]`` records the level,
what it lacks against ``strict`` and what the sandbox verified, so the EventLog's TOOL_RESULT
says how each call was confined. In-process fallback happens only for the reasons the caller
lists in ``allow_fallback`` (none by default), and is recorded in ``metadata["isolation"]``.
"""
from __future__ import annotations

import dataclasses
import math
import pickle
import threading
from collections.abc import Iterable
from typing import Any

from agenttune_lib.tools.base import BaseTool, ToolResult, as_tool, as_tools
from agenttune_lib.tools.sandbox import LEVELS, SandboxConfig, SandboxError, SandboxUnavailable, run_in_sandbox

__all__ = ["IsolatedTool", "isolate_tools", "FALLBACK_REASONS", "SandboxConfig", "LEVELS"]

#: Why isolation can fail; ``allow_fallback`` names the ones that may fall back in process.
FALLBACK_REASONS = ("unpicklable", "unavailable", "crash", "timeout")


class IsolatedTool(BaseTool):
    """The wrapped tool's interface, each call executed in a fresh sandbox at ``sandbox.level`` (default ``strict``)."""

    def __init__(
        self,
        tool: Any,
        timeout: float = 30.0,
        require_isolation: bool = False,
        allow_fallback: bool | Iterable[str] = (),
        sandbox: SandboxConfig | None = None,
        level: str | None = None,
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
        if require_isolation:
            self.fallback_on = set()
        config = sandbox or SandboxConfig()
        if level is not None:
            if level not in LEVELS:
                raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
            config = dataclasses.replace(config, level=level)
        self.sandbox = config
        #: Whether the caller chose the level (a lower one is only ever an explicit choice).
        self.level_chosen = level is not None or sandbox is not None

    def _modules(self) -> tuple[str, ...]:
        """Modules the wrapped tool lives in (for the sandbox to import before unpickling)."""
        names = {type(self.tool).__module__}
        fn = getattr(self.tool, "fn", None) or getattr(self.tool, "func", None)
        if fn is not None and getattr(fn, "__module__", None):
            names.add(fn.__module__)
        return tuple(sorted(n for n in names if n and n != "__main__"))

    def _record(self) -> dict[str, Any]:
        return {"level": self.sandbox.level, "chosen_by": "caller" if self.level_chosen else "default",
                "lowered": self.sandbox.lowered(), "network": "host" if self.sandbox.network else "none"}

    def execute(self, **kwargs: Any) -> Any:
        result = self.invoke(kwargs, validate=False)
        if result.error is not None:
            from agenttune_lib.tools.base import ToolError

            raise ToolError(result.error.get("message", "isolated call failed"), type=result.error.get("type", "tool_error"))
        return result.value if result.value is not None else result.content

    def _failed(self, reason: str, message: str, arguments: dict[str, Any], extra: dict[str, Any] | None = None) -> ToolResult:
        if reason not in self.fallback_on:
            kinds = {"unavailable": "sandbox_unavailable", "unpicklable": "isolation_required"}
            kind = kinds.get(reason, reason)
            error = {"type": kind, "message": message, "tool": self.name, **(extra or {})}
            result = ToolResult(self.name, f"error: {message}", error=error)
            result.metadata["isolation"] = "refused" if reason in kinds else "process"
            result.metadata["isolation_failure"] = reason
            result.metadata["sandbox"] = {**self._record(), **(extra or {})}
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
            return self._failed("unpicklable", f"tool {self.name!r} cannot be sent to a sandbox ({type(exc).__name__}: {exc})", args)
        try:
            reply = run_in_sandbox(self.sandbox, blob, args, self.timeout, self._modules())
        except SandboxUnavailable as exc:
            return self._failed("unavailable", f"tool {self.name!r} refused: {exc}", args, {"missing": exc.missing})
        except SandboxError as exc:
            return self._failed("crash", f"tool {self.name!r}: {exc}", args)
        status = reply.get("status")
        if status == "timeout":
            message = f"tool {self.name!r} did not finish within {self.timeout}s; its sandbox was killed{_stderr_said(reply)}"
            return self._failed("timeout", message, args, {"processes": list(reply.get("processes") or [])})
        if status == "crash":
            return self._failed("crash", f"tool {self.name!r} sandbox died (exit code {reply.get('exitcode')}){_stderr_said(reply)}", args)
        if status != "ok":
            return self._failed("crash", f"tool {self.name!r} could not run in the sandbox: {reply.get('message')}", args)
        result = ToolResult(self.name, str(reply.get("content", "")), error=reply.get("error"), metadata=dict(reply.get("metadata") or {}), value=reply.get("value"))
        result.metadata["isolation"] = "process"
        result.metadata["sandbox"] = {**self._record(), "verified": reply.get("verified", [])}
        return result


def isolate_tools(tools: Any, **kwargs: Any) -> dict[str, IsolatedTool]:
    """Wrap every tool (mapping or sequence of tool-likes) in an IsolatedTool with the same settings."""
    return {name: IsolatedTool(tool, **kwargs) for name, tool in as_tools(tools).items()}


def _stderr_said(reply: dict[str, Any]) -> str:
    """The error-message tail naming what a failed sandbox last wrote to stderr ("" when it wrote nothing)."""
    tail = reply.get("stderr") or ""
    return f"; its stderr ended: {tail[-600:]}" if tail else ""
