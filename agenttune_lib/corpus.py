"""Corpus ingest: the packaged licensedcode legal texts and a bring-your-own-documents folder.

Documents are content-addressed (sha256 of the text), so their ids survive re-ingestion
and row-level lineage can point at them across runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

FOLDER_SUFFIXES = (".txt", ".md", ".json")
DOCUMENT_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("source", pa.string()),
        ("path", pa.string()),
        ("title", pa.string()),
        ("category", pa.string()),
        ("text", pa.string()),
        ("n_chars", pa.int64()),
        ("metadata", pa.string()),
        ("run_id", pa.string()),
        ("ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclasses.dataclass(frozen=True)
class Document:
    """One corpus document; ``doc_id`` is the sha256 of its text."""

    doc_id: str
    source: str
    path: str
    title: str
    category: str
    text: str
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def create(cls, text: str, source: str, path: str, title: str = "", category: str = "", metadata: dict[str, Any] | None = None) -> "Document":
        return cls(doc_id=content_id(text), source=source, path=path, title=title or Path(path).stem, category=category, text=text, metadata=dict(metadata or {}))


@dataclasses.dataclass(frozen=True)
class CorpusProblem:
    """A file that was skipped, and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclasses.dataclass
class CorpusConfig:
    """Which documents make the corpus: licensedcode categories (default the commercial agreements), a limit, a folder."""

    categories: Sequence[str] = ("Commercial",)
    license_keys: Sequence[str] = ()
    limit: int | None = None
    folder: str | None = None
    include_licensedcode: bool = True


@dataclasses.dataclass
class CorpusLoad:
    documents: list[Document]
    problems: list[CorpusProblem]


class CorpusError(ValueError):
    """The corpus as configured has no usable document."""


