"""``agenttune rag``: build the retrieval index, search it, synthesise QA splits and score retrieval."""
from __future__ import annotations

import json

import typer

app = typer.Typer(help="Agentic RAG: chunk + index a corpus, search it, synthesise multi-hop QA splits, score retrieval.", no_args_is_help=True)


def _paths(artifacts: str | None):
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.rag.workflow import RagPaths

    return RagPaths.under(artifacts or PlatformPaths.from_env().ensure().artifacts)


def _warehouse(path: str | None):
    from agenttune_lib.config import PlatformPaths
    from agenttune_lib.warehouse import Warehouse

    return Warehouse(path or PlatformPaths.from_env().ensure().warehouse)


def _documents(categories: list[str], folder: str | None, limit: int | None, keys: list[str] | None = None):
    from agenttune_lib.corpus import CorpusConfig, CorpusError, load_corpus

    keys = [k for k in keys or [] if k]
    categories = [] if keys else categories
    try:
        loaded = load_corpus(CorpusConfig(categories=tuple(categories), license_keys=tuple(keys), folder=folder, limit=limit, include_licensedcode=bool(categories or keys)))
    except CorpusError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    for problem in loaded.problems:
        typer.echo(f"skipped {problem}", err=True)
    return loaded.documents


@app.command()
def index(
    category: list[str] = typer.Option(["Commercial"], help="licensedcode categories (repeat); pass --category '' for none"),
    folder: str = typer.Option(None, help="also ingest a folder of .txt/.md/.json/.csv files"),
    limit: int = typer.Option(None, help="at most this many licensedcode texts"),
    key: list[str] = typer.Option([], help="licensedcode licence keys (repeat); replaces --category"),
    artifacts: str = typer.Option(None, help="artifacts directory (default $AGENTTUNE_HOME/artifacts)"),
    warehouse: str = typer.Option(None, help="warehouse file for the chunks table (default $AGENTTUNE_HOME/warehouse.duckdb)"),
) -> None:
    """Chunk the corpus and build the BM25 and dense indexes (hybrid fuses them at query time)."""
    from agenttune_lib.rag.workflow import run_chunks, run_index

    paths = _paths(artifacts)
    docs = _documents([c for c in category if c], folder, limit, key)
    try:
        stats = run_chunks(docs, paths, _warehouse(warehouse))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    for message in stats["skipped"]:
        typer.echo(f"skipped {message}", err=True)
    built = run_index(paths)
    typer.echo(json.dumps({"documents": stats["n_documents"], "chunks": stats["n_chunks"], **{k: v for k, v in built.items() if k != "chunk_set"}}, indent=1))


