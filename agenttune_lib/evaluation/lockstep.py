"""Lockstep episodes: many spine episodes advance together, one batched model call per turn over the running ones.

Each episode runs the spine's own ``run_episode`` (so items are run exactly as the agent runs),
in its own thread with its own harness; their model calls meet at a barrier and the last
arrival generates the whole turn in one ``generate_batch`` call. A finished episode leaves the
barrier, so later turns batch only the episodes still running.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["LockstepBatcher", "run_lockstep", "batch_fn"]


def batch_fn(policy: Any, tools: Sequence[dict[str, Any]] | None = None) -> Callable[[list[Any]], list[Any]]:
    """``policy.generate_batch`` when it has one (given ``tools`` when it decodes constrained), else one call per conversation."""
    if hasattr(policy, "generate_batch"):
        if getattr(policy, "constrained", False):
            return lambda batch: policy.generate_batch(batch, tools=tools)
        return policy.generate_batch
    if not callable(policy):
        raise TypeError(f"policy must be callable (messages -> text) or have generate_batch, got {type(policy).__name__}")
    return lambda batch: [policy(m) for m in batch]


class LockstepBatcher:
    """A barrier that gathers one model request from every running worker, then answers them in one batch."""

    def __init__(self, generate_batch: Callable[[list[Any]], list[Any]], n_workers: int) -> None:
        self._generate = generate_batch
        self._cond = threading.Condition()
        self._active = n_workers
        self._pending: dict[int, Any] = {}
        self._results: dict[int, Any] = {}
        self._next = 0
        self.turns: list[int] = []  # batch size of each turn, for the record

    def _flush(self) -> None:
        batch, self._pending = self._pending, {}
        try:
            outs = self._generate(list(batch.values()))
            if len(outs) != len(batch):
                raise RuntimeError(f"generate_batch returned {len(outs)} outputs for {len(batch)} prompts")
            self._results.update(zip(batch, outs))
        except BaseException as exc:  # every waiting worker sees the failure instead of hanging
            self._results.update({t: exc for t in batch})
        self.turns.append(len(batch))
        self._cond.notify_all()

    def model(self, messages: Any) -> Any:
        """The model callable each worker's strategy uses."""
        with self._cond:
            ticket = self._next
            self._next += 1
            self._pending[ticket] = messages
            if len(self._pending) >= self._active:
                self._flush()
            while ticket not in self._results:
                self._cond.wait()
            out = self._results.pop(ticket)
        if isinstance(out, BaseException):
            raise out
        return out

    def leave(self) -> None:
        """A worker finished: the barrier no longer waits for it."""
        with self._cond:
            self._active -= 1
            if self._pending and len(self._pending) >= self._active:
                self._flush()


def run_lockstep(
    items: Sequence[Any], episode: Callable[[Any, Callable[[Any], Any]], Any], policy: Any, tools: Sequence[dict[str, Any]] | None = None
) -> tuple[list[Any], list[int]]:
    """``episode(item, model)`` for every item in lockstep; returns (results in item order, batch size per turn).

    An episode that raises gives its exception as its result (the suite records it as an error row).
    """
    batcher = LockstepBatcher(batch_fn(policy, tools), len(items))
    results: list[Any] = [None] * len(items)

    def work(i: int, item: Any) -> None:
        try:
            results[i] = episode(item, batcher.model)
        except Exception as exc:
            results[i] = exc
        finally:
            batcher.leave()

    threads = [threading.Thread(target=work, args=(i, it), daemon=True, name=f"lockstep-{i}") for i, it in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, batcher.turns
