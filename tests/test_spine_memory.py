"""Memory backends, scopes, and the warehouse-backed TrajectoryStore."""
from __future__ import annotations

import numpy as np
import pytest

from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.spine.memory import GraphMemory, InContextMemory, MemoryItem, Scope, TrajectoryStore, VectorMemory
from agenttune_lib.warehouse import Provenance, Warehouse


def bag_of_words(texts):
    vocab = ["refund", "order", "weather", "rain", "keyboard", "exchange"]
    return np.array([[t.lower().count(w) for w in vocab] for t in texts], dtype=float)


def test_in_context_recent_k_and_capacity():
    mem = InContextMemory(capacity=3)
    for i in range(5):
        mem.add(f"item {i}")
    assert len(mem) == 3
    assert [m.content for m in mem.recall("ignored", k=2)] == ["item 4", "item 3"]


def test_scopes_shared_vs_private():
    mem = InContextMemory()
    mem.add("shared fact", scope=Scope.shared("team"))
    mem.add("alice secret", scope=Scope("alice", "team"))
    mem.add("bob secret", scope=Scope("bob", "team"))
    mem.add("other team", scope=Scope.shared("other"))
    alice = {m.content for m in mem.recall("", k=10, scope=Scope("alice", "team"))}
    assert alice == {"shared fact", "alice secret"}
    assert {m.content for m in mem.recall("", k=10, scope=Scope.shared("team"))} == {"shared fact"}


def test_vector_memory_semantic_ranking_with_injected_embedder():
    mem = VectorMemory(embedder=bag_of_words)
    mem.add("customer wants a refund for the order")
    mem.add("it will rain, bad weather")
    mem.add("exchange the keyboard")
    assert mem.recall("weather today, rain?", k=1)[0].content == "it will rain, bad weather"
    assert mem.recall("keyboard exchange", k=1)[0].content == "exchange the keyboard"
    with pytest.raises(ValueError, match="embedder returned shape"):
        VectorMemory(embedder=lambda t: np.zeros(3)).add("x")


@pytest.mark.slow
def test_vector_memory_with_packaged_minilm():
    mem = VectorMemory()
    mem.add("The customer asked to return a broken lamp.")
    mem.add("Paris is the capital of France.")
    assert mem.recall("product return request", k=1)[0].content.startswith("The customer")


def test_graph_memory_relational_and_temporal():
    mem = GraphMemory()
    a = mem.add(MemoryItem("User yusuf_rossi_9620 owns order #W2378156"))
    mem.add(MemoryItem("Order #W2378156 contains a Mechanical Keyboard"))
    mem.add(MemoryItem("The weather was nice"))
    mem.add_relation("yusuf_rossi_9620", "lives_in", "Philadelphia")
    hits = mem.recall("what is in #W2378156?", k=2)
    assert len(hits) == 2 and all("#W2378156" in h.content for h in hits)
    assert [h.id for h in mem.history("#w2378156")][0] == a
    assert mem.related("yusuf_rossi_9620") == [("lives_in", "philadelphia")]
    assert mem.graph.has_edge(("item", a), ("item", mem.history("#W2378156")[1].id))
    mem.forget(a)
    assert len(mem.history("#W2378156")) == 1


def _log(reward):
    return EventLog(
        [Event(EventKind.OBSERVATION, {"content": "q"}), Event(EventKind.TEXT, {"content": "a"}), Event(EventKind.REWARD, {"value": reward}, scope="episode")],
        tier="full",
    )


def test_trajectory_store_in_warehouse(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    store = TrajectoryStore(wh, source="spine_test")
    logs = [_log(r) for r in (0.0, 0.5, 1.0)]
    store.add(logs, provenance=Provenance(run_id="r1"))
    assert {l.id for l in store.get_by_reward_range(0.5, 1.0)} == {logs[1].id, logs[2].id}
    assert [l.id for l in store.get_by_reward_range(high=0.0)] == [logs[0].id]
    assert store.get(logs[2].id) == logs[2]
    assert len(store.all()) == 3
    with pytest.raises(ValueError, match="empty reward range"):
        store.get_by_reward_range(1.0, 0.0)


def test_in_context_capacity_zero_or_negative_is_a_clear_error():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="capacity must be a positive integer"):
            InContextMemory(capacity=bad)
    mem = InContextMemory(capacity=1)
    first = mem.add("a")
    second = mem.add("b")
    assert [i.content for i in mem.recall("q", k=5)] == ["b"] and mem.get(second).content == "b"
    with pytest.raises(KeyError):
        mem.get(first)


def test_trajectory_store_rejects_nan_bounds(tmp_path):
    from agenttune_lib.warehouse import Warehouse

    store = TrajectoryStore(Warehouse(tmp_path / "w.duckdb"))
    for low, high in ((float("nan"), 1.0), (0.0, float("nan")), ("0", 1.0)):
        with pytest.raises(ValueError, match="bound (low|high) must be a number"):
            store.get_by_reward_range(low, high)