@app.command()
def search(
    query: str,
    backend: str = typer.Option("hybrid", help="bm25, dense or hybrid"),
    k: int = typer.Option(5, "-k", help="passages to return"),
    artifacts: str = typer.Option(None, help="artifacts directory holding rag/index"),
) -> None:
    """Search the index and print ranked passages with their chunk ids."""
    from rich.console import Console
    from rich.table import Table

    from agenttune_lib.rag.backends import SearchIndexError, load_backend

    paths = _paths(artifacts)
    try:
        hits = load_backend(paths.index, backend).search(query, k)
    except (SearchIndexError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    table = Table(title=f"{backend}: {query}")
    for col in ("rank", "score", "chunk", "title", "text"):
        table.add_column(col)
    for h in hits:
        table.add_row(str(h["rank"] + 1), f"{h['score']:.3f}", h["chunk_id"][:15], h["title"][:30], " ".join(h["text"].split())[:120])
    Console().print(table)


@app.command()
def synthesize(
    category: list[str] = typer.Option(["Commercial"], help="licensedcode categories (repeat)"),
    folder: str = typer.Option(None, help="also ingest a folder of documents"),
    limit: int = typer.Option(None, help="at most this many licensedcode texts"),
    key: list[str] = typer.Option([], help="licensedcode licence keys (repeat); replaces --category"),
    generator: str = typer.Option("extractive", help="extractive (no model), openai (any OpenAI-compatible endpoint) or transformers (local)"),
    llm_base_url: str = typer.Option("", help="OpenAI-compatible base URL, e.g. http://localhost:8000/v1"),
    llm_model: str = typer.Option("", help="model name at that endpoint"),
    llm_model_path: str = typer.Option("", help="local transformers checkpoint directory"),
    max_candidates: int = typer.Option(1500, help="paths sampled (one candidate each)"),
    val_fraction: float = typer.Option(0.2, help="requested validation fraction"),
    seed: int = typer.Option(0),
    artifacts: str = typer.Option(None, help="artifacts directory (default $AGENTTUNE_HOME/artifacts)"),
    warehouse: str = typer.Option(None, help="warehouse file (chunks and qa_items tables)"),
) -> None:
    """Corpus to QA splits: chunk, index, the six synthesis stages, split, retrieval metrics per backend."""
    from agenttune_lib.rag.synthesis.pipeline import SynthesisConfig, SynthesisError
    from agenttune_lib.rag.workflow import make_llm, run_candidates, run_chunks, run_graph, run_index, run_splits, run_verified

    paths = _paths(artifacts)
    wh = _warehouse(warehouse)
    config = SynthesisConfig(max_candidates=max_candidates, val_fraction=val_fraction, seed=seed)
    try:
        llm = make_llm(generator, llm_base_url, llm_model, llm_model_path)
        stats = run_chunks(_documents([c for c in category if c], folder, limit, key), paths, wh)
        for message in stats["skipped"]:
            typer.echo(f"skipped {message}", err=True)
        run_index(paths)
        run_graph(paths, config, llm)
        run_candidates(paths, config, llm)
        run_verified(paths, config, llm)
        metrics = run_splits(paths, wh, config)
    except (SynthesisError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    summary = {k: metrics[k] for k in ("funnel", "discard_reasons", "answer_types", "hops", "split", "quality", "difficulty_matrix", "dataset_version")}
    summary["retrieval"] = {b: {m: round(v, 4) for m, v in r.items() if isinstance(v, float)} for b, r in metrics["retrieval"]["all"].items()}
    summary["outputs"] = str(paths.synthesis)
    typer.echo(json.dumps(summary, indent=1))


@app.command()
def metrics(
    k: int = typer.Option(8, "-k", help="cut-off for R@k, ans@k, Doc@k and reachability"),
    split: str = typer.Option("validation", help="train, validation or all"),
    artifacts: str = typer.Option(None, help="artifacts directory holding rag/index and rag/synthesis"),
) -> None:
    """Retrieval metrics per backend on a synthesised split (from dataset_grpo.jsonl)."""
    from agenttune_lib.rag.backends import load_backend
    from agenttune_lib.rag.metrics import compare_backends

    paths = _paths(artifacts)
    dataset = paths.synthesis / "dataset_grpo.jsonl"
    if not dataset.exists():
        typer.echo(f"error: no {dataset}; run `agenttune rag synthesize` first", err=True)
        raise typer.Exit(2)
    items = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]
    items = [dict(i, question=i["prompt"]) for i in items if split == "all" or i["split"] == split]
    from agenttune_lib.rag.backends import DenseBackend

    chunks = DenseBackend(paths.index).chunks()
    text, doc = dict(zip(chunks["chunk_id"], chunks["text"])), dict(zip(chunks["chunk_id"], chunks["doc_id"]))
    result = compare_backends({b: load_backend(paths.index, b) for b in ("bm25", "dense", "hybrid")}, items, text, doc, k)
    typer.echo(json.dumps(result, indent=1))


@app.command()
def qa(
    split: str = typer.Argument("train", help="train or validation"),
    limit: int = typer.Option(5, help="items to print"),
    warehouse: str = typer.Option(None, help="warehouse file"),
) -> None:
    """Print QA items of the newest split from the warehouse."""
    from agenttune_lib.rag.splits import load_qa_split

    try:
        rows = load_qa_split(_warehouse(warehouse), split)
    except (LookupError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"{len(rows)} items in {split}")
    for row in rows[:limit]:
        typer.echo(json.dumps({k: row[k] for k in ("qa_id", "hops", "answer_type", "question", "answer", "chain")}, ensure_ascii=False))
