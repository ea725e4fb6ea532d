"""Leakage-safe train/validation splits over shared gold chunks, and the warehouse ``qa_items`` table."""
from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SplitReport", "split_by_gold_chunks", "load_qa_split", "write_qa_items", "SPLITS"]

SPLITS = ("train", "validation")


@dataclasses.dataclass
class SplitReport:
    """What the splitter achieved; ``degenerate`` when disjointness prevented a usable split."""

    n_items: int
    n_train: int
    n_val: int
    requested_val_fraction: float
    achieved_val_fraction: float
    n_components: int
    largest_component: int
    degenerate: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _gold(item: Any) -> list[str]:
    value = item["gold_chunk_ids"] if isinstance(item, Mapping) else getattr(item, "gold_chunk_ids")
    return [str(v) for v in value]


class _UnionFind:
    """Path-halving union-find over item indices (a dozen lines; networkx components would need a graph copy)."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def split_by_gold_chunks(items: Sequence[Any], val_fraction: float = 0.2, seed: int = 0, tolerance: float = 0.1) -> tuple[list[Any], list[Any], SplitReport]:
    """Split so no gold chunk is on both sides: union-find components over shared gold chunks, then
    greedy bin packing (largest first) toward ``val_fraction``. Disjointness is never traded for the
    fraction; a split that misses it by more than ``tolerance`` or leaves a side empty is degenerate."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    items = list(items)
    n = len(items)
    uf = _UnionFind(n)
    owner: dict[str, int] = {}
    for i, item in enumerate(items):
        for chunk_id in _gold(item):
            if chunk_id in owner:
                uf.union(owner[chunk_id], i)
            else:
                owner[chunk_id] = i
    components: dict[int, list[int]] = {}
    for i in range(n):
        components.setdefault(uf.find(i), []).append(i)
    groups = list(components.values())
    random.Random(seed).shuffle(groups)
    groups.sort(key=len, reverse=True)
    target = val_fraction * n
    val_idx: set[int] = set()
    for group in groups:
        if len(val_idx) + len(group) <= target + 1e-9:
            val_idx.update(group)
    train = [items[i] for i in range(n) if i not in val_idx]
    val = [items[i] for i in range(n) if i in val_idx]
    achieved = len(val) / n if n else 0.0
    largest = max((len(g) for g in groups), default=0)
    reason = ""
    if n == 0:
        reason = "no items to split"
    elif not val:
        reason = f"no component fits the validation side: the smallest has {min(len(g) for g in groups)} of {n} items, the target is {target:.1f}"
    elif not train:
        reason = "every item landed in validation"
    elif abs(achieved - val_fraction) > tolerance:
        reason = f"achieved validation fraction {achieved:.3f} is more than {tolerance} from the requested {val_fraction}"
    report = SplitReport(n, len(train), len(val), val_fraction, round(achieved, 4), len(groups), largest, bool(reason), reason)
    return train, val, report


def _warehouse(warehouse: Any) -> Any:
    if isinstance(warehouse, (str, bytes)) or hasattr(warehouse, "__fspath__"):
        from agenttune_lib.warehouse import Warehouse

        return Warehouse(str(warehouse))
    return warehouse


_QA_COLUMNS = ("qa_id", "split", "question", "answer", "gold_chunk_ids", "hops", "difficulty")


def write_qa_items(warehouse: Any, rows: Sequence[Mapping[str, Any]], dataset_version: str) -> int:
    """Upsert QA items (keyed by qa_id) into the warehouse table ``qa_items`` under one dataset version."""
    import pyarrow as pa

    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    columns = {
        "qa_id": pa.array([str(r["qa_id"]) for r in rows], pa.string()),
        "split": pa.array([str(r["split"]) for r in rows], pa.string()),
        "question": pa.array([str(r["question"]) for r in rows], pa.string()),
        "answer": pa.array([str(r["answer"]) for r in rows], pa.string()),
        "gold_chunk_ids": pa.array([[str(c) for c in r["gold_chunk_ids"]] for r in rows], pa.list_(pa.string())),
        "hops": pa.array([int(r["hops"]) for r in rows], pa.int32()),
        "difficulty": pa.array([float(r.get("difficulty", 0.0)) for r in rows], pa.float64()),
        "retrieval_difficulty": pa.array([float(r.get("retrieval_difficulty", 0.0)) for r in rows], pa.float64()),
        "difficulty_cell": pa.array([str(r.get("difficulty_cell", "")) for r in rows], pa.string()),
        "answer_chunk_id": pa.array([str(r.get("answer_chunk_id", "")) for r in rows], pa.string()),
        "doc_ids": pa.array([[str(d) for d in r.get("doc_ids", [])] for r in rows], pa.list_(pa.string())),
        "dataset_version": pa.array([dataset_version] * len(rows), pa.string()),
        "created_at": pa.array([now] * len(rows), pa.timestamp("us")),
    }
    return _warehouse(warehouse).upsert_arrow("qa_items", pa.table(columns), key="qa_id")


def load_qa_split(warehouse: Any, split: str) -> list[dict[str, Any]]:
    """QA items of one split (``train`` or ``validation``) from the newest dataset version in the warehouse."""
    split = {"val": "validation", "valid": "validation", "dev": "validation"}.get(split, split)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    wh = _warehouse(warehouse)
    if not wh.has_table("qa_items"):
        raise LookupError(f"warehouse {getattr(wh, 'path', wh)} has no qa_items table; materialize qa_splits first")
    rows = wh.query_arrow(
        "SELECT qa_id, question, answer, gold_chunk_ids, hops, difficulty, split FROM qa_items "
        "WHERE split = ? AND dataset_version = (SELECT dataset_version FROM qa_items ORDER BY created_at DESC, dataset_version LIMIT 1) "
        "ORDER BY qa_id",
        [split],
    ).to_pylist()
    for row in rows:
        row["gold_chunk_ids"] = list(row["gold_chunk_ids"] or [])
    return rows
