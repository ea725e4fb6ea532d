"""[corpus] Chunks, the retrieval index, the knowledge graph and the six-stage QA synthesis, to train/validation splits."""

import base64

import dagster as dg

from agenttune_assets.defs.resources import ArtifactsResource, WarehouseResource
from agenttune_lib.corpus import read_documents
from agenttune_lib.rag.chunking import ChunkingConfig
from agenttune_lib.rag.synthesis.pipeline import SynthesisConfig, SynthesisError
from agenttune_lib.rag.workflow import RagPaths, funnel_png, make_llm, run_candidates, run_chunks, run_graph, run_index, run_splits, run_verified


class ChunkingSettings(dg.Config):
    """Paragraph-packing chunk bounds in characters."""

    max_chars: int = 1200
    min_chars: int = 80


class SynthesisSettings(dg.Config):
    """Generator and stage knobs; the default is the deterministic extractive generator (no model)."""

    generator: str = "extractive"  # extractive | openai | transformers
    llm_base_url: str = ""
    llm_model: str = ""
    llm_model_path: str = ""
    min_hops: int = 2
    max_hops: int = 5
    max_candidates: int = 1500
    paths_per_source: int = 1
    balance: bool = False
    val_fraction: float = 0.2
    min_val_documents: int = 10
    min_unique_answers: int = 150
    min_answer_types: int = 5
    seed: int = 0

    def to_lib(self) -> SynthesisConfig:
        return SynthesisConfig(min_hops=self.min_hops, max_hops=self.max_hops, max_candidates=self.max_candidates, paths_per_source=self.paths_per_source,
                               balance=self.balance, val_fraction=self.val_fraction, min_val_documents=self.min_val_documents,
                               min_unique_answers=self.min_unique_answers, min_answer_types=self.min_answer_types, seed=self.seed)

    def llm(self):
        return make_llm(self.generator, self.llm_base_url, self.llm_model, self.llm_model_path)


def _md_table(header: list[str], rows: list[list]) -> str:
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _audit(paths: RagPaths) -> str:
    """The 20-item audit sample stage 6 wrote (question, chain with bridges in bold, answer span, verdicts)."""
    path = paths.synthesis / "audit_sample.md"
    return path.read_text(encoding="utf-8") if path.exists() else "no audit sample written"


def _failure(exc: Exception) -> dg.Failure:
    return dg.Failure(description=str(exc))


@dg.asset(group_name="corpus", deps=["corpus_documents"], pool="warehouse", kinds={"parquet", "duckdb"})
def corpus_chunks(context: dg.AssetExecutionContext, config: ChunkingSettings, warehouse: WarehouseResource, artifacts: ArtifactsResource) -> dg.MaterializeResult:
    """Content-addressed chunks of the current corpus (chunks.parquet and the warehouse ``chunks`` table)."""
    paths = RagPaths.under(artifacts.get())
    wh = warehouse.get()
    documents = read_documents(wh)
    if not documents:
        raise dg.Failure(description=f"warehouse {wh.path} has no documents; materialize corpus_documents first")
    try:
        stats = run_chunks(documents, paths, wh, ChunkingConfig(config.max_chars, config.min_chars), run_id=context.run_id)
    except ValueError as exc:
        raise _failure(exc) from exc
    for message in stats["skipped"]:
        context.log.warning(f"skipped document {message}")
    return dg.MaterializeResult(
        metadata={
            "documents": stats["n_documents"], "chunks": stats["n_chunks"], "mean_chars": round(stats["mean_chars"], 1),
            "skipped": dg.MetadataValue.md("\n".join(f"- {m}" for m in stats["skipped"]) or "none"),
            "path": dg.MetadataValue.path(str(paths.chunks)),
        },
        data_version=dg.DataVersion(stats["chunk_set"]),
    )


class RetrievalIndexSettings(dg.Config):
    """Dense encoder truncation in tokens: 384 embeds whole chunks (99.9% of the default corpus's 1,200-character
    chunks fit; 128 cut 86% of them); the truncated share is recorded in the index metadata."""

    max_seq_length: int = 384


@dg.asset(group_name="corpus", deps=["corpus_chunks"], kinds={"numpy"})
def retrieval_index(context: dg.AssetExecutionContext, config: RetrievalIndexSettings, artifacts: ArtifactsResource) -> dg.MaterializeResult:
    """BM25 (bm25s) and dense (all-MiniLM-L6-v2) indexes over the chunks; hybrid fuses them by RRF at query time."""
    from agenttune_lib.rag.embedding import SentenceTransformerEmbedder

    paths = RagPaths.under(artifacts.get())
    stats = run_index(paths, SentenceTransformerEmbedder(max_seq_length=config.max_seq_length))
    return dg.MaterializeResult(
        metadata={
            "chunks": stats["n_chunks"], "bm25_build_s": stats.get("bm25_build_s", 0.0), "dense_build_s": stats.get("dense_build_s", 0.0),
            "max_seq_length": stats.get("max_seq_length", config.max_seq_length), "chunks_truncated": stats.get("n_truncated", 0),
            "share_truncated": stats.get("share_truncated", 0.0),
            "backends": "bm25, dense, hybrid (RRF k=60)", "path": dg.MetadataValue.path(str(paths.index)),
        },
        data_version=dg.DataVersion(stats["chunk_set"]),
    )


