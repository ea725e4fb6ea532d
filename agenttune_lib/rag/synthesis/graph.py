"""Stage 1b and 2: a typed chunk graph (exact, contextual, abstract edges) and bounded simple-path sampling."""
from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import networkx as nx
import numpy as np

from agenttune_lib.rag.synthesis.annotate import Annotation, term_key

__all__ = ["build_graph", "graph_from_edges", "edges_table", "sample_paths", "EDGE_TYPES"]

EDGE_TYPES = ("exact", "contextual", "abstract")


def build_graph(
    chunks: Sequence[Any],
    annotations: Sequence[Annotation],
    vectors: np.ndarray | None = None,
    abstract_threshold: float = 0.75,
    max_link_df: float = 0.05,
    cross_document: bool = False,
) -> nx.Graph:
    """Chunks as nodes; an edge where two chunks share an entity (exact), a keyphrase (contextual) or, with
    neither, have embedding cosine >= ``abstract_threshold`` (abstract). Edges stay inside one document
    unless ``cross_document``. Terms in more than ``max_link_df`` of chunks are too common to link."""
    graph = nx.Graph()
    ann = {a.chunk_id: a for a in annotations}
    for c in chunks:
        graph.add_node(c.chunk_id, doc_id=c.doc_id, ord=c.ord)
    keys: dict[str, dict[str, tuple[str, str]]] = {}  # chunk -> key -> (kind, surface)
    df: dict[str, int] = defaultdict(int)
    for c in chunks:
        a = ann.get(c.chunk_id)
        entry: dict[str, tuple[str, str]] = {}
        if a is not None:
            for kp in a.keyphrases:
                entry.setdefault(term_key(kp), ("contextual", kp))
            for e in a.entities:
                entry[term_key(e)] = ("exact", e)
        entry.pop("", None)
        keys[c.chunk_id] = entry
        for k in entry:
            df[k] += 1
    limit = max(3, int(max_link_df * len(chunks)))
    postings: dict[tuple[str, str], list[str]] = defaultdict(list)
    for c in chunks:
        scope = "*" if cross_document else c.doc_id
        for k in keys[c.chunk_id]:
            if df[k] <= limit:
                postings[(scope, k)].append(c.chunk_id)
    shared: dict[tuple[str, str], list[tuple[str, str, str]]] = defaultdict(list)
    for (_, k), members in postings.items():
        for a_id, b_id in itertools.combinations(sorted(members), 2):
            kind = "exact" if keys[a_id][k][0] == "exact" and keys[b_id][k][0] == "exact" else "contextual"
            shared[(a_id, b_id)].append((kind, keys[a_id][k][1], k))
    for (a_id, b_id), terms in shared.items():
        terms.sort(key=lambda t: (t[0] != "exact", df[t[2]], t[2]))
        types = sorted({t[0] for t in terms}, key=EDGE_TYPES.index)
        graph.add_edge(a_id, b_id, type=types[0], types=types, terms=[t[1] for t in terms], weight=float(len(terms)))
    if vectors is not None and len(chunks):
        from agenttune_lib.rag.embedding import normalise_rows

        vectors = normalise_rows(np.asarray(vectors, dtype=np.float32))
        index = {c.chunk_id: i for i, c in enumerate(chunks)}
        groups: dict[str, list[str]] = defaultdict(list)
        for c in chunks:
            groups["*" if cross_document else c.doc_id].append(c.chunk_id)
        for members in groups.values():
            if len(members) < 2:
                continue
            idx = [index[m] for m in members]
            sims = vectors[idx] @ vectors[idx].T
            rows, cols = np.nonzero(np.triu(sims >= abstract_threshold, k=1))
            for r, col in zip(rows.tolist(), cols.tolist()):
                a_id, b_id = members[r], members[col]
                if not graph.has_edge(a_id, b_id):
                    graph.add_edge(a_id, b_id, type="abstract", types=["abstract"], terms=[], weight=float(sims[r, col]))
    return graph


