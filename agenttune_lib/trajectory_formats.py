"""Foreign trajectory shapes read into EventLog events: RL rollouts, DECIDE pipeline state, evaluator dicts.

Each reader is handed the contract module (``agenttune_lib.events``) and builds its Events in order, so the checks,
their errors and their order are the contract's own; it imports nothing of the package and sits below the contract.
Each returns ``(events, kwargs)`` for the ``EventLog`` constructor.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from types import ModuleType
from typing import Any

__all__ = ["read_trajectory", "read_pipeline_state", "read_eval_dict"]

#: EventKind value per DECIDE stage type (a tool_call stage gives a call and its result; any other type: text).
_STAGE_KINDS = {"human_review": "observation", "rules": "reasoning", "router": "reasoning"}


def _reward_events(ev: ModuleType, rewards: Any, keep_origin: bool) -> list[Any]:
    """REWARD events from bare values (episode scope) or mappings; ``keep_origin`` keeps each one's source and author."""
    rewards = [r if isinstance(r, Mapping) else {"value": r} for r in rewards or []]
    return [ev.Event(ev.EventKind.REWARD,
                     {"value": r["value"], **({"source": r["source"]} if keep_origin and "source" in r else {})},
                     scope=r.get("scope", "episode"), author=r.get("author") if keep_origin else None) for r in rewards]


def read_trajectory(ev: ModuleType, trajectory: Any, id: str | None = None) -> tuple[list[Any], dict[str, Any]]:
    """RL rollout (prompt_ids, completion_ids, logprobs, segments with spans, reward or rewards) -> full-tier log."""
    src = copy.deepcopy(_as_mapping(ev, trajectory, "trajectory"))
    prompt_ids, completion_ids = list(src.get("prompt_ids") or []), list(src.get("completion_ids") or [])
    logprobs, offset, events = src.get("logprobs"), len(prompt_ids), []
    if src.get("prompt") is not None or src.get("task") is not None:
        prompt = src.get("prompt", src.get("task"))
        content = prompt if isinstance(prompt, str) else json.dumps(prompt)
        span = (0, offset) if prompt_ids else None
        events.append(ev.Event(ev.EventKind.OBSERVATION, {"content": content}, token_span=span))
    for i, seg in enumerate(src.get("segments") or []):
        if not isinstance(seg, Mapping):
            raise ev.EventLogError(f"event {len(events)}: trajectory segment {i} is not a mapping")
        span, abs_span, seg_lps = seg.get("span"), None, None
        if span is not None:
            if len(span) != 2 or span[0] < 0 or span[1] < span[0] or span[1] > len(completion_ids):
                raise ev.EventLogError(f"event {len(events)}: span {list(span)} is outside the completion of "
                                       f"{len(completion_ids)} tokens")
            abs_span = (offset + int(span[0]), offset + int(span[1]))
            if logprobs is not None and ev.EventKind.parse(seg.get("kind")) in ev.AGENT_KINDS:
                seg_lps = logprobs[span[0]:span[1]]
        try:
            events.append(ev.Event(seg.get("kind"), seg.get("payload") or {}, token_span=abs_span, logprobs=seg_lps,
                                   author=seg.get("author")))
        except ValueError as exc:
            raise ev.EventLogError(f"event {len(events)}: {exc}") from None
    rewards = src.get("rewards")
    if rewards is None and src.get("reward") is not None:
        rewards = [{"value": src["reward"]}]
    events += _reward_events(ev, rewards, keep_origin=True)
    metadata = {k: src[k] for k in ("task", "system_prompt", "task_id", "model", "adapter") if src.get(k) is not None}
    metadata.update(src.get("metadata") or {})
    return events, dict(tier="full", id=id or src.get("id"), metadata=metadata, token_ids=prompt_ids + completion_ids)