@dg.asset(group_name="corpus", deps=["corpus_chunks", "retrieval_index"], kinds={"networkx", "parquet"})
def knowledge_graph(context: dg.AssetExecutionContext, config: SynthesisSettings, artifacts: ArtifactsResource) -> dg.MaterializeResult:
    """Stage 1: per-chunk entities/keyphrases/summary and a typed graph (exact, contextual, abstract edges); cached."""
    paths = RagPaths.under(artifacts.get())
    try:
        stats = run_graph(paths, config.to_lib(), config.llm())
    except (SynthesisError, ValueError) as exc:
        raise _failure(exc) from exc
    return dg.MaterializeResult(metadata={**{k: v for k, v in stats.items() if isinstance(v, (int, str))}, "path": dg.MetadataValue.path(str(paths.synthesis))})


@dg.asset(group_name="corpus", deps=["knowledge_graph"], kinds={"parquet"})
def qa_candidates(context: dg.AssetExecutionContext, config: SynthesisSettings, artifacts: ArtifactsResource) -> dg.MaterializeResult:
    """Stages 2-3: bounded 2-5 hop paths inside documents and one answer-first generation per path."""
    paths = RagPaths.under(artifacts.get())
    try:
        stats = run_candidates(paths, config.to_lib(), config.llm())
    except (SynthesisError, ValueError) as exc:
        raise _failure(exc) from exc
    meta = {**stats["stage2"], **stats["stage3"]}
    return dg.MaterializeResult(metadata={k: v for k, v in meta.items() if isinstance(v, (int, str))})


@dg.asset(group_name="corpus", deps=["qa_candidates", "retrieval_index"], kinds={"parquet"})
def qa_verified(context: dg.AssetExecutionContext, config: SynthesisSettings, artifacts: ArtifactsResource) -> dg.MaterializeResult:
    """Stages 4-5: answerability, chain-dependency and retrieval-necessity checks with one regeneration, the
    answerability gate, and the hop x retrieval-difficulty matrix."""
    paths = RagPaths.under(artifacts.get())
    try:
        stats = run_verified(paths, config.to_lib(), config.llm())
    except (SynthesisError, ValueError) as exc:
        raise _failure(exc) from exc
    matrix = stats["stage5"]["matrix"]
    levels = ["easy", "medium", "hard"]
    return dg.MaterializeResult(
        metadata={
            **{k: v for k, v in stats["stage4"].items() if isinstance(v, int)},
            "difficulty_matrix": dg.MetadataValue.md(_md_table(["hops", *levels], [[h, *[row[lv] for lv in levels]] for h, row in matrix.items()])),
        }
    )


@dg.asset(group_name="corpus", deps=["qa_verified", "retrieval_index"], pool="warehouse", kinds={"parquet", "duckdb"})
def qa_splits(context: dg.AssetExecutionContext, config: SynthesisSettings, warehouse: WarehouseResource, artifacts: ArtifactsResource) -> dg.MaterializeResult:
    """Stage 6: quality report, gold-chunk-disjoint train/validation split, dataset_grpo.jsonl, the warehouse
    ``qa_items`` table, and retrieval metrics per backend."""
    paths = RagPaths.under(artifacts.get())
    try:
        metrics = run_splits(paths, warehouse.get(), config.to_lib())
    except (SynthesisError, ValueError) as exc:
        raise _failure(exc) from exc
    split = metrics["split"]
    if split["degenerate"]:
        context.log.warning(f"degenerate split: {split['reason']}")
    funnel = metrics["funnel"]
    png = base64.b64encode(funnel_png(funnel)).decode()
    levels = ["easy", "medium", "hard"]
    retrieval = metrics["retrieval"]["all"]
    k = next(iter(retrieval.values()))["k"]
    return dg.MaterializeResult(
        metadata={
            "funnel": dg.MetadataValue.md(f"![funnel](data:image/png;base64,{png})\n\n" + _md_table(["stage", "questions"], [[s, n] for s, n in funnel.items()])),
            "discard_reasons": dg.MetadataValue.json(metrics["discard_reasons"]),
            "difficulty_matrix": dg.MetadataValue.md(_md_table(["hops", *levels], [[h, *[row[lv] for lv in levels]] for h, row in metrics["difficulty_matrix"].items()])),
            "retrieval_metrics": dg.MetadataValue.md(
                _md_table(["backend", f"R@{k}", f"ans@{k}", f"Doc@{k}", f"gold recall@{k}", "reachability", "ms/query"],
                          [[b, m[f"R@{k}"], m[f"ans@{k}"], m[f"doc@{k}"], m[f"gold_recall@{k}"], m["reachability"], m["query_latency_ms"]] for b, m in retrieval.items()])
                + f"\n\nperfect-retrieval reachability: {next(iter(retrieval.values()))['reachability_perfect']:.3f}"
            ),
            "path_loss_reasons": dg.MetadataValue.json(metrics.get("path_loss_reasons", {})),
            "answer_types": dg.MetadataValue.json(metrics.get("answer_types", {})),
            "hops": dg.MetadataValue.json(metrics.get("hops", {})),
            "validation_hops": dg.MetadataValue.json(metrics.get("validation_hops", {})),
            "validation_documents": split.get("val_documents", 0),
            "unique_answers": metrics.get("unique_answers", 0),
            "audit_sample": dg.MetadataValue.md(_audit(paths)),
            "quality": dg.MetadataValue.json(metrics["quality"]),
            "train": split["n_train"], "validation": split["n_val"], "degenerate": split["degenerate"],
            "split_report": dg.MetadataValue.json(split),
            "dataset_version": metrics["dataset_version"],
            "dataset_grpo": dg.MetadataValue.path(str(paths.synthesis / "dataset_grpo.jsonl")),
        },
        data_version=dg.DataVersion(metrics["dataset_version"]),
    )
