"""Leakage-safe train/validation splits over shared gold chunks, and the warehouse ``qa_items`` table."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SplitReport", "split_by_gold_chunks", "split_health", "answer_diversity", "load_qa_split", "write_qa_items", "SPLITS"]

SPLITS = ("train", "validation")


@dataclasses.dataclass
class SplitReport:
    """What the splitter achieved; ``degenerate`` (with ``reason``) when disjointness prevented a usable split:
    a side is empty, the validation fraction or a hop count's share misses its target by more than the
    tolerance, a hop count is missing from validation, or validation spans too few documents."""

    n_items: int
    n_train: int
    n_val: int
    requested_val_fraction: float
    achieved_val_fraction: float
    n_components: int
    largest_component: int
    degenerate: bool
    reason: str = ""
    tolerance: float = 0.1
    val_documents: int = 0
    documents: int = 0
    val_hops: dict[str, int] = dataclasses.field(default_factory=dict)
    hops: dict[str, int] = dataclasses.field(default_factory=dict)
    hop_share_gap: float = 0.0
    val_largest_document_share: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _gold(item: Any) -> list[str]:
    value = item["gold_chunk_ids"] if isinstance(item, Mapping) else getattr(item, "gold_chunk_ids")
    return [str(v) for v in value]


def _field(item: Any, name: str, default: Any = None) -> Any:
    return item.get(name, default) if isinstance(item, Mapping) else getattr(item, name, default)


def _doc(item: Any) -> str | None:
    docs = _field(item, "doc_ids") or []
    return str(docs[0]) if len(docs) else None


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


def split_by_gold_chunks(items: Sequence[Any], val_fraction: float = 0.2, seed: int = 0, tolerance: float = 0.1, min_val_documents: int = 0) -> tuple[list[Any], list[Any], SplitReport]:
    """Split so no gold chunk is on both sides (union-find components over shared gold chunks), stratified:
    components are added to validation greedily, preferring one that brings a hop count validation lacks (it
    may overshoot ``val_fraction`` by half the tolerance), then one from a document validation lacks, then the
    one that best fills the hop counts still short of their ``val_fraction`` share, then the smallest, up to
    ``val_fraction`` of the items. Disjointness is never traded for the strata; misses beyond ``tolerance``
    (fraction, any hop count's share), a hop count absent from validation, or fewer validation documents than
    ``min(min_val_documents, documents // 3)`` make the split degenerate, with the reason."""
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
    hop_of = [str(_field(it, "hops", "")) for it in items]
    doc_of = [_doc(it) for it in items]
    all_hops = Counter(hop_of)
    want = {h: val_fraction * c for h, c in all_hops.items()}
    target = val_fraction * n
    stretch = (val_fraction + tolerance / 2) * n  # a component bringing a hop count validation lacks may overshoot, within tolerance
    g_hops = [Counter(hop_of[i] for i in g) for g in groups]
    g_docs = [{doc_of[i] for i in g} - {None} for g in groups]
    val_idx: set[int] = set()
    val_hops: Counter[str] = Counter()
    val_docs: Counter[str] = Counter()
    remaining = set(range(len(groups)))
    while True:
        best, best_key = None, None
        for j in remaining:
            size = len(groups[j])
            fills_missing = any(not val_hops[h] and want[h] >= 1 for h in g_hops[j])  # a hop count owed at least one item
            if len(val_idx) + size > (stretch if fills_missing else target) + 1e-9:
                continue
            gain = sum(min(c, max(0.0, want[h] - val_hops[h])) for h, c in g_hops[j].items()) / size
            key = (fills_missing, bool(g_docs[j] - set(val_docs)), round(gain, 6), -size, -j)
            if best_key is None or key > best_key:
                best, best_key = j, key
        if best is None:
            break
        remaining.discard(best)
        val_idx.update(groups[best])
        val_hops.update(g_hops[best])
        val_docs.update(doc_of[i] for i in groups[best] if doc_of[i] is not None)
    train = [items[i] for i in range(n) if i not in val_idx]
    val = [items[i] for i in range(n) if i in val_idx]
    achieved = len(val) / n if n else 0.0
    largest = max((len(g) for g in groups), default=0)
    documents = len({d for d in doc_of if d is not None})
    gap = max((abs(val_hops[h] / len(val) - c / n) for h, c in all_hops.items()), default=0.0) if val else 1.0
    need_docs = min(min_val_documents, documents // 3)
    reason = ""
    if n == 0:
        reason = "no items to split"
    elif not val:
        reason = f"no component fits the validation side: the smallest has {min(len(g) for g in groups)} of {n} items, the target is {target:.1f}"
    elif not train:
        reason = "every item landed in validation"
    elif abs(achieved - val_fraction) > tolerance:
        reason = f"achieved validation fraction {achieved:.3f} is more than {tolerance} from the requested {val_fraction}"
    elif missing := sorted(h for h, c in all_hops.items() if not val_hops[h] and c * val_fraction >= 1):
        reason = f"validation has no {'/'.join(missing)}-hop item"
    elif gap > max(tolerance, 1.0 / len(val)):  # one validation item's worth of slack on small sets
        reason = f"a hop count's share in validation is {gap:.3f} from its share overall (tolerance {tolerance})"
    elif len(val_docs) < need_docs:
        reason = f"validation spans {len(val_docs)} documents, fewer than {need_docs}"
    report = SplitReport(n, len(train), len(val), val_fraction, round(achieved, 4), len(groups), largest, bool(reason), reason, tolerance,
                         len(val_docs), documents, dict(sorted(val_hops.items())), dict(sorted(all_hops.items())), round(gap, 4),
                         round(max(val_docs.values(), default=0) / max(1, len(val)), 4))
    return train, val, report


def split_health(items: Sequence[Mapping[str, Any]], min_val_documents: int = 10, tolerance: float = 0.1) -> dict[str, Any]:
    """Whether a stored split's validation side is usable: non-empty, every hop count that has at least one
    validation item's worth of items present, each hop count's share within ``tolerance`` (or one item) of its
    share overall, and at least ``min(min_val_documents, documents // 3)`` documents."""
    val = [it for it in items if it.get("split") == "validation"]
    n = len(items)
    hops = Counter(str(it.get("hops")) for it in items)
    val_hops = Counter(str(it.get("hops")) for it in val)
    docs = {_doc(it) for it in items} - {None}
    val_docs = {_doc(it) for it in val} - {None}
    frac = len(val) / n if n else 0.0
    problems = []
    if not val:
        problems.append("the validation side is empty")
    else:
        missing = sorted(h for h, c in hops.items() if not val_hops[h] and c * frac >= 1)
        if missing:
            problems.append(f"validation has no {'/'.join(missing)}-hop item")
        gap = max(abs(val_hops[h] / len(val) - c / n) for h, c in hops.items())
        if gap > max(tolerance, 1.0 / len(val)):
            problems.append(f"a hop count's share in validation is {gap:.3f} from its share overall (tolerance {tolerance})")
        need = min(min_val_documents, len(docs) // 3)
        if len(val_docs) < need:
            problems.append(f"validation spans {len(val_docs)} documents, fewer than {need}")
    if len(val) == n and n:
        problems.append("every item is in validation")
    return {"passed": not problems, "problems": problems, "n_val": len(val), "val_documents": len(val_docs), "documents": len(docs),
            "val_hops": dict(sorted(val_hops.items())), "hops": dict(sorted(hops.items()))}


def answer_diversity(items: Sequence[Mapping[str, Any]], min_unique_answers: int, min_answer_types: int) -> dict[str, Any]:
    """Whether the kept items have at least ``min_unique_answers`` distinct (normalised) answers and
    ``min_answer_types`` answer types."""
    from agenttune_lib.rag.metrics import normalise_answer

    unique = len({normalise_answer(str(it.get("answer") or "")) for it in items} - {""})
    types = Counter(str(it.get("answer_type") or "") for it in items if it.get("answer_type"))
    problems = []
    if unique < min_unique_answers:
        problems.append(f"{unique} unique answers, fewer than {min_unique_answers}")
    if len(types) < min_answer_types:
        problems.append(f"{len(types)} answer types, fewer than {min_answer_types}")
    return {"passed": not problems, "problems": problems, "unique_answers": unique, "items": len(items), "answer_types": dict(sorted(types.items()))}


def _warehouse(warehouse: Any) -> Any:
    if isinstance(warehouse, (str, bytes)) or hasattr(warehouse, "__fspath__"):
        from agenttune_lib.warehouse import Warehouse

        return Warehouse(str(warehouse))
    return warehouse


_QA_COLUMNS = ("qa_id", "split", "question", "answer", "answer_type", "answer_chunk_id", "gold_chunk_ids", "hops", "doc_ids", "difficulty", "chain")
_ADDED_COLUMNS = {"answer_type": "VARCHAR", "chain": "VARCHAR"}  # added after the first release: ALTERed into older warehouses


def _chain_json(row: Mapping[str, Any]) -> str:
    chain = row.get("chain")
    if chain is None:
        from agenttune_lib.rag.synthesis.generate import chain_of

        chain = chain_of(dict(row))
    return chain if isinstance(chain, str) else json.dumps(chain, ensure_ascii=False)


def write_qa_items(warehouse: Any, rows: Sequence[Mapping[str, Any]], dataset_version: str) -> int:
    """Upsert QA items (keyed by qa_id) into the warehouse table ``qa_items`` under one dataset version;
    ``chain`` (the hop-ordered evidence chain with its hidden bridge terms) is stored as JSON text."""
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
        "answer_type": pa.array([str(r.get("answer_type") or "") for r in rows], pa.string()),
        "chain": pa.array([_chain_json(r) for r in rows], pa.string()),
    }
    wh = _warehouse(warehouse)
    if wh.has_table("qa_items"):
        with wh.connect() as con:
            for name, sql_type in _ADDED_COLUMNS.items():
                con.execute(f"ALTER TABLE qa_items ADD COLUMN IF NOT EXISTS {name} {sql_type}")
    return wh.upsert_arrow("qa_items", pa.table(columns), key="qa_id")


def load_qa_split(warehouse: Any, split: str) -> list[dict[str, Any]]:
    """QA items of one split (``train`` or ``validation``) from the newest dataset version in the warehouse:
    qa_id, split, question, answer, answer_type, answer_chunk_id, gold_chunk_ids (hop order), hops, doc_ids,
    difficulty and ``chain`` (a list of {hop, chunk_id, bridge_in, bridge_out, clue})."""
    split = {"val": "validation", "valid": "validation", "dev": "validation"}.get(split, split)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    wh = _warehouse(warehouse)
    if not wh.has_table("qa_items"):
        raise LookupError(f"warehouse {getattr(wh, 'path', wh)} has no qa_items table; materialize qa_splits first")
    with wh.connect() as con:
        present = {r[0] for r in con.execute("DESCRIBE qa_items").fetchall()}
    cols = ", ".join(c if c in present else f"NULL AS {c}" for c in _QA_COLUMNS)
    rows = wh.query_arrow(
        f"SELECT {cols} FROM qa_items "
        "WHERE split = ? AND dataset_version = (SELECT dataset_version FROM qa_items ORDER BY created_at DESC, dataset_version LIMIT 1) "
        "ORDER BY qa_id",
        [split],
    ).to_pylist()
    for row in rows:
        row["gold_chunk_ids"] = list(row["gold_chunk_ids"] or [])
        row["doc_ids"] = list(row["doc_ids"] or [])
        row["answer_type"] = row["answer_type"] or ""
        row["chain"] = json.loads(row["chain"]) if row["chain"] else []
    return rows