def content_id(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def licensedcode_dir() -> Path:
    """``licensedcode/data/licenses`` inside the installed licensedcode-data package."""
    spec = importlib.util.find_spec("licensedcode")
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError("the licensedcode-data package is not installed (pip install licensedcode-data==32.1.0)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "licenses"
    if not path.is_dir():
        raise CorpusError(f"licensedcode-data has no licenses folder at {path}")
    return path


def parse_license_file(path: Path) -> Document:
    """A ``.LICENSE`` file: YAML front matter between ``---`` lines, then the text."""
    raw = path.read_text(encoding="utf-8")
    meta: dict[str, Any] = {}
    text = raw
    if raw.startswith("---"):
        _, front, text = raw.split("---", 2)
        meta = yaml.safe_load(front) or {}
    text = text.strip()
    return Document.create(
        text,
        source="licensedcode",
        path=f"licensedcode/{path.name}",
        title=str(meta.get("name") or meta.get("short_name") or path.stem),
        category=str(meta.get("category") or ""),
        metadata={k: meta[k] for k in ("key", "short_name", "owner", "spdx_license_key") if k in meta},
    )


def load_licensedcode(categories: Sequence[str] = ("Commercial",), license_keys: Sequence[str] = (), limit: int | None = None) -> CorpusLoad:
    """The packaged license and agreement texts, filtered by category or key."""
    docs, problems = [], []
    wanted_cats = {c.lower() for c in categories}
    wanted_keys = set(license_keys)
    for path in sorted(licensedcode_dir().glob("*.LICENSE")):
        if wanted_keys and path.stem not in wanted_keys:
            continue
        try:
            doc = parse_license_file(path)
        except (UnicodeDecodeError, yaml.YAMLError, ValueError) as exc:
            problems.append(CorpusProblem(f"licensedcode/{path.name}", f"unreadable: {exc}"))
            continue
        if wanted_cats and "*" not in wanted_cats and doc.category.lower() not in wanted_cats:
            continue
        if not doc.text:
            problems.append(CorpusProblem(doc.path, "no text after the front matter"))
            continue
        docs.append(doc)
        if limit is not None and len(docs) >= limit:
            break
    return CorpusLoad(docs, problems)


def _decode(path: Path, data: bytes) -> str:
    if not data.strip():
        raise ValueError("empty file")
    if b"\x00" in data[:8192]:
        raise ValueError("binary file (contains NUL bytes)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"unreadable encoding: not UTF-8 (byte {exc.start}: {exc.reason})") from None


def _json_documents(path: Path, text: str) -> list[tuple[str, str]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    items = data.get("documents", data) if isinstance(data, dict) else data
    items = [items] if isinstance(items, dict) else items
    if not isinstance(items, list):
        raise ValueError("JSON must be an object with 'text', a list of them, or {'documents': [...]}")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise ValueError(f"JSON document {i} has no string 'text' field")
        out.append((str(item.get("title") or f"{path.stem}#{i}"), item["text"]))
    return out


def load_folder(folder: str | Path) -> CorpusLoad:
    """``.txt``/``.md``/``.json`` documents under ``folder``; bad files become problems, not crashes."""
    root = Path(folder)
    if not root.is_dir():
        raise CorpusError(f"document folder {root} does not exist or is not a directory")
    docs, problems = [], []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = str(path.relative_to(root))
        if path.suffix.lower() not in FOLDER_SUFFIXES:
            problems.append(CorpusProblem(rel, f"unsupported file type {path.suffix or '(none)'}; expected one of {FOLDER_SUFFIXES}"))
            continue
        try:
            text = _decode(path, path.read_bytes())
            entries = _json_documents(path, text) if path.suffix.lower() == ".json" else [(path.stem, text)]
        except (ValueError, OSError) as exc:
            problems.append(CorpusProblem(rel, str(exc)))
            continue
        for i, (title, body) in enumerate(entries):
            body = body.strip()
            where = rel if len(entries) == 1 else f"{rel}#{i}"
            if not body:
                problems.append(CorpusProblem(where, "document has no text"))
                continue
            docs.append(Document.create(body, source="folder", path=where, title=title))
    return CorpusLoad(docs, problems)


def load_corpus(config: CorpusConfig | None = None) -> CorpusLoad:
    """Every configured source, de-duplicated by content id; raises if nothing usable is left."""
    config = config or CorpusConfig()
    docs: list[Document] = []
    problems: list[CorpusProblem] = []
    if config.include_licensedcode:
        part = load_licensedcode(config.categories, config.license_keys, config.limit)
        docs += part.documents
        problems += part.problems
    if config.folder:
        part = load_folder(config.folder)
        docs += part.documents
        problems += part.problems
    seen: dict[str, Document] = {}
    for doc in docs:
        if doc.doc_id in seen:
            problems.append(CorpusProblem(doc.path, f"duplicate of {seen[doc.doc_id].path} (same text)"))
            continue
        seen[doc.doc_id] = doc
    if not seen:
        detail = "; ".join(str(p) for p in problems[:5]) or "no source selected any document"
        raise CorpusError(f"the corpus is empty: {detail}")
    return CorpusLoad(list(seen.values()), problems)


def documents_to_arrow(docs: Iterable[Document], run_id: str | None = None) -> pa.Table:
    docs = list(docs)
    now = datetime.now(timezone.utc)
    return pa.Table.from_pydict(
        {
            "doc_id": [d.doc_id for d in docs],
            "source": [d.source for d in docs],
            "path": [d.path for d in docs],
            "title": [d.title for d in docs],
            "category": [d.category for d in docs],
            "text": [d.text for d in docs],
            "n_chars": [len(d.text) for d in docs],
            "metadata": [json.dumps(d.metadata, sort_keys=True, default=str) for d in docs],
            "run_id": [run_id] * len(docs),
            "ingested_at": [now] * len(docs),
        },
        schema=DOCUMENT_SCHEMA,
    )


def write_documents(warehouse: Any, docs: Sequence[Document], run_id: str | None = None) -> int:
    """Upsert documents into the warehouse's ``documents`` table (idempotent on doc_id).

    Earlier documents stay (old trajectories still point at them); the rows this write
    touched become the current corpus.
    """
    return warehouse.upsert_arrow("documents", documents_to_arrow(docs, run_id), key="doc_id")


def read_documents(warehouse: Any, doc_ids: Sequence[str] | None = None, current_only: bool = True) -> list[Document]:
    """Documents back from the warehouse: ``doc_ids``, or the current corpus (the latest write), or all."""
    if not warehouse.has_table("documents"):
        return []
    if doc_ids is None and current_only:
        table = warehouse.query_arrow(
            "SELECT * FROM documents WHERE ingested_at = (SELECT max(ingested_at) FROM documents) ORDER BY path"
        )
    elif doc_ids is None:
        table = warehouse.query_arrow("SELECT * FROM documents ORDER BY path")
    else:
        table = warehouse.query_arrow("SELECT * FROM documents WHERE doc_id IN (SELECT unnest(?)) ORDER BY path", [list(doc_ids)])
    return [
        Document(r["doc_id"], r["source"], r["path"], r["title"], r["category"], r["text"], json.loads(r["metadata"] or "{}"))
        for r in table.to_pylist()
    ]
