"""One multi-agent EventLog per prompt: every agent's events stamped with its author, judges' scores as authored REWARDs."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agenttune_lib.events import Event, EventKind, EventLog

__all__ = ["PANEL_AUTHOR", "message_events", "build_episodes", "with_judge_rewards", "rollout_logs"]

#: The author of the aggregated panel reward (the last episode REWARD, i.e. the warehouse's reward_episode).
PANEL_AUTHOR = "judge_panel"


def message_events(messages: Sequence[Mapping[str, Any]]) -> list[Event]:
    """Events from chat messages (a ``create_rollout_fn`` output's ``agent_completions``): tool calls parsed back out."""
    from agenttune_lib.tools.parsing import ToolCall, parse_tool_calls

    events: list[Event] = []
    for m in messages:
        content = str(m.get("content", ""))
        if m.get("role") == "tool":
            events.append(Event(EventKind.TOOL_RESULT, {"name": str(m.get("name", "")), "content": content}))
            continue
        parsed = parse_tool_calls(content) if "<tool_call>" in content or "<function=" in content else None
        calls = [item for item in (parsed.items if parsed else []) if isinstance(item, ToolCall)]
        if not calls:
            events.append(Event(EventKind.TEXT, {"content": content}))
            continue
        if parsed.text:
            events.append(Event(EventKind.TEXT, {"content": parsed.text}))
        events += [Event(EventKind.TOOL_CALL, {"name": c.name, "arguments": c.arguments, **({"id": c.id} if c.id else {})}) for c in calls]
    return events


def rollout_logs(node: str, output: Mapping[str, Any], n: int) -> list[EventLog]:
    """A rollout node's per-prompt EventLogs: its ``trajectories``, else its ``agent_completions`` messages, else its ``responses``."""
    logs = output.get("trajectories")
    if logs is None and output.get("agent_completions") is not None:
        logs = [EventLog(message_events(msgs)) for msgs in output["agent_completions"]]
    if logs is None and output.get("responses") is not None:
        logs = [EventLog([Event(EventKind.TEXT, {"content": str(r)})]) for r in output["responses"]]
    if logs is None:
        raise ValueError(f"rollout node {node!r} returned neither 'trajectories' nor 'responses' (keys: {sorted(output)})")
    logs = [log if isinstance(log, EventLog) else EventLog.from_dict(log) for log in logs]
    if len(logs) != n:
        raise ValueError(f"rollout node {node!r} returned {len(logs)} trajectories for {n} prompts")
    return logs


def _stamp(ev: Event, author: str | None, keep_span: bool) -> Event:
    return Event(
        ev.kind,
        ev.payload,
        token_span=ev.token_span if keep_span else None,
        logprobs=ev.logprobs if keep_span else None,
        scope=ev.scope,
        author=ev.author if ev.author is not None else author,
    )


def build_episodes(
    tasks: Sequence[str],
    runs: Sequence[tuple[str, Sequence[EventLog]]],
    token_node: str,
    metadata: Sequence[Mapping[str, Any]] | None = None,
) -> list[EventLog]:
    """Merge the rollout nodes that ran (in order) into one log per prompt.

    Every event of an agent's turn gets ``author`` = the node's name: what it generated (TEXT,
    REASONING, TOOL_CALL, which alone carry loss), what it was shown (its OBSERVATION prompt,
    its TOOL_RESULTs) and its own rewards. Token spans and logprobs are kept for the token
    node's events only: the log's ``token_ids`` are the sequence GRPO trained on.
    """
    out = []
    by_node = dict(runs)
    for i, task in enumerate(tasks):
        events: list[Event] = []
        last_obs: tuple[str, int] | None = None
        for node, logs in runs:
            log = logs[i]
            keep = node == token_node
            for ev in log.events:
                if ev.kind is EventKind.OBSERVATION:
                    content = str(ev.payload.get("content", ""))
                    if last_obs is not None and content == last_obs[0]:
                        if keep:  # the same prompt: keep the token agent's copy, which carries the prompt's span
                            events[last_obs[1]] = _stamp(ev, node, True)
                        continue
                    last_obs = (content, len(events))
                events.append(_stamp(ev, node, keep))
        if not events or events[0].kind is not EventKind.OBSERVATION:
            events.insert(0, Event(EventKind.OBSERVATION, {"content": task}))
        token_log = by_node[token_node][i]
        meta = {k: v for k, v in token_log.metadata.items() if k not in ("task", "system_prompt")}
        meta.update(dict(metadata[i]) if metadata is not None else {})
        meta.update(task=task, multi_agent=True, agents=[node for node, _ in runs], token_agent=token_node)
        token_ids = token_log.token_ids if token_log.tier == "full" else None
        out.append(EventLog(events, tier="full" if token_ids is not None else "light", metadata=meta, token_ids=token_ids))
    return out


def with_judge_rewards(
    logs: Sequence[EventLog],
    scores: Mapping[str, Sequence[float]],
    panel: Sequence[float],
    aggregate: str,
    weights: Mapping[str, float] | None = None,
) -> list[EventLog]:
    """Append one episode REWARD per judge (author = the judge) and the panel's aggregate last (author = judge_panel)."""
    out = []
    for i, log in enumerate(logs):
        per_judge = {name: float(vals[i]) for name, vals in scores.items()}
        events = list(log.events)
        events += [Event(EventKind.REWARD, {"value": v, "source": "judge"}, scope="episode", author=name) for name, v in per_judge.items()]
        panel_payload: dict[str, Any] = {"value": float(panel[i]), "source": PANEL_AUTHOR, "aggregate": aggregate}
        if weights:
            panel_payload["weights"] = {k: float(v) for k, v in weights.items()}
        events.append(Event(EventKind.REWARD, panel_payload, scope="episode", author=PANEL_AUTHOR))
        meta = dict(log.metadata, judge_scores=per_judge, judge_reward=float(panel[i]))
        out.append(EventLog(events, tier=log.tier, id=log.id, metadata=meta, token_ids=log.token_ids))
    return out
