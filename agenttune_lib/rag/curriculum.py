"""An easy-to-hard curriculum from a solve-difficulty probe and the retrieval-difficulty signal."""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from agenttune_lib.rag.metrics import answer_in

__all__ = ["probe_solve_rate", "build_curriculum", "CurriculumSampler"]


def _get(item: Any, key: str, default: Any = None) -> Any:
    return item.get(key, default) if isinstance(item, Mapping) else getattr(item, key, default)


def probe_solve_rate(items: Sequence[Any], answer_fn: Callable[[str], str], samples: int = 1) -> dict[str, float]:
    """Fraction of ``samples`` attempts in which ``answer_fn(question)`` contains the gold answer, per qa_id."""
    rates = {}
    for item in items:
        hits = sum(answer_in(str(_get(item, "answer")), str(answer_fn(str(_get(item, "question"))))) for _ in range(samples))
        rates[str(_get(item, "qa_id"))] = hits / samples
    return rates


def build_curriculum(items: Sequence[Any], solve_rate: Mapping[str, float] | None = None, n_stages: int = 3, solve_weight: float = 0.5) -> list[list[Any]]:
    """Order items by ``solve_weight * (1 - solve rate) + (1 - solve_weight) * retrieval difficulty`` (falling
    back to ``difficulty`` without a probe) and cut them into ``n_stages`` stages, easiest first."""
    if n_stages < 1:
        raise ValueError("n_stages must be >= 1")

    def score(item: Any) -> float:
        retrieval = float(_get(item, "retrieval_difficulty", _get(item, "difficulty", 0.0)) or 0.0)
        if solve_rate is None:
            return float(_get(item, "difficulty", retrieval) or 0.0)
        solved = solve_rate.get(str(_get(item, "qa_id")), 0.0)
        return solve_weight * (1.0 - solved) + (1.0 - solve_weight) * retrieval

    ordered = sorted(items, key=lambda it: (score(it), str(_get(it, "qa_id", ""))))
    size, extra = divmod(len(ordered), n_stages)
    stages, start = [], 0
    for s in range(n_stages):
        end = start + size + (1 if s < extra else 0)
        stages.append(ordered[start:end])
        start = end
    return stages


class CurriculumSampler:
    """Batches drawn from the stages unlocked so far: stage ``s`` opens after ``s * steps_per_stage`` steps."""

    def __init__(self, stages: Sequence[Sequence[Any]], batch_size: int = 8, steps_per_stage: int = 100, seed: int = 0) -> None:
        if not any(stages):
            raise ValueError("CurriculumSampler needs at least one non-empty stage")
        self.stages = [list(s) for s in stages]
        self.batch_size = batch_size
        self.steps_per_stage = steps_per_stage
        self.rng = random.Random(seed)
        self.step = 0

    def stage_at(self, step: int) -> int:
        return min(len(self.stages) - 1, step // max(1, self.steps_per_stage))

    def pool(self, step: int | None = None) -> list[Any]:
        upto = self.stage_at(self.step if step is None else step)
        return [item for stage in self.stages[: upto + 1] for item in stage] or [i for s in self.stages for i in s]

    def next_batch(self) -> list[Any]:
        pool = self.pool()
        batch = self.rng.sample(pool, self.batch_size) if len(pool) >= self.batch_size else [self.rng.choice(pool) for _ in range(self.batch_size)]
        self.step += 1
        return batch

    def __iter__(self) -> Iterator[list[Any]]:
        while True:
            yield self.next_batch()
