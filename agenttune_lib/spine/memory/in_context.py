"""InContextMemory: the k most recent items (what fits in the prompt), query-independent."""
from __future__ import annotations

from agenttune_lib.spine.memory.base import BaseMemory, MemoryItem, Scope

__all__ = ["InContextMemory"]


class InContextMemory(BaseMemory):
    """Recent-k memory; older items beyond ``capacity`` per scope are dropped (``capacity`` >= 1)."""

    def __init__(self, capacity: int = 50) -> None:
        super().__init__()
        # capacity 0 would hand out ids of items it had already dropped: a memory that keeps nothing is no memory.
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"InContextMemory capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity

    def _on_add(self, item: MemoryItem) -> None:
        same = sorted((i for i in self._items.values() if i.scope == item.scope), key=lambda i: i.seq)
        for old in same[: max(0, len(same) - self.capacity)]:
            self._items.pop(old.id, None)

    def recall(self, query: str, k: int = 5, scope: Scope | None = None) -> list[MemoryItem]:
        items = self.visible(scope)
        return list(reversed(items[-k:])) if k > 0 else []
