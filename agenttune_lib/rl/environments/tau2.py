"""τ² retail as an RL environment: the retail tools on a private database; reward = final database state matches the task's.

11 of the 114 tasks (7 train, 4 test) have a gold database equal to the initial one: doing nothing scores 1.0.
They are excluded from RL by default; ``include_noop_tasks=True`` admits them, and every episode's metadata
carries ``gold_equals_initial`` either way.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Tau2Environment", "tau2_tasks"]

INSTRUCTIONS = (
    "You are a retail customer-support agent. Act on the customer's request with the tools, one call at a time; "
    "no further customer messages will come. When done, reply with a short final answer and no tool call."
)


class Tau2Environment:
    """One τ² retail task per episode; the reward is the deterministic database match (1.0 or 0.0).

    A task whose gold state is the initial state is refused unless ``include_noop_tasks`` (TrainConfig.tau2_include_noop_tasks).
    """

    name = "tau2_retail"
    tool_format = "compact"  # 16 retail tools: one signature line each keeps the prompt small

    def __init__(self, include_policy: bool = False, max_tool_turns: int | None = None, include_noop_tasks: bool = False) -> None:
        self.include_policy = include_policy
        self.max_tool_turns = max_tool_turns
        self.include_noop_tasks = include_noop_tasks
        self.db: dict[str, Any] = {}
        self.task: Any = None
        self._calls = 0

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        from agenttune_lib.spine.tau2 import fresh_db, gold_equals_initial, load_tau2_tasks, tau2_policy

        if "task_id" not in task:
            raise ValueError(f"tau2_retail task needs a task_id, got keys {sorted(task)}")
        loaded = load_tau2_tasks("all", ids=[str(task["task_id"])])[0]
        if not self.include_noop_tasks and gold_equals_initial(loaded):
            raise ValueError(
                f"tau2_retail task {loaded.id!r}: its gold database equals the initial one, so an episode that does nothing "
                "scores 1.0; such tasks are excluded from RL (tau2_tasks skips them). Pass include_noop_tasks=True "
                "(TrainConfig.tau2_include_noop_tasks) to train on them; every episode is then flagged gold_equals_initial"
            )
        self.task = loaded
        self.db = fresh_db()
        self._calls = 0
        system = (tau2_policy() + "\n\n" if self.include_policy else "") + INSTRUCTIONS
        return [{"role": "system", "content": system}, {"role": "user", "content": self.task.prompt}]

    def tools(self) -> list[Any]:
        from agenttune_lib.spine.tau2 import Tau2RetailTool, tau2_tool_schemas

        env = self

        class _Counted(Tau2RetailTool):
            def execute(self, **kwargs: Any) -> Any:
                env._calls += 1
                return super().execute(**kwargs)

        return [_Counted(s, self) for s in tau2_tool_schemas()]

    def _require_task(self) -> None:
        if self.task is None:
            raise RuntimeError("tau2_retail: reward/success before reset(task)")

    def reward(self, completion: list[dict[str, Any]]) -> float:
        self._require_task()
        from agenttune_lib.spine.tau2 import _expected_hash, db_hash

        return 1.0 if db_hash(self.db) == _expected_hash(self.task.id) else 0.0

    def success(self, completion: list[dict[str, Any]]) -> bool:
        return self.reward(completion) == 1.0

    def metrics(self, completion: list[dict[str, Any]]) -> dict[str, Any]:
        """Tool calls executed, and whether doing nothing would have scored this episode 1.0 (in every episode's metadata)."""
        from agenttune_lib.spine.tau2 import gold_equals_initial

        self._require_task()
        return {"tool_calls_executed": self._calls, "gold_equals_initial": bool(gold_equals_initial(self.task))}


def tau2_tasks(split: str = "train", limit: int | None = None, include_noop_tasks: bool = False) -> list[dict[str, Any]]:
    """τ² retail tasks of ``split`` as environment tasks ({task_id}); tasks whose gold state is the initial state
    are left out unless ``include_noop_tasks`` (``limit`` counts the tasks kept)."""
    from agenttune_lib.spine.tau2 import gold_equals_initial, load_tau2_tasks

    kept = [t for t in load_tau2_tasks(split) if include_noop_tasks or not gold_equals_initial(t)]
    return [{"task_id": t.id} for t in (kept[:limit] if limit is not None else kept)]
