"""Shared helpers for the RL tests: tiny-model snapshots, a varied reward, teacher EventLogs."""
from __future__ import annotations

from typing import Any


def lora_snapshot(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def lora_changed(before: dict[str, Any], model: Any) -> bool:
    import torch

    after = dict(model.named_parameters())
    assert before, "model has no LoRA parameters"
    return any(not torch.equal(before[k], after[k].detach()) for k in before)


def length_reward(completions, **kwargs) -> list[float]:
    """A reward that varies between sampled completions (test signal only)."""
    from agenttune_lib.rl.rewards._text import full_text

    return [len(full_text(c)) / 10.0 for c in completions]


def calculator(expression: str) -> str:
    """Evaluate arithmetic.

    Args:
        expression: the arithmetic expression
    """
    from agenttune_lib.rl.train import calculator as calc

    return calc(expression)


def teacher_logs(tokenizer: Any, n: int = 6) -> list[Any]:
    from agenttune_lib.rl.rollout import episode_to_eventlog

    logs = []
    for i in range(n):
        events = [
            {"kind": "tool_call", "payload": {"name": "calculator", "arguments": {"expression": f"{i}+{i}"}, "id": "c0"}},
            {"kind": "tool_result", "payload": {"name": "calculator", "content": str(2 * i), "id": "c0"}},
            {"kind": "text", "payload": {"content": f"The answer is {2 * i}."}},
        ]
        log, _ = episode_to_eventlog(tokenizer, None, f"What is {i}+{i}?", events, metadata={"answer": str(2 * i)})
        logs.append(log)
    return logs
