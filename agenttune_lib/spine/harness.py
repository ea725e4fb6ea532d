"""Harnesses: the environment side of an episode, which executes actions and owns the EventLog.

``Harness`` is Gym-style (reset, step, action_space) with declared ``HarnessCapabilities``;
``DictToolHarness`` runs plain callables in process. Snapshots are in-process pickle blobs:
executable data that must not cross a trust boundary; each is sealed with an HMAC under a key
only its harness instance holds, and ``restore`` refuses any other blob before unpickling it.
"""
from __future__ import annotations

import abc
import copy
import dataclasses
import hashlib
import hmac
import json
import math
import os
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.spine.record import TokenRecord
from agenttune_lib.spine.state import Action, Generation, StepResult
from agenttune_lib.tools.base import BaseTool, ToolResult, as_tools
from agenttune_lib.tools.parsing import ToolCall, parse_tool_calls

__all__ = ["Harness", "HarnessCapabilities", "DictToolHarness", "task_text", "action_events", "action_from_text", "branch_log"]


@dataclasses.dataclass(frozen=True)
class HarnessCapabilities:
    """What a harness claims it can do; ``run_conformance`` checks the claims."""

    supports_snapshot: bool = False
    supports_streaming: bool = False
    supports_interruption: bool = False
    stepwise_turn: bool = True
    max_steps: int | None = None


def action_from_text(text: str, generation: Generation | None = None, schemas: dict[str, Any] | None = None) -> list[Action]:
    """Model text → actions in order: tool calls, malformed calls (``invalid``), or one final answer."""
    parsed = parse_tool_calls(text, schemas=schemas)
    if not parsed.items:
        return [Action.answer(text.strip(), raw=text, generation=generation)]
    actions: list[Action] = []
    for i, item in enumerate(parsed.items):
        gen = generation if i == 0 else None
        reasoning = parsed.text if i == 0 else ""
        if isinstance(item, ToolCall):
            actions.append(Action.call(item.name, item.arguments, id=item.id, reasoning=reasoning, raw=text if i == 0 else item.raw, generation=gen))
        else:
            actions.append(Action("invalid", raw=text if i == 0 else item.raw, reasoning=reasoning, error=item.to_error(), generation=gen))
    return actions


def coerce_action(action: Any) -> Action:
    """An Action from an Action, a ToolCall, a tool-call mapping or raw model text."""
    if isinstance(action, Action):
        return action
    if isinstance(action, ToolCall):
        return Action.call(action.name, action.arguments, id=action.id, raw=action.raw)
    if isinstance(action, Mapping):
        if not action.get("name"):
            raise ValueError(f"a tool-call mapping needs a 'name', got keys {sorted(action)}")
        args = action.get("arguments", action.get("args", {}))
        return Action.call(str(action["name"]), dict(args or {}), id=action.get("id"))
    if isinstance(action, str):
        return action_from_text(action)[0]
    raise TypeError(f"step() needs an Action, a tool-call mapping or model text, got {type(action).__name__}")


def task_text(task: Any) -> str:
    """The user-facing text of a task: a string, or a mapping's prompt/question/task field."""
    if isinstance(task, str):
        return task
    for attr in ("prompt", "instruction", "question", "task"):
        value = task.get(attr) if isinstance(task, Mapping) else getattr(task, attr, None)
        if isinstance(value, str) and value:
            return value
    raise ValueError(f"task has no text: expected a string or a mapping with prompt/question/task, got {task!r:.200}")


FORMAT_HINT = 'write a call as <tool_call>{"name": "<tool name>", "arguments": {"<parameter>": "<value>"}}</tool_call>'


def action_events(action: Action, call_id: str) -> tuple[list[Event], int]:
    """The agent-side events of an action and the index of the one that carries the completion's tokens."""
    events: list[Event] = []
    if action.kind == "tool_call":
        if action.reasoning.strip():
            events.append(Event(EventKind.REASONING, {"content": action.reasoning.strip()}))
        events.append(Event(EventKind.TOOL_CALL, {"name": action.name, "arguments": action.arguments, "id": call_id}))
    elif action.kind == "invalid":
        events.append(Event(EventKind.TEXT, {"content": action.raw or action.text, "malformed_tool_call": True}))
    else:
        if action.reasoning.strip() and action.reasoning.strip() != action.text.strip():
            events.append(Event(EventKind.REASONING, {"content": action.reasoning.strip()}))
        events.append(Event(EventKind.TEXT, {"content": action.text}))
    return events, len(events) - 1


