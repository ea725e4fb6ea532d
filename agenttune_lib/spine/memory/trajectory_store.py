"""TrajectoryStore: past rollouts kept in the EventLog warehouse itself (not a second store)."""
from __future__ import annotations

import math

from collections.abc import Sequence
from typing import Any

from agenttune_lib.events import EventLog

__all__ = ["TrajectoryStore"]


class TrajectoryStore:
    """Persist and query rollouts in a Warehouse under one ``source`` label."""

    def __init__(self, warehouse: Any, source: str = "spine") -> None:
        self.warehouse = warehouse
        self.source = source

    def add(self, logs: EventLog | Sequence[EventLog], provenance: Any = None) -> int:
        logs = [logs] if isinstance(logs, EventLog) else list(logs)
        return self.warehouse.append_logs(logs, provenance=provenance, source=self.source)

    def get(self, trajectory_id: str) -> EventLog:
        return self.warehouse.get_log(trajectory_id)

    def all(self) -> list[EventLog]:
        return self.warehouse.read_logs(source=self.source)

    def get_by_reward_range(self, low: float = float("-inf"), high: float = float("inf"), scope: str = "episode") -> list[EventLog]:
        """Logs whose episode (or total) reward lies in [low, high]: the dataset-building query."""
        if scope not in ("episode", "total"):
            raise ValueError(f"scope must be 'episode' or 'total', got {scope!r}")
        for label, bound in (("low", low), ("high", high)):
            if isinstance(bound, bool) or not isinstance(bound, (int, float)) or math.isnan(bound):
                raise ValueError(f"reward range bound {label} must be a number (inf allowed), got {bound!r}")
        if low > high:
            raise ValueError(f"empty reward range: low={low} > high={high}")
        column = "t.reward_episode" if scope == "episode" else "t.reward_total"
        clauses, params = [f"{column} IS NOT NULL"], []
        if low != float("-inf"):
            clauses.append(f"{column} >= ?")
            params.append(float(low))
        if high != float("inf"):
            clauses.append(f"{column} <= ?")
            params.append(float(high))
        return self.warehouse.read_logs(source=self.source, where=" AND ".join(clauses), params=params)
