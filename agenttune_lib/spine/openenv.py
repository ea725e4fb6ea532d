"""OpenEnvHarness: any environment object exposing ``reset()`` and ``step(action)`` (an OpenEnv Environment or a fake).

The environment executes tool calls itself (remotely, in OpenEnv's case); this harness only
translates between Actions and the EventLog. No snapshots: a remote sandbox cannot be
pickled, so the capability is not claimed.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agenttune_lib.spine.harness import Harness, HarnessCapabilities
from agenttune_lib.spine.state import StepResult
from agenttune_lib.tools.base import ToolResult, as_tools, render_content

__all__ = ["OpenEnvHarness"]


def _unpack(out: Any) -> tuple[Any, float | None, bool, dict[str, Any]]:
    """(observation, reward, done, info) from a Gym tuple, an OpenEnv-style object or a mapping."""
    if isinstance(out, tuple):
        obs = out[0]
        reward = out[1] if len(out) > 1 else None
        done = bool(out[2]) if len(out) > 2 else False
        info = dict(out[-1]) if len(out) > 3 and isinstance(out[-1], Mapping) else {}
        return obs, reward, done, info
    if isinstance(out, Mapping):
        return out.get("observation", out), out.get("reward"), bool(out.get("done", False)), dict(out.get("info") or {})
    if hasattr(out, "observation") or hasattr(out, "done"):
        return getattr(out, "observation", out), getattr(out, "reward", None), bool(getattr(out, "done", False)), {}
    return out, None, False, {}


class OpenEnvHarness(Harness):
    """Wraps an environment; a tool call becomes ``env.step({"name", "arguments"})`` and its observation a TOOL_RESULT."""

    capabilities = HarnessCapabilities(supports_snapshot=False, stepwise_turn=True)

    def __init__(self, env: Any, tools: Sequence[dict[str, Any]] | Any = (), max_steps: int | None = 20) -> None:
        super().__init__(max_steps=max_steps)
        for method in ("reset", "step"):
            if not callable(getattr(env, method, None)):
                raise TypeError(f"OpenEnvHarness needs an environment with reset() and step(action); {type(env).__name__} has no {method}()")
        self.env = env
        self.capabilities = HarnessCapabilities(supports_snapshot=False, stepwise_turn=True, max_steps=max_steps)
        if tools and not (isinstance(tools, Sequence) and all(isinstance(t, Mapping) for t in tools)):
            tools = [t.to_schema() for t in as_tools(tools).values()]
        self._schemas = [dict(t) for t in tools] or self._env_schemas()
        self._env_reward: float | None = None
        self._env_done = False

    def _env_schemas(self) -> list[dict[str, Any]]:
        lister = getattr(self.env, "list_tools", None) or getattr(self.env, "tools", None)
        found = lister() if callable(lister) else lister
        return [t.to_schema() if hasattr(t, "to_schema") else dict(t) for t in (found or [])]

    def action_space(self) -> list[dict[str, Any]]:
        return [dict(s) for s in self._schemas]

    def _reset_env(self, task: Any) -> None:
        self._env_reward, self._env_done = None, False
        takes_task = bool(inspect.signature(self.env.reset).parameters)
        self.env.reset(task) if takes_task else self.env.reset()

    def _execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            obs, reward, done, info = _unpack(self.env.step({"name": name, "arguments": dict(arguments)}))
        except Exception as exc:  # a remote failure is an observation, not a crash
            message = f"{type(exc).__name__}: {exc}"
            return ToolResult(name, f"error: {message}", error={"type": "environment_error", "message": message, "tool": name})
        if reward is not None:
            self._env_reward = float(reward)
        if done:
            self._env_done = True
        error = info.get("error") or (obs.get("error") if isinstance(obs, Mapping) else None)
        content = render_content(obs)
        if error:
            return ToolResult(name, f"error: {error}" if not content.startswith("error") else content, error={"type": "tool_error", "message": str(error), "tool": name})
        return ToolResult(name, content, value=obs)

    def step(self, action: Any) -> StepResult:
        """As Harness.step; the environment saying ``done`` ends the episode with its reward."""
        result = super().step(action)
        if self._env_done and not self._finalized:
            result.events = [*result.events, *self.finalize()]
            result.done = True
        return result

    def episode_reward(self) -> float | None:
        return self._env_reward

    def _env_fingerprint(self) -> str:
        """The environment's own ``state`` (OpenEnv's State) when it exposes one, plus the episode's reward/done."""
        state = getattr(self.env, "state", None)
        state = state() if callable(state) else state
        if state is None:
            raise NotImplementedError(f"{type(self.env).__name__} exposes no state to fingerprint")
        body = dataclasses.asdict(state) if dataclasses.is_dataclass(state) and not isinstance(state, type) else state
        return json.dumps({"state": body, "reward": self._env_reward, "done": self._env_done}, sort_keys=True, default=str)
