"""AgentTuneGraph's parts: its state keys, node records, signature inspection and the completions-to-episodes helpers."""
from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agenttune_lib.events import AGENT_KINDS, Event, EventKind, EventLog
from agenttune_lib.multi_agent.episode import message_events
from agenttune_lib.multi_agent.judges import JudgeAdapter

__all__ = ["GraphCompileError", "GRAPH_INPUTS", "BUILTIN_KEYS"]

#: State keys the caller provides: the batch's prompts, (under GRPO) the trainer, and per-prompt metadata (dataset columns).
GRAPH_INPUTS = ("prompts", "trainer", "prompt_metadata")
#: State keys the graph's own steps produce: merged episodes, scored trajectories, the panel's rewards.
BUILTIN_KEYS = ("episodes", "trajectories", "judge_rewards", "judge_scores", "token_agent", "route")
_EPISODE, _PANEL, _ROUTE, _ROUTER = "__episode__", "__panel__", "__route__", "__router__"


class GraphCompileError(ValueError):
    """The graph's wiring cannot be resolved; the message names the node and the parameter."""


@dataclasses.dataclass
class _Node:
    name: str
    kind: str  # rollout | function | judge
    call: Callable[..., Any]
    params: dict[str, bool]  # parameter name -> required
    inputs: dict[str, str]  # parameter name -> state key
    outputs: tuple[str, ...]
    trainable: bool = False
    captured: list[Any] = dataclasses.field(default_factory=list)
    judge: JudgeAdapter | None = None

    def key_of(self, param: str) -> str:
        return self.inputs.get(param, param)


def _signature(name: str, fn: Callable[..., Any]) -> dict[str, bool]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise GraphCompileError(f"node {name!r}: cannot inspect its parameters ({exc})") from None
    params = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind is p.POSITIONAL_ONLY:
            raise GraphCompileError(f"node {name!r}: parameter {p.name!r} is positional-only; nodes are called by keyword")
        params[p.name] = p.default is p.empty
    return params


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise GraphCompileError(f"{what} name {name!r} must be a Python identifier (it is wired as a parameter name)")


class _DatasetColumns:
    """The trainer's dataset columns (e.g. ``answer``) per prompt: TRL hands rollout_func only the prompts."""

    def __init__(self) -> None:
        self._source: Any = None
        self._index: dict[str, dict[str, Any]] = {}

    def lookup(self, trainer: Any, prompts: Sequence[Any]) -> list[dict[str, Any]] | None:
        dataset = getattr(trainer, "train_dataset", None)
        if dataset is None or not hasattr(dataset, "column_names") or "prompt" not in dataset.column_names:
            return None
        if dataset is not self._source:
            self._source, self._index = dataset, {}
            cols = [c for c in dataset.column_names if c != "prompt"]
            for row in dataset:
                meta = {c: row[c] for c in cols if _json_scalar(row[c])}
                self._index.setdefault(json.dumps(row["prompt"], sort_keys=True, default=str), meta)
        return [dict(self._index.get(json.dumps(p, sort_keys=True, default=str), {})) for p in prompts]


def _json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _is_rollout_func(fn: Any) -> bool:
    """A TRL-style ``rollout_func(prompts, trainer)``: a callable whose first two parameters are named so."""
    if not callable(fn):
        return False
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return names[:2] == ["prompts", "trainer"]


def _typed_outputs(fn: Any) -> tuple[str, ...] | None:
    """Output keys from a TypedDict return annotation, if the function declares one."""
    import typing

    try:
        ret = typing.get_type_hints(fn).get("return")
    except Exception:
        return None
    if isinstance(ret, type) and issubclass(ret, dict) and hasattr(ret, "__total__") and getattr(ret, "__annotations__", None):
        return tuple(ret.__annotations__)
    return None


def _gid(step: str) -> str:
    """LangGraph node id of a step (node ids may not collide with state keys)."""
    return f"{step}@node"


def _episodes_from_completions(prompts: Sequence[Any] | None, completions: Sequence[Any], task_metadata: Mapping[str, Any], answers: Any) -> list[EventLog]:
    from agenttune_lib.rl.rollout import split_prompt

    logs = []
    for i, comp in enumerate(completions):
        task = split_prompt(prompts[i])[1] if prompts is not None else ""
        events = [Event(EventKind.OBSERVATION, {"content": task})]
        msgs = [{"role": "assistant", "content": comp}] if isinstance(comp, str) else list(comp)
        for ev in message_events(msgs):
            events.append(ev._replace(author="policy") if ev.kind in AGENT_KINDS else ev)
        meta = dict(task_metadata.get(task, {}), task=task)
        if answers is not None and i < len(answers) and answers[i] is not None:
            meta.setdefault("answer", answers[i])
        logs.append(EventLog(events, metadata=meta))
    return logs
