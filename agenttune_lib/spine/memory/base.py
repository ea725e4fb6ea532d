"""The memory interface: items, scopes (shared vs private) and the BaseMemory contract."""
from __future__ import annotations

import abc
import dataclasses
import itertools
import time
import uuid
from typing import Any

__all__ = ["MemoryItem", "Scope", "BaseMemory"]

_counter = itertools.count()


@dataclasses.dataclass(frozen=True)
class Scope:
    """Where a memory lives: ``agent_id=None`` is shared by every agent in ``namespace``; otherwise private."""

    agent_id: str | None = None
    namespace: str = "default"

    @classmethod
    def shared(cls, namespace: str = "default") -> "Scope":
        return cls(None, namespace)

    def can_see(self, owner: "Scope") -> bool:
        """Whether a reader in this scope sees an item stored under ``owner``."""
        return owner.namespace == self.namespace and (owner.agent_id is None or owner.agent_id == self.agent_id)


@dataclasses.dataclass
class MemoryItem:
    """One remembered thing: content, a kind (episodic, semantic, …), metadata and a timestamp."""

    content: str
    kind: str = "episodic"
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:16])
    created_at: float = dataclasses.field(default_factory=time.time)
    seq: int = dataclasses.field(default_factory=lambda: next(_counter))
    scope: Scope = dataclasses.field(default_factory=Scope)


class BaseMemory(abc.ABC):
    """add / recall / forget / clear over items visible from a Scope."""

    def __init__(self) -> None:
        self._items: dict[str, MemoryItem] = {}

    def add(self, item: MemoryItem | str, scope: Scope | None = None) -> str:
        if isinstance(item, str):
            item = MemoryItem(item)
        if not isinstance(item, MemoryItem):
            raise TypeError(f"memory items must be MemoryItem or str, got {type(item).__name__}")
        if scope is not None:
            item.scope = scope
        self._items[item.id] = item
        self._on_add(item)
        return item.id

    def _on_add(self, item: MemoryItem) -> None:
        pass

    def visible(self, scope: Scope | None = None) -> list[MemoryItem]:
        reader = scope or Scope()
        return sorted((i for i in self._items.values() if reader.can_see(i.scope)), key=lambda i: i.seq)

    @abc.abstractmethod
    def recall(self, query: str, k: int = 5, scope: Scope | None = None) -> list[MemoryItem]:
        """The k items most relevant to ``query`` visible from ``scope``."""

    def get(self, item_id: str) -> MemoryItem:
        try:
            return self._items[item_id]
        except KeyError:
            raise KeyError(f"no memory item {item_id!r}") from None

    def forget(self, item_id: str) -> None:
        self._items.pop(item_id, None)
        self._on_forget(item_id)

    def _on_forget(self, item_id: str) -> None:
        pass

    def clear(self, scope: Scope | None = None) -> None:
        for item in list(self._items.values()):
            if scope is None or item.scope == scope:
                self.forget(item.id)

    def __len__(self) -> int:
        return len(self._items)