def _own_turns(turns: list[dict[str, Any]], system_prompt: Any) -> list[dict[str, Any]]:
    """Turns with their system prompt dropped where it is the log's own (it is kept where it differed)."""
    out = []
    for turn in turns:
        turn = dict(turn)
        if "system" in turn and turn["system"] == system_prompt:
            del turn["system"]
        out.append(turn)
    return out


def branch_log(
    context: list[Event], action: Action, metadata: dict[str, Any], call_id: str | None = None
) -> EventLog:
    """A rejected candidate as its own EventLog: the context it was generated in plus its (unexecuted) action."""
    record = TokenRecord()
    events = list(context)
    agent, span_index = action_events(action, call_id or action.id or "call_rejected")
    if action.generation is not None:
        turn, span, lps = record.add(action.generation, len(events))
        turn["event"] = len(events) + span_index
        if span is not None:
            agent[span_index] = agent[span_index]._replace(token_span=span, logprobs=lps)
    events.extend(agent)
    meta = dict(metadata)
    meta["turns"] = _own_turns(record.turns, meta.get("system_prompt"))
    return EventLog(events, tier="full" if record.ids else "light", metadata=meta, token_ids=record.ids or None)


class Harness(abc.ABC):
    """Executes agent actions against an environment and records every event of the episode."""

    capabilities: HarnessCapabilities = HarnessCapabilities()
    step_error_reward: float = -1.0
    instructions: str | None = None

    def __init__(self, max_steps: int | None = 20) -> None:
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps must be a positive integer or None, got {max_steps!r}")
        self.max_steps = max_steps
        self._events: list[Event] = []
        self._tokens = TokenRecord()
        self._steps = 0
        self._done = False
        self._finalized = False
        self._final_start = 0
        self._task: Any = None
        self._metadata: dict[str, Any] = {}

    # -- environment hooks -------------------------------------------------------
    @abc.abstractmethod
    def action_space(self) -> list[dict[str, Any]]:
        """Tool schemas in OpenAI function format."""

    @abc.abstractmethod
    def _reset_env(self, task: Any) -> None:
        """Put the environment in the task's initial state."""

    @abc.abstractmethod
    def _execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool call; failures come back as a ToolResult with ``error``."""

    def episode_reward(self) -> float | None:
        """The episode's reward once it ends (None: this harness gives none)."""
        return None

    def _after_answer(self, text: str) -> list[Event] | None:
        """Events that answer the agent's message and continue the episode (a simulated user); None ends it."""
        return None

    def _env_state(self) -> Any:
        """Picklable environment state for snapshots (beyond the log)."""
        return None

    def _set_env_state(self, state: Any) -> None:
        pass

    def _env_fingerprint(self) -> str:
        """Canonical text of the environment state; harnesses that snapshot must override it."""
        raise NotImplementedError(f"{type(self).__name__} exposes no environment state fingerprint")

    def _perturb_env(self) -> bool:
        """Change the environment the way a tool could (conformance uses it); False when it cannot."""
        return False

    def state_fingerprint(self) -> str:
        """SHA-256 of the environment state alone: what ``restore()`` must bring back."""
        return hashlib.sha256(self._env_fingerprint().encode()).hexdigest()

    def task_metadata(self, task: Any) -> dict[str, Any]:
        return {"task": task_text(task)}

    # -- the Gym surface -----------------------------------------------------------
    @property
    def task(self) -> Any:
        return self._task

    @property
    def done(self) -> bool:
        return self._done

    @property
    def events(self) -> list[Event]:
        return list(self._events)

    def reset(self, task: Any) -> list[Event]:
        """Start an episode: fresh environment, fresh log holding the task as an OBSERVATION."""
        self._task = task
        self._events, self._tokens = [], TokenRecord()
        self._steps, self._done, self._finalized = 0, False, False
        self._reset_env(task)
        self._metadata = self.task_metadata(task)
        obs = Event(EventKind.OBSERVATION, {"content": task_text(task)})
        self._events.append(obs)
        return [obs]

    def tool_schemas(self) -> dict[str, dict[str, Any]]:
        """Tool name → JSON-schema parameters."""
        return {s["function"]["name"]: s["function"].get("parameters", {}) for s in self.action_space()}

    def record(self, event: Event) -> Event:
        """Append an event the agent side produced outside ``step`` (e.g. MEMORY_OP)."""
        if not isinstance(event, Event):
            event = Event.from_dict(event)
        if self._finalized:
            # Keep the episode's closing REWARD/TURN_COMPLETE last.
            self._events.insert(self._final_start, event)
            self._final_start += 1
        else:
            self._events.append(event)
        return event

    def step(self, action: Action | Mapping[str, Any] | str) -> StepResult:
        """Record the agent's action, execute it, record the result and any reward.

        Besides an Action, accepts a tool-call mapping (``name``, ``arguments``, ``id``) or
        raw model text (parsed; a malformed call becomes an error observation).
        """
        action = coerce_action(action)
        if self._task is None:
            raise RuntimeError("step() before reset(): no task")
        if self._done:
            return StepResult([], 0.0, True, {"already_done": True})
        start = len(self._events)
        call_id = action.id or f"call_{self._steps}"
        agent, span_index = action_events(action, call_id)
        turn, span, lps = self._record_turn(action.generation, start, start + span_index)
        if span is not None:
            agent[span_index] = agent[span_index]._replace(token_span=span, logprobs=lps)
        self._events.extend(agent)
        reward = 0.0
        if action.kind == "tool_call":
            result = self._execute(action.name or "", dict(action.arguments))
            self._events.append(Event(EventKind.TOOL_RESULT, result.to_payload(call_id)))
            if result.error is not None:
                reward = self.step_error_reward
        elif action.kind == "invalid":
            error = dict(action.error or {"type": "parse_error", "message": "malformed tool call"})
            self._events.append(
                Event(
                    EventKind.TOOL_RESULT,
                    {"name": str(error.get("tool") or ""), "content": f"error: {error.get('message')}; {FORMAT_HINT}", "id": call_id, "error": error},
                )
            )
            reward = self.step_error_reward
        else:
            reply = self._after_answer(action.text)
            if reply is None:
                self._done = True
            else:
                self._events.extend(reply)
        if reward:
            self._events.append(Event(EventKind.REWARD, {"value": float(reward), "source": "tool_error"}, scope="step"))
        self._steps += 1
        truncated = False
        if not self._done and self.max_steps is not None and self._steps >= self.max_steps:
            self._done = truncated = True
        if self._done:
            self.finalize(truncated=truncated)
        return StepResult(self._events[start:], reward, self._done, {"step": self._steps, "truncated": truncated})

    def finalize(self, truncated: bool = False) -> list[Event]:
        """End the episode once: the episode REWARD (if any) and TURN_COMPLETE."""
        if self._finalized:
            return []
        self._done = self._finalized = True
        self._final_start = len(self._events)
        new: list[Event] = []
        value = self.episode_reward()
        if value is not None:
            if math.isnan(float(value)):
                raise ValueError(f"{type(self).__name__}.episode_reward() returned NaN; a reward must be a number")
            new.append(Event(EventKind.REWARD, {"value": float(value), "source": type(self).__name__}, scope="episode"))
        new.append(Event(EventKind.TURN_COMPLETE, {"truncated": truncated, "steps": self._steps}))
        self._events.extend(new)
        return new

    def _record_turn(self, gen: Generation | None, prefix_len: int, event_index: int) -> tuple[dict[str, Any] | None, tuple[int, int] | None, list[float] | None]:
        """Record one model turn exactly as the Generation reports it (see ``spine.record``)."""
        if gen is None:
            return None, None, None
        turn, span, lps = self._tokens.add(gen, prefix_len)
        turn["event"] = event_index
        return turn, span, lps

    def stream_step(self, action: Action) -> Iterator[Event]:
        """Events of one step as they are produced (harnesses claiming streaming override this)."""
        raise NotImplementedError(f"{type(self).__name__} does not stream")

    def interrupt(self) -> None:
        """Stop at the next tool boundary (harnesses claiming interruption override this)."""
        raise NotImplementedError(f"{type(self).__name__} does not support interruption")

    # -- snapshots -------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """In-process pickle of the log and environment state, sealed with this harness's own key.

        A snapshot is executable data (paper §10): ``restore`` unpickles only blobs whose
        HMAC this harness instance produced, so a tampered or foreign blob is refused unread.
        """
        if not self.capabilities.supports_snapshot:
            raise NotImplementedError(f"{type(self).__name__} does not support snapshots")
        body = pickle.dumps(
            {
                "events": [e.to_dict() for e in self._events],
                "tokens": self._tokens.state(),
                "steps": self._steps,
                "done": self._done,
                "finalized": self._finalized,
                "final_start": self._final_start,
                "task": self._task,
                "metadata": self._metadata,
                "env": self._env_state(),
            }
        )
        return hmac.new(self._snapshot_key(), body, hashlib.sha256).digest() + body

    def _snapshot_key(self) -> bytes:
        key = getattr(self, "_sealing_key", None)
        if key is None:
            key = self._sealing_key = os.urandom(32)
        return key

    def restore(self, blob: bytes) -> None:
        if not self.capabilities.supports_snapshot:
            raise NotImplementedError(f"{type(self).__name__} does not support snapshots")
        if not isinstance(blob, (bytes, bytearray)) or len(blob) < 32:
            raise ValueError(f"restore() needs a snapshot from this harness's snapshot(), got {type(blob).__name__}")
        mac, body = bytes(blob[:32]), bytes(blob[32:])
        if not hmac.compare_digest(mac, hmac.new(self._snapshot_key(), body, hashlib.sha256).digest()):
            raise ValueError("restore() refused a snapshot this harness did not produce (tampered or foreign); snapshots are executable data")
        data = pickle.loads(body)  # sealed by this instance: in-process data only
        self._events = [Event.from_dict(e) for e in data["events"]]
        self._tokens = TokenRecord.from_state(data["tokens"])
        self._steps, self._done, self._finalized = data["steps"], data["done"], data["finalized"]
        self._final_start = data["final_start"]
        self._task, self._metadata = data["task"], data["metadata"]
        self._set_env_state(data["env"])

    def fingerprint(self) -> str:
        """Hash of the log and the environment state (what conformance compares around a restore)."""
        try:
            env = self._env_fingerprint()
        except NotImplementedError:
            env = ""
        body = json.dumps([e.to_dict() for e in self._events], sort_keys=True) + "|" + env
        return hashlib.sha256(body.encode()).hexdigest()

    def to_eventlog(self, metadata: Mapping[str, Any] | None = None) -> EventLog:
        """The episode so far as an EventLog (full tier when token spans were recorded)."""
        meta = {**self._metadata, "harness": type(self).__name__, **dict(metadata or {})}
        meta["turns"] = _own_turns(self._tokens.turns, meta.get("system_prompt"))
        ids = self._tokens.ids
        return EventLog(self._events, tier="full" if ids else "light", metadata=meta, token_ids=ids or None)


def _default_reward(log_text: str, task: Any) -> float | None:
    expected = None
    if isinstance(task, Mapping):
        expected = task.get("answer", task.get("expected"))
    if expected is None:
        return None
    return 1.0 if str(expected).strip().lower() in log_text.lower() else 0.0


class DictToolHarness(Harness):
    """Plain Python callables in process, no sandbox; tool failures become error results.

    ``reward_fn(final_text, task) -> float`` gives the episode reward; by default a task
    mapping with ``answer`` scores 1.0 when the final text contains it. ``state`` is an
    optional mutable dict the tools share, snapshotted with the log.
    """

    capabilities = HarnessCapabilities(supports_snapshot=True, stepwise_turn=True)

    def __init__(
        self,
        tools: Any,
        reward_fn: Callable[[str, Any], float | None] | None = None,
        max_steps: int | None = 20,
        state: dict[str, Any] | None = None,
        instructions: str | None = None,
    ) -> None:
        super().__init__(max_steps=max_steps)
        self.tools: dict[str, BaseTool] = as_tools(tools)
        self.reward_fn = reward_fn or _default_reward
        self.state = state if state is not None else {}
        self._initial_state = copy.deepcopy(self.state)
        self.instructions = instructions
        self.capabilities = dataclasses.replace(type(self).capabilities, max_steps=max_steps)

    def action_space(self) -> list[dict[str, Any]]:
        return [tool.to_schema() for tool in self.tools.values()]

    def _reset_env(self, task: Any) -> None:
        self.state.clear()
        self.state.update(copy.deepcopy(self._initial_state))

    def _execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        tool = self.tools.get(name)
        if tool is None:
            message = f"unknown tool {name!r}; available: {sorted(self.tools)}"
            return ToolResult(name, f"error: {message}", error={"type": "unknown_tool", "message": message, "tool": name})
        return tool.invoke(arguments)

    def episode_reward(self) -> float | None:
        final = next((e for e in reversed(self._events) if e.kind is EventKind.TEXT and not e.payload.get("malformed_tool_call")), None)
        text = final.payload.get("content", "") if final is not None else ""
        value = self.reward_fn(text if isinstance(text, str) else json.dumps(text), self._task)
        return None if value is None else float(value)

    def _env_state(self) -> Any:
        return copy.deepcopy(self.state)

    def _set_env_state(self, state: Any) -> None:
        self.state.clear()
        self.state.update(copy.deepcopy(state))

    def _env_fingerprint(self) -> str:
        return json.dumps(self.state, sort_keys=True, default=str)

    def _perturb_env(self) -> bool:
        self.state["__conformance_probe__"] = self.state.get("__conformance_probe__", 0) + 1
        return True
