"""The Environment protocol (TEAM contract 5): tools + reset + reward + success, one task per dataset row.

The trainer, the ``trained_adapter`` asset and ``agenttune train`` all build episodes the same way:
a row names its environment and carries its task; a fresh environment is reset to that task,
the policy sees and calls exactly ``tools()``, and ``reward`` scores the finished episode.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Environment", "ENVIRONMENTS", "register_environment", "make_environment", "environment_factories", "environment_rows", "episode_environments"]


@runtime_checkable
class Environment(Protocol):
    """One episode's world. ``completion`` is the episode's messages (assistant turns and tool results)."""

    name: str
    #: tool-calling turns the episode may take (0: a single reply, its calls are scored but not executed)
    max_tool_turns: int | None

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Start the task; return the chat messages (system, user) the policy sees before its first turn."""

    def tools(self) -> list[Any]:
        """The BaseTools this episode executes, bound to this environment's state."""

    def reward(self, completion: list[dict[str, Any]]) -> float:
        """The episode reward."""

    def success(self, completion: list[dict[str, Any]]) -> bool:
        """Whether the task was solved."""

    def metrics(self, completion: list[dict[str, Any]]) -> dict[str, Any]:
        """Per-episode counters (tool calls, searches)."""


#: name -> constructor taking keyword resources (e.g. backend= for qa_search)
ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}


def register_environment(name: str, ctor: Callable[..., Environment]) -> None:
    ENVIRONMENTS[name] = ctor


def _ensure_builtin() -> None:
    if ENVIRONMENTS:
        return
    from agenttune_lib.rl.environments.qa_search import QASearchEnvironment
    from agenttune_lib.rl.environments.tau2 import Tau2Environment
    from agenttune_lib.rl.environments.tool_call import ToolCallEnvironment

    register_environment("tau2_retail", Tau2Environment)
    register_environment("qa_search", QASearchEnvironment)
    register_environment("tool_call", ToolCallEnvironment)


def make_environment(name: str, **resources: Any) -> Environment:
    """A fresh environment by name (``tau2_retail``, ``qa_search`` (needs backend=), ``tool_call``)."""
    _ensure_builtin()
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; known: {sorted(ENVIRONMENTS)}")
    return ENVIRONMENTS[name](**resources)


def environment_factories(names: Sequence[str], **resources: Any) -> dict[str, Callable[[], Environment]]:
    """{name: zero-argument factory} for the trainer's ``environments=``; resources go to every constructor that takes them."""
    import inspect

    _ensure_builtin()
    out = {}
    for name in names:
        if name not in ENVIRONMENTS:
            raise ValueError(f"unknown environment {name!r}; known: {sorted(ENVIRONMENTS)}")
        ctor = ENVIRONMENTS[name]
        params = inspect.signature(ctor).parameters
        kw = {k: v for k, v in resources.items() if k in params}
        out[name] = (lambda c=ctor, k=kw: c(**k))
    return out


def environment_rows(env: Environment, tasks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Dataset rows for ``tasks``: the prompt the environment shows, its name and the task as JSON (one task per row)."""
    rows = []
    for task in tasks:
        rows.append({"prompt": env.reset(task), "environment": env.name, "task": json.dumps(dict(task), sort_keys=True, default=str)})
    return rows


def episode_environments(
    rows: Sequence[Mapping[str, Any]] | None, n: int, environments: Mapping[str, Callable[[], Any]] | None
) -> tuple[list[Any] | None, list[dict[str, Any] | None] | None]:
    """One fresh environment and task per episode from the rows' ``environment``/``task`` columns (None when no row names one)."""
    if not rows or not any(r.get("environment") for r in rows):
        return None, None
    if len(rows) != n:
        raise ValueError(f"rollout: {len(rows)} dataset rows for {n} prompts")
    envs: list[Any] = []
    tasks: list[dict[str, Any] | None] = []
    for row in rows:
        name = row.get("environment")
        if not name:
            envs.append(None)
            tasks.append(None)
            continue
        if not environments or name not in environments:
            raise ValueError(
                f"dataset row names environment {name!r} but the trainer has {sorted(environments or {})}; "
                "pass environments={name: factory} (agenttune_lib.rl.environments.make_environment)"
            )
        task = row.get("task")
        task = json.loads(task) if isinstance(task, str) else dict(task or {})
        envs.append(environments[name]())
        tasks.append(task)
    return envs, tasks
