"""τ²-bench retail calibration: task success by database-state match, over seeds, with trajectory metrics."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.evaluation.report import aggregate_seeds
from agenttune_lib.evaluation.settings import EvalSettings, prompt_hash, serialize_history
from agenttune_lib.evaluation.trajectory import TrajectoryEvaluator

__all__ = ["Tau2Result", "run_tau2"]


@dataclasses.dataclass
class Tau2Result:
    """Task success (mean/spread over seeds), trajectory metrics, per-task outcomes, the logs, and the conditions."""

    success: dict[str, Any]
    trajectory: dict[str, dict[str, Any]]
    items: list[dict[str, Any]]
    settings: dict[str, Any]
    seconds: float
    logs: list[Any] = dataclasses.field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "logs"}


def run_tau2(
    generate: Callable[..., str],
    split: str = "test",
    limit: int | None = 5,
    settings: EvalSettings | None = None,
    max_steps: int = 8,
    progress: Callable[[str, int], None] | None = None,
    task_ids: Sequence[str] | None = None,
) -> Tau2Result:
    """Run a ReAct agent over τ² retail tasks once per seed; success is the harness's DB-match reward.

    Every model turn goes through ``serialize_history`` so the multi-turn template (native or
    context) and thinking-history choice apply; the system prompt seen is hashed into the record.
    ``task_ids`` picks tasks of ``split`` by id instead of the first ``limit``. Items and the record flag the
    tasks whose gold database equals the initial one (doing nothing succeeds there).
    """
    from agenttune_lib.spine import episode, strategies, tau2 as spine_tau2

    settings = settings or EvalSettings()
    tasks = spine_tau2.load_tau2_tasks(split, limit=limit, ids=list(task_ids) if task_ids else None)
    if not tasks:
        raise ValueError(f"τ² split {split!r} with limit={limit} selects no tasks")
    harness = spine_tau2.Tau2RetailHarness(max_steps=max_steps)
    evaluator = TrajectoryEvaluator(harness.action_space())
    systems: set[str] = set()
    start = time.perf_counter()
    per_seed: dict[int, dict[str, float]] = {}
    items: list[dict[str, Any]] = []
    logs = []
    for seed in settings.seeds:

        def model(messages: list[dict[str, Any]], _seed: int = seed) -> str:
            system = messages[0]["content"] if messages and messages[0].get("role") == "system" else None
            rest = messages[1:] if system is not None else messages
            if system is not None:
                systems.add(system)
            return generate(serialize_history(system, rest, settings), seed=_seed, temperature=settings.temperature, max_new_tokens=settings.max_new_tokens)

        successes = []
        seed_logs = []
        for task in tasks:
            log = episode.run_episode(strategies.ReActStrategy(model, max_steps=max_steps), harness, task)
            ok = bool(harness.db_matches())
            successes.append(ok)
            seed_logs.append(log)
            items.append({"seed": seed, "task_id": task.id, "success": ok, "n_events": len(log), "trajectory_id": log.id,
                          "gold_equals_initial": spine_tau2.gold_equals_initial(task)})
            if progress is not None:
                progress("tau2", 1)
        goldens = [list(t.actions) for t in tasks]
        metrics = evaluator.evaluate_batch(seed_logs, goldens)["mean"]
        per_seed[seed] = {"success": sum(successes) / len(successes), **{k: v for k, v in metrics.items() if v is not None}}
        logs += seed_logs
    agg = aggregate_seeds(per_seed)
    success = agg.pop("success")
    record = settings.record("\n".join(sorted(systems)) if systems else "")
    record.update({"benchmark": "tau2_retail", "split": split, "n_tasks": len(tasks), "max_steps": max_steps,
                   "n_system_prompts": len(systems), "system_prompt_sha256s": sorted(prompt_hash(s) for s in systems),
                   # tasks whose gold database is the initial one: an agent that does nothing succeeds on them
                   "gold_equals_initial_task_ids": sorted({t.id for t in tasks if spine_tau2.gold_equals_initial(t)}, key=str)})
    return Tau2Result(success=success, trajectory=agg, items=items, settings=record, seconds=time.perf_counter() - start, logs=logs)
