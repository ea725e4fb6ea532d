"""Offline training rows derived from rollouts: reward-ranked DPO pairs and labelled BCO rows."""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.rl.environments.base import episode_environments

__all__ = ["preference_pairs_from_rollouts", "bco_rows_from_rollouts", "tool_turn_keep_mask"]


def _episode_messages(completion: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The episode's turns as chat messages: assistant turns and the tool results between them (kept as context;
    TrlAgenticDPO/BCO carry no loss on the tool turns)."""
    return [{"role": m["role"], "content": str(m.get("content", ""))} for m in completion if m.get("role") in ("assistant", "tool")]


def _as_chat(prompt: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def _sample(engine: Any, prompts: Sequence[Any], n: int, tools: Any, reward_fn: Any, sink: Any, rows: Any = None, environments: Any = None,
            **reward_kwargs: Any) -> list[tuple[Any, list[Any], list[float], list[str]]]:
    if n < 2:
        raise ValueError(f"need at least 2 rollouts per prompt to rank them, got n={n}")
    repeated = [p for p in prompts for _ in range(n)]
    cols = {k: [v for v in vals for _ in range(n)] for k, vals in reward_kwargs.items()}
    envs, tasks = episode_environments([r for r in rows for _ in range(n)] if rows is not None else None, len(repeated), environments)
    out = engine.rollout(repeated, tools=tools, reward_fn=reward_fn, environments=envs, tasks=tasks, **cols)
    if sink is not None:
        sink(out["trajectories"])
    groups = []
    for i, prompt in enumerate(prompts):
        sl = slice(i * n, (i + 1) * n)
        groups.append((prompt, out["completions"][sl], out["rewards"][sl], [t.id for t in out["trajectories"][sl]]))
    return groups


def preference_pairs_from_rollouts(
    engine: Any,
    prompts: Sequence[Any],
    reward_fn: Callable[..., Any] | str | Sequence[Any],
    n: int = 4,
    tools: Any = None,
    min_margin: float = 1e-6,
    sink: Callable[[list[Any]], None] | None = None,
    rows: Sequence[dict[str, Any]] | None = None,
    environments: Any = None,
    **reward_kwargs: Any,
) -> list[dict[str, Any]]:
    """DPO rows: per prompt, the best- vs worst-rewarded of n rollouts; ties (no margin) give no pair.

    ``rows``/``environments``: dataset rows naming an environment run each prompt there (its reward via environment_reward).
    """
    source_rows = rows
    rows = []
    for prompt, comps, rewards, ids in _sample(engine, prompts, n, tools, reward_fn, sink, source_rows, environments, **reward_kwargs):
        hi = max(range(n), key=lambda j: rewards[j])
        lo = min(range(n), key=lambda j: rewards[j])
        if rewards[hi] - rewards[lo] < min_margin:
            continue
        rows.append(
            {
                "prompt": _as_chat(prompt),
                "chosen": _episode_messages(comps[hi]),
                "rejected": _episode_messages(comps[lo]),
                "chosen_trajectory_id": ids[hi],
                "rejected_trajectory_id": ids[lo],
                "margin": rewards[hi] - rewards[lo],
            }
        )
    return rows


def bco_rows_from_rollouts(
    engine: Any,
    prompts: Sequence[Any],
    reward_fn: Callable[..., Any] | str | Sequence[Any],
    n: int = 4,
    tools: Any = None,
    threshold: float | None = None,
    sink: Callable[[list[Any]], None] | None = None,
    rows: Sequence[dict[str, Any]] | None = None,
    environments: Any = None,
    **reward_kwargs: Any,
) -> list[dict[str, Any]]:
    """BCO rows: every rollout labelled desirable when its reward beats ``threshold`` (default: the batch median)."""
    groups = _sample(engine, prompts, n, tools, reward_fn, sink, rows, environments, **reward_kwargs)
    all_rewards = [r for _, _, rs, _ in groups for r in rs]
    cut = statistics.median(all_rewards) if threshold is None else threshold
    rows = []
    for prompt, comps, rewards, ids in groups:
        for comp, r, tid in zip(comps, rewards, ids):
            rows.append(
                {
                    "prompt": _as_chat(prompt),
                    "completion": _episode_messages(comp),
                    "label": bool(r > cut),
                    "trajectory_id": tid,
                    "reward": r,
                }
            )
    return rows


def _tool_turn_markers(tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids that open and close a tool message under ``tokenizer``'s chat template."""
    cached = getattr(tokenizer, "_agenttune_tool_markers", None)
    if cached is not None:
        return cached
    base = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    full = tokenizer.apply_chat_template([{"role": "user", "content": "x"}, {"role": "tool", "content": "QQZZQQ"}], tokenize=False)
    delta = full[len(base):] if full.startswith(base) else ""
    at = delta.find("QQZZQQ")
    enc = lambda t: list(tokenizer(t, add_special_tokens=False)["input_ids"]) if t else []  # noqa: E731
    markers = (enc(delta[:at]), enc(delta[at + len("QQZZQQ"):])) if at > 0 else ([], [])
    try:
        tokenizer._agenttune_tool_markers = markers
    except Exception:  # some tokenizers refuse new attributes
        pass
    return markers


def tool_turn_keep_mask(input_ids: Any, tokenizer: Any) -> Any:
    """1 everywhere except inside tool messages (header to end marker), found by the template's own markers.

    Preference and BCO rows keep tool results as context; this keeps them out of the loss.
    """
    import torch

    head, tail = _tool_turn_markers(tokenizer)
    keep = torch.ones_like(input_ids)
    if not head or not tail:
        return keep
    for r, row in enumerate(input_ids.tolist()):
        i = 0
        while i <= len(row) - len(head):
            if row[i : i + len(head)] == head:
                j = i + len(head)
                while j <= len(row) - len(tail) and row[j : j + len(tail)] != tail:
                    j += 1
                end = min(j + len(tail), len(row))
                keep[r, i:end] = 0
                i = end
            else:
                i += 1
    return keep
