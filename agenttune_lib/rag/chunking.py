"""Content-addressed chunking: document and chunk ids derive from text, so lineage survives re-ingestion."""
from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["Chunk", "ChunkingConfig", "SkippedDocument", "chunk_documents", "chunk_id_for", "chunk_text", "doc_id_for"]

_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+(?=[\"'(\[]?[A-Z0-9])")


def doc_id_for(text: str) -> str:
    """The sha256 of a document's text: the same id the corpus asset writes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunk_id_for(doc_key: str, text: str, occurrence: int = 0) -> str:
    """Content-addressed chunk id: a hash of the document's stable key (its path or title, not its text hash),
    the chunk text and which repeat of that text in the document it is. An edit elsewhere in the document
    changes neither, so QA items pointing at untouched chunks survive re-ingestion of the edited document."""
    return "ch-" + hashlib.sha256(f"{doc_key}\x1f{occurrence}\x1f{text}".encode("utf-8")).hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class ChunkingConfig:
    """Paragraph-packing chunker bounds, in characters."""

    max_chars: int = 1200
    min_chars: int = 80


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One retrievable passage of a document."""

    chunk_id: str
    doc_id: str
    ord: int
    text: str
    title: str = ""
    path: str = ""

    def to_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SkippedDocument:
    """A document the chunker could not use, and why."""

    doc_id: str
    path: str
    reason: str

    def message(self) -> str:
        return f"{self.path or self.doc_id}: {self.reason}"


def _normalise(text: str) -> str:
    lines = [re.sub(r"[ \t\f\v]+", " ", line).strip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _pieces(paragraph: str, max_chars: int) -> list[str]:
    if len(paragraph) <= max_chars:
        return [paragraph]
    out: list[str] = []
    current = ""
    for sentence in _SENTENCE_END.split(paragraph):
        while len(sentence) > max_chars:  # a run-on sentence: cut at the last space before the limit
            cut = sentence.rfind(" ", 0, max_chars)
            cut = cut if cut > max_chars // 2 else max_chars
            if current:
                out.append(current)
                current = ""
            out.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if current and len(current) + 1 + len(sentence) > max_chars:
            out.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}".strip()
    if current:
        out.append(current)
    return out


def chunk_text(text: str, config: ChunkingConfig = ChunkingConfig()) -> list[str]:
    """Pack paragraphs (split further at sentences when long) into chunks of at most ``max_chars``."""
    pieces: list[str] = []
    for paragraph in re.split(r"\n\s*\n", _normalise(text)):
        paragraph = " ".join(paragraph.split())
        if paragraph:
            pieces.extend(_pieces(paragraph, config.max_chars))
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + 2 + len(piece) > config.max_chars:
            chunks.append(current)
            current = piece
        else:
            current = f"{current}\n\n{piece}" if current else piece
    if current:
        if chunks and len(current) < config.min_chars and len(chunks[-1]) + 2 + len(current) <= config.max_chars * 1.25:
            chunks[-1] = f"{chunks[-1]}\n\n{current}"
        else:
            chunks.append(current)
    return chunks


def _attr(doc: Any, name: str, default: Any = "") -> Any:
    if isinstance(doc, dict):
        return doc.get(name, default)
    return getattr(doc, name, default)


def document_problem(text: Any) -> str | None:
    """Why a document's text cannot be chunked, or None."""
    if not isinstance(text, str):
        return f"text is {type(text).__name__}, not str"
    if "\x00" in text:
        return "binary content (NUL bytes in text)"
    if "\ufffd" in text and text.count("\ufffd") > max(3, len(text) // 100):
        return "unreadable encoding (many U+FFFD replacement characters)"
    if not text.strip():
        return "no text (empty or whitespace only)"
    return None


def chunk_documents(documents: Iterable[Any], config: ChunkingConfig = ChunkingConfig()) -> tuple[list[Chunk], list[SkippedDocument]]:
    """Chunk every usable document; each unusable one is skipped with a reason naming it."""
    chunks: list[Chunk] = []
    skipped: list[SkippedDocument] = []
    seen: set[str] = set()
    for doc in documents:
        text = _attr(doc, "text", None)
        path = str(_attr(doc, "path", "") or "")
        doc_id = str(_attr(doc, "doc_id", "") or (doc_id_for(text) if isinstance(text, str) else ""))
        problem = document_problem(text)
        if problem is None and doc_id in seen:
            problem = "duplicate of an earlier document with the same text"
        if problem is not None:
            skipped.append(SkippedDocument(doc_id, path, problem))
            continue
        seen.add(doc_id)
        title = str(_attr(doc, "title", "") or path or doc_id[:12])
        doc_key = path or title or doc_id
        repeats: dict[str, int] = {}
        for ord, piece in enumerate(chunk_text(text, config)):
            occurrence = repeats.get(piece, 0)
            repeats[piece] = occurrence + 1
            chunks.append(Chunk(chunk_id_for(doc_key, piece, occurrence), doc_id, ord, piece, title, path))
    return chunks, skipped
