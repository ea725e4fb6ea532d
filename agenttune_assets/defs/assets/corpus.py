"""[corpus] corpus_documents: the legal texts every downstream asset is built from."""

import collections

import dagster as dg

from agenttune_assets.defs.resources import WarehouseResource
from agenttune_lib.corpus import CorpusConfig, CorpusError, load_corpus, write_documents


class CorpusDocumentsConfig(dg.Config):
    """Which documents make the corpus (default: licensedcode's commercial agreements)."""

    categories: list[str] = ["Commercial"]
    license_keys: list[str] = []
    limit: int | None = None
    folder: str | None = None
    include_licensedcode: bool = True


@dg.asset(group_name="corpus", pool="warehouse", kinds={"duckdb"})
def corpus_documents(context: dg.AssetExecutionContext, config: CorpusDocumentsConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Legal texts from the licensedcode-data package plus an optional bring-your-own folder, content-addressed."""
    try:
        loaded = load_corpus(
            CorpusConfig(config.categories, config.license_keys, config.limit, config.folder, config.include_licensedcode)
        )
    except CorpusError as exc:
        raise dg.Failure(description=str(exc)) from exc
    for problem in loaded.problems:
        context.log.warning(f"skipped {problem}")
    written = write_documents(warehouse.get(), loaded.documents, run_id=context.run_id)
    by_cat = collections.Counter((d.source, d.category or "-") for d in loaded.documents)
    rows = [dg.TableRecord({"source": s, "category": c, "documents": n}) for (s, c), n in sorted(by_cat.items())]
    problems_md = "\n".join(f"- `{p.path}`: {p.reason}" for p in loaded.problems[:50]) or "none"
    return dg.MaterializeResult(
        metadata={
            "documents": dg.MetadataValue.int(written),
            "characters": dg.MetadataValue.int(sum(len(d.text) for d in loaded.documents)),
            "by_category": dg.MetadataValue.table(
                rows,
                schema=dg.TableSchema(
                    columns=[dg.TableColumn("source", "string"), dg.TableColumn("category", "string"), dg.TableColumn("documents", "int")]
                ),
            ),
            "skipped": dg.MetadataValue.md(problems_md),
            "sample": dg.MetadataValue.md(
                "\n".join(f"- **{d.title}** (`{d.doc_id[:12]}`, {len(d.text)} chars)" for d in loaded.documents[:10])
            ),
        },
        data_version=dg.DataVersion(_corpus_version([d.doc_id for d in loaded.documents])),
    )


def _corpus_version(doc_ids: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(sorted(doc_ids)).encode()).hexdigest()[:16]
