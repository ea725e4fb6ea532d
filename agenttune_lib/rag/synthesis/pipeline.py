"""run_pipeline: corpus to grounded, difficulty-tagged multi-hop QA in six stages, each written as Parquet.

Stage 1 (chunk annotation and graph) is corpus-deterministic and cached by content; stages 2-6 always run.
The stage methods read and write files under ``out_dir`` so separate processes (Dagster steps) can run them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agenttune_lib.rag.chunking import Chunk, ChunkingConfig, chunk_documents
from agenttune_lib.rag.embedding import encode_texts
from agenttune_lib.rag.metrics import answer_in, normalise_answer
from agenttune_lib.rag.splits import split_by_gold_chunks
from agenttune_lib.rag.synthesis.annotate import ExtractiveAnnotator, LLMAnnotator, term_key
from agenttune_lib.rag.synthesis.answers import unique_spans
from agenttune_lib.rag.synthesis.difficulty import assign_difficulty, balanced_resample, difficulty_matrix
from agenttune_lib.rag.synthesis.generate import Candidate, ExtractiveGenerator, LLMGenerator, PathContext, chain_of
from agenttune_lib.rag.synthesis.graph import build_graph, edges_table, graph_from_edges, sample_paths
from agenttune_lib.rag.synthesis.llm import CallLog, LLMClient, LLMResponse
from agenttune_lib.rag.synthesis.verify import ChainChecks, ExtractiveVerifier, LLMVerifier, answerability_gate, verify_candidates

__all__ = ["SynthesisConfig", "SynthesisPipeline", "SynthesisError", "PipelineResult", "run_pipeline"]


class SynthesisError(RuntimeError):
    """The corpus cannot yield a dataset (for instance, too small for any 2-hop path)."""


@dataclasses.dataclass(frozen=True)
class SynthesisConfig:
    """Knobs of the six stages; the defaults fit the embedded Commercial-licence corpus on a 2-core CPU."""

    chunking: ChunkingConfig = ChunkingConfig()
    min_hops: int = 2
    max_hops: int = 5
    max_candidates: int = 1500
    paths_per_source: int = 1
    abstract_threshold: float = 0.75
    max_link_df: float = 0.05
    cross_document: bool = False
    max_answer_words: int = 8
    shortcut_k: int = 8
    shortcut_backends: tuple[str, ...] = ("bm25", "dense", "hybrid")
    single_passage_overlap: float = 0.75
    near_duplicate: float = 92.0
    max_same_answer: int = 1
    power_p: float = -3.0
    balance: bool = False
    per_cell: int | None = None
    val_fraction: float = 0.2
    split_tolerance: float = 0.1
    min_val_documents: int = 10
    min_unique_answers: int = 150
    min_answer_types: int = 5
    seed: int = 0

    def fingerprint(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class PipelineResult:
    """Where the outputs are and the headline numbers."""

    out_dir: Path
    metrics: dict[str, Any]
    train: list[dict[str, Any]]
    validation: list[dict[str, Any]]

    @property
    def files(self) -> dict[str, Path]:
        return {p.name: p for p in sorted(self.out_dir.iterdir()) if p.is_file()}


def _write(table: dict[str, list[Any]] | pa.Table, path: Path) -> None:
    pq.write_table(table if isinstance(table, pa.Table) else pa.table(table), path)


def _read(path: Path) -> dict[str, list[Any]]:
    if not path.exists():
        raise SynthesisError(f"missing stage output {path}; run the earlier stage first")
    return pq.read_table(path).to_pydict()


def _calls_table(log: CallLog) -> pa.Table:
    fields = [("stage", pa.string()), ("purpose", pa.string()), ("ref", pa.string()), ("model", pa.string()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("cost_usd", pa.float64()), ("latency_s", pa.float64())]
    return pa.table({name: pa.array([r[name] for r in log.rows], type) for name, type in fields})


def _rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(list(rows)) if rows else pa.table({})


def _name(obj: Any) -> str:
    return str(getattr(obj, "name", None) or getattr(obj, "model", None) or type(obj).__name__)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class SynthesisPipeline:
    """The six stages over one output directory; generator, verifier, annotator and embedder are injected."""

    def __init__(
        self,
        out_dir: str | Path,
        config: SynthesisConfig = SynthesisConfig(),
        llm: LLMClient | None = None,
        embedder: Any = None,
        generator: Any = None,
        verifier: Any = None,
        annotator: Any = None,
        cache_dir: str | Path | None = None,
    ) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.llm = llm
        self.embedder = embedder
        self.generator = generator or (LLMGenerator(llm) if llm is not None else ExtractiveGenerator())
        self.verifier = verifier or (LLMVerifier(llm) if llm is not None else ExtractiveVerifier())
        self.annotator = annotator or (LLMAnnotator(llm) if llm is not None else ExtractiveAnnotator())
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.timings: dict[str, float] = {}

    def _timed(self, stage: str, t0: float) -> None:
        """Record a stage's wall time in ``timings.json`` (stages may run in different processes)."""
        path = self.out / "timings.json"
        timings = json.loads(path.read_text()) if path.exists() else {}
        timings[stage] = round(time.perf_counter() - t0, 3)
        path.write_text(json.dumps(timings, sort_keys=True))
        self.timings = timings

    def _embedder(self) -> Any:
        if self.embedder is None:
            from agenttune_lib.rag.embedding import SentenceTransformerEmbedder

            self.embedder = SentenceTransformerEmbedder()
        return self.embedder

    # -- stage 1: annotate and graph (cached) -------------------------------------------------
    def stage1(self, chunks: Sequence[Chunk], vectors: np.ndarray | None = None) -> dict[str, Any]:
        """Annotate chunks and build the typed graph; ``vectors`` (aligned with chunks) skips re-embedding."""
        t0 = time.perf_counter()
        if not chunks:
            raise SynthesisError("no chunks to synthesise from: every document was empty or unreadable")
        embedder_name = getattr(self.embedder, "name", "default") if vectors is None else f"given:{vectors.shape}"
        key_src = json.dumps(
            {"chunks": [c.chunk_id for c in chunks], "annotator": getattr(self.annotator, "name", type(self.annotator).__name__), "embedder": embedder_name,
             "abstract_threshold": self.config.abstract_threshold, "max_link_df": self.config.max_link_df, "cross_document": self.config.cross_document},
            sort_keys=True,
        )
        key = hashlib.sha256(key_src.encode()).hexdigest()[:20]
        names = ("stage1_chunks.parquet", "stage1_edges.parquet", "stage1_calls.parquet")
        cached = self.cache_dir / key if self.cache_dir else None
        if cached is not None and all((cached / n).exists() for n in names):
            for n in names:
                shutil.copyfile(cached / n, self.out / n)
            self._timed("stage1", t0)
            return {**self._stage1_stats(), "cache": "hit", "cache_key": key}
        log = CallLog()
        annotations = self.annotator.annotate(chunks, log)
        if vectors is None:
            t_emb = time.perf_counter()
            vectors = encode_texts(self._embedder(), [c.text for c in chunks])
            log.record("stage1_embed", "embed_chunks", LLMResponse("", _name(self.embedder), 0, 0, time.perf_counter() - t_emb, 0.0))
        graph = build_graph(chunks, annotations, vectors, self.config.abstract_threshold, self.config.max_link_df, self.config.cross_document)
        ann = {a.chunk_id: a for a in annotations}
        _write(
            {
                "chunk_id": [c.chunk_id for c in chunks], "doc_id": [c.doc_id for c in chunks], "ord": [c.ord for c in chunks],
                "title": [c.title for c in chunks], "text": [c.text for c in chunks],
                "entities": [ann[c.chunk_id].entities for c in chunks], "keyphrases": [ann[c.chunk_id].keyphrases for c in chunks],
                "summary": [ann[c.chunk_id].summary for c in chunks], "degree": [graph.degree(c.chunk_id) for c in chunks],
            },
            self.out / names[0],
        )
        edges = edges_table(graph)
        _write(pa.table({k: pa.array(v, t) for (k, v), t in zip(edges.items(), [pa.string(), pa.string(), pa.string(), pa.list_(pa.string()), pa.list_(pa.string()), pa.float64()])}), self.out / names[1])
        _write(_calls_table(log), self.out / names[2])
        if cached is not None:
            cached.mkdir(parents=True, exist_ok=True)
            for n in names:
                shutil.copyfile(self.out / n, cached / n)
        self._timed("stage1", t0)
        return {**self._stage1_stats(), "cache": "miss" if cached else "off", "cache_key": key}

    def _stage1_stats(self) -> dict[str, Any]:
        edges = _read(self.out / "stage1_edges.parquet")
        chunks = _read(self.out / "stage1_chunks.parquet")
        counts = Counter(edges["type"])
        return {"n_chunks": len(chunks["chunk_id"]), "n_docs": len(set(chunks["doc_id"])), "n_edges": len(edges["type"]), **{f"edges_{t}": counts.get(t, 0) for t in ("exact", "contextual", "abstract")}}

    # -- stage 2: paths -------------------------------------------------------------------
    def _chunk_rows(self) -> dict[str, dict[str, Any]]:
        t = _read(self.out / "stage1_chunks.parquet")
        keys = list(t)
        return {cid: {k: t[k][i] for k in keys} for i, cid in enumerate(t["chunk_id"])}

    def stage2(self) -> dict[str, Any]:
        """Sample bounded simple paths of min_hops..max_hops chunks inside documents."""
        t0 = time.perf_counter()
        rows = self._chunk_rows()
        graph = graph_from_edges({cid: r["doc_id"] for cid, r in rows.items()}, _read(self.out / "stage1_edges.parquet"))
        if isinstance(self.generator, ExtractiveGenerator):
            # it phrases every hop through a shared term the question must not name, and the question names the
            # document's title: only terms outside the title can be a bridge, and an edge without one cannot be a hop
            for a, b, d in list(graph.edges(data=True)):
                title = f" {term_key(rows[a]['title'])} "
                d["terms"] = [t for t in d["terms"] if term_key(t) and f" {term_key(t)} " not in title]
                if not d["terms"]:
                    graph.remove_edge(a, b)
        cfg = self.config
        sources = None
        if isinstance(self.generator, ExtractiveGenerator):  # start paths at chunks that hold a typed answer
            sources = [cid for cid, r in rows.items() if unique_spans(r["text"])]
        paths = sample_paths(graph, (cfg.min_hops, cfg.max_hops), cfg.max_candidates, cfg.paths_per_source, cfg.seed, cross_document=cfg.cross_document, sources=sources)
        if not paths:
            n_docs = len({r["doc_id"] for r in rows.values()})
            raise SynthesisError(
                f"corpus too small for a {cfg.min_hops}-hop path: {len(rows)} chunks in {n_docs} documents and {graph.number_of_edges()} "
                "linking edges; add documents with several related passages"
            )
        table = {"path_id": [], "chunk_ids": [], "doc_id": [], "hops": [], "edge_types": [], "edge_terms": []}
        for p in paths:
            table["path_id"].append("p-" + hashlib.sha256("|".join(p).encode()).hexdigest()[:16])
            table["chunk_ids"].append(p)
            table["doc_id"].append(rows[p[0]]["doc_id"])
            table["hops"].append(len(p))
            table["edge_types"].append([graph.edges[a, b]["type"] for a, b in zip(p, p[1:])])
            table["edge_terms"].append([list(graph.edges[a, b]["terms"]) for a, b in zip(p, p[1:])])
        _write(table, self.out / "stage2_paths.parquet")
        self._timed("stage2", t0)
        return {"n_paths": len(paths), **{f"paths_{h}_hop": c for h, c in sorted(Counter(table["hops"]).items())}}

    def _contexts(self) -> dict[str, PathContext]:
        rows = self._chunk_rows()
        paths = _read(self.out / "stage2_paths.parquet")
        by_doc: dict[str, list[str]] = {}
        for r in sorted(rows.values(), key=lambda r: (r["doc_id"], r["ord"])):
            by_doc.setdefault(r["doc_id"], []).append(r["text"])
        out = {}
        for pid, cids, types, terms in zip(paths["path_id"], paths["chunk_ids"], paths["edge_types"], paths["edge_terms"]):
            rs = [rows[c] for c in cids]
            docs = list(dict.fromkeys(r["doc_id"] for r in rs))
            doc_texts = by_doc[docs[0]] if len(docs) == 1 else [t for d in docs for t in by_doc[d]]  # one shared list per document
            out[pid] = PathContext(pid, list(cids), [r["doc_id"] for r in rs], [r["title"] for r in rs], [r["text"] for r in rs],
                                   [list(r["entities"]) for r in rs], [list(r["keyphrases"]) for r in rs], [list(t) for t in terms], list(types), doc_texts)
        return out

    # -- stage 3: answer-first generation ---------------------------------------------------
    def stage3(self) -> dict[str, Any]:
        """One generator call per path."""
        t0 = time.perf_counter()
        log = CallLog()
        cands = [self.generator.generate(ctx, 0, None, log) for ctx in self._contexts().values()]
        _write(_rows_to_table([c.to_row() for c in cands]), self.out / "stage3_candidates.parquet")
        _write(_calls_table(log), self.out / "stage3_calls.parquet")
        self._timed("stage3", t0)
        return {"n_candidates": len(cands), "generation_failures": sum(c.status == "discarded" for c in cands), "generator": getattr(self.generator, "name", "")}

    def _candidates(self, name: str) -> list[Candidate]:
        fields = {f.name for f in dataclasses.fields(Candidate)}
        return [Candidate(**{k: v for k, v in row.items() if k in fields}) for row in pq.read_table(self.out / name).to_pylist()]

    # -- stage 4: verification and the gate --------------------------------------------------
    def stage4(self, backends: dict[str, Any] | None = None) -> dict[str, Any]:
        """Verify (the verifier's checks, then hidden-bridge, single-passage and retrieval-shortcut checks against
        ``backends`` searched with the question alone) with one targeted regeneration, then the final gate."""
        t0 = time.perf_counter()
        log = CallLog()
        ctxs = self._contexts()
        cfg = self.config
        chain_checks = ChainChecks(backends, cfg.shortcut_k, cfg.single_passage_overlap)
        cands = verify_candidates(self._candidates("stage3_candidates.parquet"), ctxs, self.verifier, self.generator, log, chain_checks)
        verified = sum(c.status == "verified" for c in cands)
        texts = {cid: r["text"] for cid, r in self._chunk_rows().items()}
        cands = answerability_gate(cands, texts, cfg.max_answer_words, cfg.near_duplicate, cfg.max_same_answer)
        _write(_rows_to_table([c.to_row() for c in cands]), self.out / "stage4_verified.parquet")
        _write(_calls_table(log), self.out / "stage4_calls.parquet")
        self._timed("stage4", t0)
        kept = sum(c.status == "kept" for c in cands)
        return {"n_attempts": len(cands), "verified": verified, "kept": kept, "regenerations": sum(c.attempt > 0 for c in cands),
                "checks_fired": dict(sorted(chain_checks.fired.items())), "shortcut_backends": sorted(chain_checks.backends)}

    # -- stage 5: difficulty --------------------------------------------------------------
    def stage5(self, chunk_vectors: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """Hop x retrieval-difficulty matrix (power mean p=-3 of question-to-gold cosine); optional balancing."""
        t0 = time.perf_counter()
        log = CallLog()
        kept = [r for r in pq.read_table(self.out / "stage4_verified.parquet").to_pylist() if r["status"] == "kept"]
        if not kept:
            raise SynthesisError("no candidate survived verification and the answerability gate; see stage4_verified.parquet discard_reason")
        embedder = self._embedder()
        rows = self._chunk_rows()
        if chunk_vectors is None:
            needed = sorted({c for r in kept for c in r["gold_chunk_ids"]})
            t_emb = time.perf_counter()
            chunk_vectors = dict(zip(needed, encode_texts(embedder, [rows[c]["text"] for c in needed])))
            log.record("stage5_embed", "embed_gold_chunks", LLMResponse("", _name(embedder), 0, 0, time.perf_counter() - t_emb, 0.0))
        t_emb = time.perf_counter()
        qvecs = encode_texts(embedder, [r["question"] for r in kept])
        np.savez(self.out / "stage5_question_vectors.npz", questions=np.array([r["question"] for r in kept]), vectors=np.asarray(qvecs, dtype=np.float32))
        log.record("stage5_embed", "embed_questions", LLMResponse("", _name(embedder), 0, 0, time.perf_counter() - t_emb, 0.0))
        cfg = self.config
        kept = assign_difficulty(kept, qvecs, lambda c: chunk_vectors[c], (cfg.min_hops, cfg.max_hops), cfg.power_p)
        matrix_before = difficulty_matrix(kept, (cfg.min_hops, cfg.max_hops))
        if cfg.balance:
            kept = balanced_resample(kept, cfg.per_cell, cfg.seed)
        _write(_rows_to_table(kept), self.out / "stage5_difficulty.parquet")
        _write(_calls_table(log), self.out / "stage5_calls.parquet")
        self._timed("stage5", t0)
        return {"n_items": len(kept), "matrix": difficulty_matrix(kept, (cfg.min_hops, cfg.max_hops)), "matrix_before_balance": matrix_before}

    # -- stage 6: report, split, outputs -----------------------------------------------------
    def stage6(self) -> PipelineResult:
        """Quality report, leakage-safe split, dataset_grpo.jsonl, dataset_all, metrics.json, manifest.json."""
        t0 = time.perf_counter()
        cfg = self.config
        items = pq.read_table(self.out / "stage5_difficulty.parquet").to_pylist()
        allc = pq.read_table(self.out / "stage4_verified.parquet").to_pylist()
        rows = self._chunk_rows()
        for r in items:
            r["chain"] = chain_of(r)
            r["answer_type"] = r.get("answer_type") or r.get("answer_kind") or ""
        train, val, split_report = split_by_gold_chunks(items, cfg.val_fraction, cfg.seed, cfg.split_tolerance, cfg.min_val_documents)
        for r in train:
            r["split"] = "train"
        for r in val:
            r["split"] = "validation"
        split_of = {r["candidate_id"]: r["split"] for r in train + val}
        for r in allc:
            r["split"] = split_of.get(r["candidate_id"], "")
        report = _quality_report(train + val, rows)
        paths = len({r["path_id"] for r in allc})
        verified_paths = len({r["path_id"] for r in allc if r["status"] == "kept" or r["discard_reason"].startswith("gate:")})
        reasons = Counter(r["discard_reason"].split(":")[0].split(" (")[0] for r in allc if r["status"] == "discarded")
        last: dict[str, dict[str, Any]] = {}
        for r in allc:  # each path's final attempt: why the paths that yielded no item were lost
            if r["path_id"] not in last or r["attempt"] >= last[r["path_id"]]["attempt"]:
                last[r["path_id"]] = r
        final_reasons = Counter(r["discard_reason"].split(":")[0].split(" (")[0] for r in last.values() if r["status"] == "discarded")
        funnel = {"candidates": paths, "verified": verified_paths, "gated": len(train) + len(val)}
        calls = CallLog()
        for name in sorted(self.out.glob("stage*_calls.parquet")):
            calls.rows.extend(pq.read_table(name).to_pylist())
        metrics = {
            "funnel": funnel,
            "discard_reasons": dict(sorted(reasons.items())),
            "path_loss_reasons": dict(sorted(final_reasons.items())),
            "quality": report,
            "difficulty_matrix": difficulty_matrix(train + val, (cfg.min_hops, cfg.max_hops)),
            "hops": dict(sorted(Counter(str(r["hops"]) for r in train + val).items())),
            "answer_types": dict(sorted(Counter(r["answer_type"] for r in train + val).items())),
            "validation_hops": dict(sorted(Counter(str(r["hops"]) for r in val).items())),
            "unique_answers": len({normalise_answer(r["answer"]) for r in train + val}),
            "thresholds": {"min_unique_answers": cfg.min_unique_answers, "min_answer_types": cfg.min_answer_types, "min_val_documents": cfg.min_val_documents},
            "split": split_report.to_dict(),
            "calls": calls.summary(),
        }
        with open(self.out / "dataset_grpo.jsonl", "w", encoding="utf-8") as fh:
            for r in sorted(train + val, key=lambda r: (r["split"], r["qa_id"])):
                fh.write(json.dumps({"qa_id": r["qa_id"], "split": r["split"], "prompt": r["question"], "answer": r["answer"], "answer_type": r["answer_type"],
                                     "answer_chunk_id": r["answer_chunk_id"], "gold_path": r["gold_chunk_ids"], "gold_chunk_ids": r["gold_chunk_ids"], "hops": r["hops"],
                                     "doc_ids": r["doc_ids"], "chain": r["chain"], "difficulty": r["difficulty"], "difficulty_cell": r["difficulty_cell"]}) + "\n")
        table = _rows_to_table(allc)
        _write(table, self.out / "dataset_all.parquet")
        table.drop_columns([c for c in table.column_names if pa.types.is_list(table.schema.field(c).type)]).to_pandas().assign(
            gold_chunk_ids=[";".join(r["gold_chunk_ids"]) for r in allc]).to_csv(self.out / "dataset_all.csv", index=False)
        from agenttune_lib.rag.audit import audit_markdown, audit_sample

        sample = audit_sample(train + val, 20)
        (self.out / "audit_sample.md").write_text(audit_markdown(sample, {cid: r["text"] for cid, r in rows.items()}, allc), encoding="utf-8")
        metrics["audit_sample"] = [r["qa_id"] for r in sample]
        (self.out / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
        self._timed("stage6", t0)
        version = hashlib.sha256("|".join(sorted(f"{r['qa_id']}:{r['split']}" for r in train + val)).encode()).hexdigest()[:16]
        manifest = {
            "dataset_version": version,
            "config": cfg.fingerprint(),
            "generator": getattr(self.generator, "name", ""),
            "verifier": getattr(self.verifier, "name", ""),
            "annotator": getattr(self.annotator, "name", ""),
            "embedder": _name(self.embedder) if self.embedder is not None else "",
            "timings_s": self.timings,
            "files": {p.name: _sha(p) for p in sorted(self.out.iterdir()) if p.is_file() and p.name != "manifest.json"},
        }
        (self.out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        metrics["dataset_version"] = version
        return PipelineResult(self.out, metrics, train, val)


def _quality_report(items: Sequence[dict[str, Any]], rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Answerability, faithfulness, diversity and coverage of the final items."""
    n = len(items)
    if not n:
        return {"n": 0}
    answerable = sum(answer_in(r["answer"], "\n".join(rows[c]["text"] for c in r["gold_chunk_ids"])) for r in items)
    faithful = 0
    for r in items:
        texts = [rows[c]["text"] for c in r["gold_chunk_ids"]]
        ok = answer_in(r["answer"], r.get("evidence") or "") and answer_in(r["answer"], texts[-1])  # hop order: the answer passage is last
        for i, term in enumerate([t for t in r.get("bridge_terms") or [] if t][: len(texts) - 1]):
            key = term_key(term)
            ok = ok and f" {key} " in f" {term_key(texts[i])} " and f" {key} " in f" {term_key(texts[i + 1])} "
        faithful += ok
    bigrams = [tuple(q.lower().split()[i : i + 2]) for q in (r["question"] for r in items) for i in range(max(0, len(q.split()) - 1))]
    gold = {c for r in items for c in r["gold_chunk_ids"]}
    docs = {rows[c]["doc_id"] for c in gold}
    return {
        "n": n,
        "answerability": answerable / n,
        "faithfulness": faithful / n,
        "diversity_distinct2": len(set(bigrams)) / max(1, len(bigrams)),
        "diversity_unique_answers": len({normalise_answer(r["answer"]) for r in items}) / n,
        "coverage_chunks": len(gold) / max(1, len(rows)),
        "coverage_docs": len(docs) / max(1, len({r["doc_id"] for r in rows.values()})),
    }


def run_pipeline(
    documents: Sequence[Any],
    out_dir: str | Path,
    llm: LLMClient | None = None,
    embedder: Any = None,
    config: SynthesisConfig = SynthesisConfig(),
    cache_dir: str | Path | None = None,
    generator: Any = None,
    verifier: Any = None,
    annotator: Any = None,
    backends: dict[str, Any] | None = None,
) -> PipelineResult:
    """All six stages over documents (objects or dicts with doc_id, title, text) or ready Chunks. Without
    ``backends`` the retrieval-shortcut check searches a BM25 + dense index built under ``out_dir/index``."""
    docs = list(documents)
    if docs and all(isinstance(d, Chunk) for d in docs):
        chunks, skipped = docs, []
    else:
        chunks, skipped = chunk_documents(docs, config.chunking)
    pipe = SynthesisPipeline(out_dir, config, llm, embedder, generator, verifier, annotator, cache_dir)
    stats = {"skipped_documents": [s.message() for s in skipped], "stage1": pipe.stage1(chunks)}
    stats["stage2"] = pipe.stage2()
    stats["stage3"] = pipe.stage3()
    if backends is None and config.shortcut_backends:
        from agenttune_lib.rag.backends import build_index, load_backend

        index = pipe.out / "index"
        build_index(chunks, index, pipe._embedder(), kinds=tuple(k for k in ("bm25", "dense") if k in config.shortcut_backends or "hybrid" in config.shortcut_backends))
        backends = {k: load_backend(index, k, embedder=pipe._embedder()) for k in config.shortcut_backends}
    stats["stage4"] = pipe.stage4(backends)
    stats["stage5"] = pipe.stage5()
    result = pipe.stage6()
    result.metrics["stages"] = stats
    return result
