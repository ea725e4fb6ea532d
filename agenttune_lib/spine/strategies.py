"""Five agent strategies behind one four-method interface: init, propose, observe, is_done.

Model access is an injected callable (messages or a prompt in, text or a Generation out),
so a scripted function and a real ``model.generate`` wrapper are interchangeable.
"""
from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.spine.harness import Harness, action_from_text, branch_log, task_text
from agenttune_lib.spine.record import link_branches
from agenttune_lib.spine.prompts import ModelFn, call_model, messages_from_events, system_prompt
from agenttune_lib.spine.state import Action, AgentState, Generation, StepResult
from agenttune_lib.tools.parsing import parse_tool_calls

__all__ = [
    "AgentStrategy",
    "ReActStrategy",
    "PlanExecuteStrategy",
    "ReflexionStrategy",
    "MemoryReActStrategy",
    "TreeOfThoughtsStrategy",
    "action_from_text",
    "default_action_score",
]


class AgentStrategy:
    """Base strategy: holds the injected model and the per-episode prompt; subclasses decide actions."""

    name = "base"

    def __init__(
        self,
        model: ModelFn,
        max_steps: int = 10,
        input_format: str = "messages",
        extra_instructions: Sequence[str] = (),
        tool_format: str = "json",
        max_tool_chars: int | None = None,
        final_answer_prompt: str | None = None,
    ) -> None:
        """``final_answer_prompt``: a user message added before the last step's generation, asking for the answer
        (the iteration-limit answer of agent runtimes); None: the last step is prompted like any other."""
        if not callable(model):
            raise TypeError(f"model must be callable (messages -> text), got {type(model).__name__}")
        if input_format not in ("messages", "prompt"):
            raise ValueError(f"input_format must be 'messages' or 'prompt', got {input_format!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        self.model = model
        self.max_steps = max_steps
        self.input_format = input_format
        self.extra_instructions = list(extra_instructions)
        if tool_format not in ("json", "compact"):
            raise ValueError(f"tool_format must be 'json' or 'compact', got {tool_format!r}")
        self.tool_format = tool_format
        self.max_tool_chars = max_tool_chars
        self.final_answer_prompt = final_answer_prompt

    # -- the interface ----------------------------------------------------------
    def init(self, task: Any, tools: Sequence[dict[str, Any]] = (), instructions: str | None = None) -> AgentState:
        state = AgentState(task=task)
        state.scratch["tools"] = list(tools)
        state.scratch["schemas"] = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
        state.scratch["system"] = system_prompt(tools, instructions, self._extra_notes(), self.tool_format)
        state.scratch["queue"] = []
        return state

    def propose(self, state: AgentState) -> Action:
        raise NotImplementedError

    def observe(self, state: AgentState, result: StepResult) -> None:
        state.step += 1
        state.done = state.done or result.done
        state.scratch["last_result"] = result

    def is_done(self, state: AgentState) -> bool:
        return state.done or state.step >= self.max_steps

    # -- helpers ------------------------------------------------------------------
    def _extra_notes(self) -> list[str]:
        return list(self.extra_instructions)

    def messages(self, state: AgentState) -> list[dict[str, str]]:
        return messages_from_events(state.scratch.get("system"), state.events, self.max_tool_chars)

    def generate(self, messages: list[dict[str, str]]) -> tuple[str, Generation | None]:
        return call_model(self.model, messages, self.input_format)

    def _next_from_model(self, state: AgentState) -> Action:
        queue: list[Action] = state.scratch.setdefault("queue", [])
        if queue:
            return queue.pop(0)
        messages = self.messages(state)
        if self.final_answer_prompt and state.step == self.max_steps - 1 and state.step > 0:
            messages = [*messages, {"role": "user", "content": self.final_answer_prompt}]
        text, gen = self.generate(messages)
        actions = action_from_text(text, gen, state.scratch.get("schemas"))
        queue.extend(actions[1:])
        return actions[0]

    def log_metadata(self, state: AgentState) -> dict[str, Any]:
        """What the strategy adds to the episode's EventLog metadata."""
        meta = {"strategy": self.name, "system_prompt": state.scratch.get("system", "")}
        if self.max_tool_chars is not None:
            meta["max_tool_chars"] = self.max_tool_chars
        return meta


class ReActStrategy(AgentStrategy):
    """One action per step from the model; stops on a final answer or at ``max_steps``."""

    name = "react"

    def propose(self, state: AgentState) -> Action:
        return self._next_from_model(state)


class PlanExecuteStrategy(AgentStrategy):
    """Asks once for a complete plan of tool calls, replays it, then asks for the final answer."""

    name = "plan_execute"
    PLAN_NOTE = (
        "First write the complete plan: every tool call needed, each as its own "
        "<tool_call>{...}</tool_call>, in order. Later arguments may only use values you already know."
    )

    def init(self, task: Any, tools: Sequence[dict[str, Any]] = (), instructions: str | None = None) -> AgentState:
        state = super().init(task, tools, instructions)
        state.scratch["plan"] = None
        state.scratch["cursor"] = 0
        state.scratch["instructions"] = instructions
        return state

    def _make_plan(self, state: AgentState) -> list[Action]:
        system = system_prompt(state.scratch["tools"], state.scratch.get("instructions"), [*self._extra_notes(), self.PLAN_NOTE], self.tool_format)
        text, gen = self.generate(messages_from_events(system, state.events, self.max_tool_chars))
        actions = action_from_text(text, gen, state.scratch.get("schemas"))
        plan = [a for a in actions if a.kind != "answer"]
        state.scratch["plan_text"] = text
        state.scratch["plan_generation"] = gen
        return plan

    def propose(self, state: AgentState) -> Action:
        if state.scratch["plan"] is None:
            state.scratch["plan"] = self._make_plan(state)
            if not state.scratch["plan"] and state.scratch.get("plan_text", "").strip():
                # The model answered without planning any call: that is its final answer.
                state.scratch["plan"] = []
                text = state.scratch["plan_text"]
                return Action.answer(text.strip(), raw=text, generation=state.scratch.get("plan_generation"))
        plan: list[Action] = state.scratch["plan"]
        if state.scratch["cursor"] < len(plan):
            action = plan[state.scratch["cursor"]]
            state.scratch["cursor"] += 1
            return action
        text, gen = self.generate(self.messages(state))
        actions = action_from_text(text, gen, state.scratch.get("schemas"))
        state.scratch["queue"].extend(actions[1:])
        return actions[0]

    def log_metadata(self, state: AgentState) -> dict[str, Any]:
        meta = super().log_metadata(state)
        plan = state.scratch.get("plan") or []
        meta["plan"] = [a.name if a.kind == "tool_call" else a.kind for a in plan]
        meta["plan_calls"] = [a.describe() for a in plan]
        return meta


class ReflexionStrategy(ReActStrategy):
    """ReAct that carries a verbal self-critique of each failed attempt into the next (driven by ``run_reflexion``)."""

    name = "reflexion"
    CRITIC = (
        "You review a failed attempt at a task. In at most three sentences, say what went wrong "
        "and what to do differently next time. Do not call tools."
    )

    def __init__(self, model: ModelFn, max_attempts: int = 3, **kw: Any) -> None:
        super().__init__(model, **kw)
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self.reflections: list[str] = []
        self.last_critique_turn: dict[str, Any] = {}

    def _extra_notes(self) -> list[str]:
        notes = super()._extra_notes()
        if self.reflections:
            notes.append("Lessons from your earlier failed attempts:\n" + "\n".join(f"- {r}" for r in self.reflections))
        return notes

    def reflect(self, log: EventLog) -> str:
        """Ask the model for a self-critique of a failed attempt and keep it for the next one."""
        transcript = messages_from_events(None, log.events)
        body = "\n".join(f"{m['role']}: {m['content']}" for m in transcript)
        rewards = log.rewards("episode")
        outcome = f"Episode reward: {rewards[-1]}" if rewards else "The attempt did not succeed."
        text, gen = self.generate([{"role": "system", "content": self.CRITIC}, {"role": "user", "content": f"{body}\n\n{outcome}"}])
        critique = parse_tool_calls(text).text.strip() or text.strip() or "The previous attempt failed."
        self.reflections.append(critique)
        # The critique is a model turn too: keep exactly what it consumed and produced.
        self.last_critique_turn = {
            "critique": critique,
            "messages": gen.messages,
            "text": gen.text,
            "prompt_ids": list(gen.prompt_ids) if gen.prompt_ids is not None else None,
            "completion_ids": list(gen.completion_ids) if gen.completion_ids is not None else None,
            "logprobs": list(gen.logprobs) if gen.logprobs is not None else None,
        }
        return critique

    def log_metadata(self, state: AgentState) -> dict[str, Any]:
        meta = super().log_metadata(state)
        meta["reflections"] = list(self.reflections)
        return meta


class MemoryReActStrategy(ReActStrategy):
    """ReAct with persistent memory: recalls k items at init, stores each observation (MEMORY_OP events)."""

    name = "memory_react"

    def __init__(self, model: ModelFn, memory: Any, k: int = 3, scope: Any = None, **kw: Any) -> None:
        super().__init__(model, **kw)
        self.memory = memory
        self.k = k
        self.scope = scope

    def init(self, task: Any, tools: Sequence[dict[str, Any]] = (), instructions: str | None = None) -> AgentState:
        from agenttune_lib.spine.memory.base import MemoryItem  # noqa: F401  (memory package is plain python)

        state = super().init(task, tools, instructions)
        query = task_text(task)
        items = list(self.memory.recall(query, k=self.k, scope=self.scope))
        state.scratch["recalled"] = items
        state.emit(
            Event(
                EventKind.MEMORY_OP,
                {
                    "op": "recall",
                    "query": query,
                    "content": "\n".join(f"- {item.content}" for item in items) if items else "(no relevant memory)",
                    "item_ids": [item.id for item in items],
                },
            )
        )
        return state

    def observe(self, state: AgentState, result: StepResult) -> None:
        from agenttune_lib.spine.memory.base import MemoryItem

        super().observe(state, result)
        call = next((e for e in result.events if e.kind is EventKind.TOOL_CALL), None)
        observation = result.observation
        if not observation:
            return
        prefix = f"{call.payload.get('name')}({json.dumps(call.payload.get('arguments'), sort_keys=True)}) -> " if call else ""
        item = MemoryItem(
            content=prefix + observation[:2000],
            kind="episodic",
            metadata={"task": task_text(state.task)[:500], "step": state.step, "error": result.error is not None},
        )
        self.memory.add(item, scope=self.scope)
        state.emit(Event(EventKind.MEMORY_OP, {"op": "store", "content": item.content, "item_id": item.id}))


def default_action_score(state: AgentState, action: Action) -> float:
    """Heuristic value of a candidate: a schema-valid call to a known tool beats an answer beats a malformed call."""
    if action.kind == "invalid":
        return 0.0
    if action.kind == "answer":
        return 0.6 if state.step > 0 else 0.3
    schemas = state.scratch.get("schemas") or {}
    if action.name not in schemas:
        return 0.1
    import jsonschema

    try:
        jsonschema.validate(action.arguments, schemas[action.name] or {"type": "object"})
    except jsonschema.ValidationError:
        return 0.4
    recent = [e.payload for e in state.events if e.kind is EventKind.TOOL_CALL]
    repeated = any(p.get("name") == action.name and p.get("arguments") == action.arguments for p in recent)
    return 0.5 if repeated else 1.0


class TreeOfThoughtsStrategy(AgentStrategy):
    """Proposes and scores several candidate actions per step; greedy via run_episode, backtracking via ``search``.

    Rejected candidates are kept (``rejected_branches`` in the log's metadata) so they can
    become preference pairs instead of being discarded.
    """

    name = "tree_of_thoughts"

    def __init__(self, model: ModelFn, n_candidates: int = 3, scorer: Callable[[AgentState, Action], float] | None = None, **kw: Any) -> None:
        super().__init__(model, **kw)
        if n_candidates < 1:
            raise ValueError(f"n_candidates must be >= 1, got {n_candidates}")
        self.n_candidates = n_candidates
        self.scorer = scorer or default_action_score

    def init(self, task: Any, tools: Sequence[dict[str, Any]] = (), instructions: str | None = None) -> AgentState:
        state = super().init(task, tools, instructions)
        state.scratch["rejected"] = []
        return state

    def candidates(self, state: AgentState) -> list[Action]:
        """Distinct candidate actions, best score first."""
        seen: set[str] = set()
        out: list[Action] = []
        messages = self.messages(state)
        for _ in range(self.n_candidates):
            text, gen = self.generate(messages)
            action = action_from_text(text, gen, state.scratch.get("schemas"))[0]
            key = json.dumps(action.describe(), sort_keys=True, default=str)
            if key in seen:
                continue
            seen.add(key)
            score = float(self.scorer(state, action))
            if math.isnan(score):
                raise ValueError(f"TreeOfThoughtsStrategy scorer returned NaN for candidate {action.describe()!r}; scores must be numbers")
            action.score = score
            out.append(action)
        out.sort(key=lambda a: -(a.score or 0.0))
        return out

    def _branch(self, state: AgentState, action: Action, reason: str, chosen: Action | None, log: EventLog | None = None) -> dict[str, Any]:
        """A rejected branch: its summary plus its own EventLog holding the context it was generated in."""
        prefix = len(state.events)
        info = {"kind": self.name, "reason": reason, "step": state.step, "prefix_len": prefix, "score": action.score}
        if log is None:
            meta = {"strategy": self.name, "system_prompt": state.scratch.get("system", ""), "task": task_text(state.task), "branch": info}
            if self.max_tool_chars is not None:
                meta["max_tool_chars"] = self.max_tool_chars
            log = branch_log(list(state.events[:prefix]), action, meta)
        else:
            log.metadata["branch"] = info
        return {
            "step": state.step,
            "prefix_len": prefix,
            "chosen": chosen.describe() if chosen is not None else None,
            "rejected": action.describe(),
            "reason": reason,
            "log": log.to_dict(),
        }

    def _reject(self, state: AgentState, chosen: Action, rejected: Sequence[Action], reason: str) -> None:
        for action in rejected:
            state.scratch["rejected"].append(self._branch(state, action, reason, chosen))

    def propose(self, state: AgentState) -> Action:
        cands = self.candidates(state)
        best = cands[0]
        self._reject(state, best, cands[1:], "lower_score")
        return best

    def log_metadata(self, state: AgentState) -> dict[str, Any]:
        meta = super().log_metadata(state)
        meta["rejected_branches"] = copy.deepcopy(state.scratch.get("rejected", []))
        return meta

    def search(self, harness: Harness, task: Any, max_expansions: int = 16, success_threshold: float = 1.0) -> EventLog:
        """Depth-first search with backtracking over harness snapshots; returns the first successful path's log.

        Without a successful path, returns the best-rewarded finished path. Abandoned branches
        stay in ``rejected_branches``.
        """
        if not harness.capabilities.supports_snapshot:
            raise ValueError(f"TreeOfThoughtsStrategy.search needs a harness with snapshots; {type(harness).__name__} has none")
        harness.reset(task)
        root = self.init(task, harness.action_space(), getattr(harness, "instructions", None))
        root.events = harness.events
        rejected: list[dict[str, Any]] = root.scratch["rejected"]
        budget = {"left": max_expansions}
        best: dict[str, Any] = {"reward": float("-inf"), "log": None}

        def finished_reward() -> float:
            log = harness.to_eventlog()
            rewards = log.rewards("episode")
            return rewards[-1] if rewards else 0.0

        def dfs(state: AgentState) -> bool:
            if harness.done or self.is_done(state):
                if not harness.done:
                    harness.finalize(truncated=True)
                reward = finished_reward()
                if reward > best["reward"]:
                    best["reward"] = reward
                    best["log"] = harness.to_eventlog(metadata=self.log_metadata(state))
                return reward >= success_threshold
            if budget["left"] <= 0:
                return False
            budget["left"] -= 1
            cands = self.candidates(state)
            for i, action in enumerate(cands):
                blob = harness.snapshot()
                child = AgentState(task=state.task, events=list(state.events), step=state.step, done=state.done, scratch={**state.scratch, "queue": []})
                result = harness.step(action)
                self.observe(child, result)
                child.events = harness.events
                if dfs(child):
                    self._reject(state, action, cands[i + 1 :], "not_explored")
                    return True
                dead_end = harness.to_eventlog(metadata=self.log_metadata(child))
                dead_end.metadata.pop("rejected_branches", None)
                harness.restore(blob)
                rejected.append(self._branch(state, action, "backtracked", None, log=dead_end))
            return False

        dfs(root)
        log = best["log"]
        if log is None:
            if not harness.done:
                harness.finalize(truncated=True)
            log = harness.to_eventlog(metadata=self.log_metadata(root))
        log.metadata["rejected_branches"] = copy.deepcopy(rejected)
        log.metadata["search"] = {"expansions": max_expansions - budget["left"], "best_reward": best["reward"] if log is best["log"] else None}
        return link_branches(log)
