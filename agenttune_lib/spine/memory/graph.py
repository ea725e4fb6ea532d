"""GraphMemory: items linked to the entities they mention and to each other in time (networkx)."""
from __future__ import annotations

import re
from typing import Any

from agenttune_lib.spine.memory.base import BaseMemory, MemoryItem, Scope

__all__ = ["GraphMemory", "extract_entities"]

_ENTITY = re.compile(r"#?[A-Z][\w@.\-]*[\w]|#\w+|\b\d{4,}\b|\b[\w.\-]+@[\w.\-]+\b|\b[a-z]+_[a-z0-9_]+\b")


def extract_entities(text: str) -> set[str]:
    """Ids, emails, snake_case keys and capitalized words: cheap entity candidates, lower-cased."""
    return {m.group(0).strip(".").lower() for m in _ENTITY.finditer(text) if len(m.group(0)) > 1}


class GraphMemory(BaseMemory):
    """Relational and temporal recall.

    Each item is a node linked to its entities (``mentions``) and to the previous item in its
    scope (``next``); ``add_relation`` records explicit (subject, relation, object) facts.
    """

    def __init__(self) -> None:
        import networkx as nx

        super().__init__()
        self.graph = nx.MultiDiGraph()
        self._last: dict[Scope, str] = {}

    def _on_add(self, item: MemoryItem) -> None:
        g = self.graph
        g.add_node(("item", item.id), seq=item.seq, created_at=item.created_at)
        entities = set(item.metadata.get("entities") or ()) | extract_entities(item.content)
        for ent in entities:
            g.add_node(("entity", str(ent).lower()))
            g.add_edge(("item", item.id), ("entity", str(ent).lower()), key="mentions")
        prev = self._last.get(item.scope)
        if prev is not None and prev in self._items:
            g.add_edge(("item", prev), ("item", item.id), key="next")
        self._last[item.scope] = item.id

    def _on_forget(self, item_id: str) -> None:
        if self.graph.has_node(("item", item_id)):
            self.graph.remove_node(("item", item_id))

    def add_relation(self, subject: str, relation: str, obj: str, **attrs: Any) -> None:
        """Record a fact edge between two entities."""
        self.graph.add_edge(("entity", subject.lower()), ("entity", obj.lower()), key=relation, **attrs)

    def related(self, entity: str, relation: str | None = None) -> list[tuple[str, str]]:
        """(relation, entity) pairs one hop from ``entity`` via fact edges."""
        node = ("entity", entity.lower())
        if not self.graph.has_node(node):
            return []
        out = []
        for _, dst, key in self.graph.out_edges(node, keys=True):
            if dst[0] == "entity" and (relation is None or key == relation):
                out.append((key, dst[1]))
        return out

    def history(self, entity: str, scope: Scope | None = None) -> list[MemoryItem]:
        """Items mentioning ``entity``, oldest first (temporal view)."""
        node = ("entity", entity.lower())
        if not self.graph.has_node(node):
            return []
        visible = {i.id for i in self.visible(scope)}
        ids = [src[1] for src, _ in self.graph.in_edges(node) if src[0] == "item" and src[1] in visible]
        return sorted((self._items[i] for i in set(ids)), key=lambda i: i.seq)

    def recall(self, query: str, k: int = 5, scope: Scope | None = None) -> list[MemoryItem]:
        """Items sharing the most entities with the query (directly or through one fact edge), newest first on ties."""
        items = self.visible(scope)
        if not items or k <= 0:
            return []
        wanted = extract_entities(query) | {w.lower() for w in re.findall(r"\w{4,}", query)}
        expanded = set(wanted)
        for ent in wanted:
            expanded |= {dst for _, dst in self.related(ent)}
        scored = []
        for item in items:
            ents = {dst[1] for _, dst in self.graph.out_edges(("item", item.id)) if dst[0] == "entity"}
            overlap = len(ents & wanted) * 2 + len(ents & expanded)
            if overlap:
                scored.append((overlap, item.seq, item))
        scored.sort(key=lambda t: (-t[0], -t[1]))
        return [item for _, _, item in scored[:k]]