def edges_table(graph: nx.Graph) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {"source": [], "target": [], "type": [], "types": [], "terms": [], "weight": []}
    for a, b, data in sorted(graph.edges(data=True), key=lambda e: (e[0], e[1])):
        rows["source"].append(a)
        rows["target"].append(b)
        rows["type"].append(data["type"])
        rows["types"].append(list(data["types"]))
        rows["terms"].append(list(data["terms"]))
        rows["weight"].append(float(data["weight"]))
    return rows


def graph_from_edges(nodes: Mapping[str, str], edges: Mapping[str, Sequence[Any]]) -> nx.Graph:
    """Rebuild the graph from a node→doc map and an edges table (as written by ``edges_table``)."""
    graph = nx.Graph()
    for node, doc in nodes.items():
        graph.add_node(node, doc_id=doc)
    for a, b, t, ts, terms, w in zip(edges["source"], edges["target"], edges["type"], edges["types"], edges["terms"], edges["weight"]):
        graph.add_edge(a, b, type=t, types=list(ts), terms=list(terms), weight=float(w))
    return graph


def sample_paths(
    graph: nx.Graph,
    hops: tuple[int, int] = (2, 5),
    max_paths: int = 400,
    per_source: int = 2,
    seed: int = 0,
    hop_weights: Mapping[int, float] | None = None,
    cross_document: bool = False,
    sources: Sequence[str] | None = None,
) -> list[list[str]]:
    """Bounded simple paths of ``hops`` chunks (networkx ``all_simple_paths`` with a cutoff), at most
    ``per_source`` per start chunk and hop count, with quotas per hop count. A path never leaves its
    start chunk's document unless ``cross_document``. ``sources`` (e.g. chunks holding a typed answer) are
    tried before the other chunks."""
    lo, hi = hops
    if lo < 2 or hi < lo:
        raise ValueError(f"hops must satisfy 2 <= min <= max, got {hops}")
    weights = dict(hop_weights or {h: 1.0 / (h - lo + 1) for h in range(lo, hi + 1)})
    total = sum(weights.get(h, 0.0) for h in range(lo, hi + 1)) or 1.0
    quota = {h: max(1, round(max_paths * weights.get(h, 0.0) / total)) for h in range(lo, hi + 1)}
    rng = random.Random(seed)
    preferred = set(sources or ())
    pool = sorted(n for n in graph.nodes if graph.degree(n) > 0)
    found: dict[int, list[list[str]]] = {h: [] for h in range(lo, hi + 1)}
    members: dict[Any, list[str]] = defaultdict(list)
    for n in graph.nodes:
        members[graph.nodes[n].get("doc_id")].append(n)
    scopes: dict[Any, nx.Graph] = {}
    for h in range(lo, hi + 1):
        rng.shuffle(pool)  # a fresh order per hop count, so hop counts start from different chunks
        order = [n for n in pool if n in preferred] + [n for n in pool if n not in preferred]
        for source in order:
            if len(found[h]) >= quota[h]:
                break
            doc = graph.nodes[source].get("doc_id")
            if cross_document:
                scope = graph
            else:
                scope = scopes.get(doc) or scopes.setdefault(doc, graph.subgraph(members[doc]))
            targets = [n for n in scope.nodes if n != source]
            if not targets:
                continue
            taken = 0
            for path in itertools.islice(nx.all_simple_paths(scope, source, targets, cutoff=h - 1), 400):
                if len(path) != h:
                    continue
                found[h].append(list(path))
                taken += 1
                if taken >= per_source or len(found[h]) >= quota[h]:
                    break
    out = [p for h in range(lo, hi + 1) for p in found[h]]
    if not cross_document:  # the document-boundary guard, also against graphs built elsewhere
        out = [p for p in out if len({graph.nodes[n].get("doc_id") for n in p}) == 1]
    return out