def read_pipeline_state(ev: ModuleType, state: Any, id: str | None = None) -> tuple[list[Any], dict[str, Any]]:
    """DECIDE pipeline state (``input_text``, ``step_history``, ``verdict``) -> light-tier log."""
    src = copy.deepcopy(_as_mapping(ev, state, "pipeline state"))
    text = src.get("input_text")
    events = [] if text is None else [ev.Event(ev.EventKind.OBSERVATION, {"content": str(text), "stage_id": "input"})]
    for step in src.get("step_history") or []:
        step = dict(_as_mapping(ev, step, "step"))
        stage_id = str(step.get("stage_id", step.get("stage", "")))
        stage_type = str(step.get("stage_type", step.get("type", "")))
        base = {"stage_id": stage_id, "stage_type": stage_type}
        kind = ev.EventKind(_STAGE_KINDS.get(stage_type, "text"))
        error = None if kind is ev.EventKind.OBSERVATION else step.get("error")  # a human review carries none
        payload = {"content": step.get("output"), **base}
        if stage_type == "tool_call":
            tool, args = step.get("tool", stage_id), step.get("args", step.get("arguments", {}))
            events.append(ev.Event(ev.EventKind.TOOL_CALL, {"name": tool, "arguments": args, **base}))
            kind, payload = ev.EventKind.TOOL_RESULT, {"name": tool, **payload}
            error = error or ("stage failed" if step.get("status") == "error" else None)
        events.append(ev.Event(kind, {**payload, "error": error} if error else payload))
        if step.get("score") is not None:
            reward = {"value": float(step["score"]), "stage_id": stage_id}
            events.append(ev.Event(ev.EventKind.REWARD, reward, scope="step"))
    verdict = src.get("verdict")
    if verdict:
        verdict = dict(verdict)
        payload = {"content": verdict.get("label"), "verdict": verdict, "stage_id": "verdict"}
        events.append(ev.Event(ev.EventKind.TEXT, payload))
        if verdict.get("confidence") is not None:
            payload = {"value": float(verdict["confidence"]), "source": "verdict_confidence"}
            events.append(ev.Event(ev.EventKind.REWARD, payload, scope="episode"))
    events.append(ev.Event(ev.EventKind.TURN_COMPLETE, {}))
    metadata = {k: src[k] for k in ("template_id", "run_id", "task") if src.get(k) is not None}
    return events, dict(tier="light", id=id or src.get("run_id"), metadata=metadata)


def read_eval_dict(ev: ModuleType, eval_dict: Any, id: str | None = None) -> tuple[list[Any], dict[str, Any]]:
    """Evaluator dict -> light-tier log: its ``steps``, else tool calls and outputs interleaved, then the answer."""
    src = copy.deepcopy(_as_mapping(ev, eval_dict, "eval dict"))
    events: list[Any] = []
    if src.get("steps") is not None:
        for i, step in enumerate(src["steps"]):
            try:
                events.append(ev.Event(step["kind"], step.get("payload") or {}, scope=step.get("scope"),
                                       author=step.get("author")))
            except (KeyError, ValueError, TypeError) as exc:
                raise ev.EventLogError(f"event {i}: {exc}") from None
    else:
        outputs = list(src.get("tool_outputs") or [])
        for i, call in enumerate(src.get("tool_calls") or []):
            arguments = call.get("arguments", call.get("args", {}))
            events.append(ev.Event(ev.EventKind.TOOL_CALL, {"name": call.get("name"), "arguments": arguments}))
            if i < len(outputs):
                out = outputs[i] if isinstance(outputs[i], Mapping) else {"output": outputs[i]}
                payload = {"name": out.get("name", call.get("name")), "content": out.get("output", out.get("content"))}
                error = out.get("error")
                events.append(ev.Event(ev.EventKind.TOOL_RESULT, {**payload, "error": error} if error else payload))
        if src.get("final_answer") is not None:
            events.append(ev.Event(ev.EventKind.TEXT, {"content": src["final_answer"]}))
        events += _reward_events(ev, src.get("rewards"), keep_origin=False)
    metadata = dict(src.get("metadata") or {})
    metadata.update({k: src[k] for k in ("task", "plan") if src.get(k) is not None and k not in metadata})
    return events, dict(tier="light", id=id or src.get("trajectory_id"), metadata=metadata)


def _as_mapping(ev: ModuleType, obj: Any, what: str) -> Mapping[str, Any]:
    """A mapping, a dataclass instance or an object's attributes as a mapping; anything else is refused."""
    if isinstance(obj, Mapping):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(obj, "__dict__"):
        return dict(vars(obj))
    raise ev.EventLogError(f"{what} must be a mapping or an object with attributes, got {type(obj).__name__}")

