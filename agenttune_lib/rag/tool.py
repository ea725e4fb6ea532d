"""SearchCorpusTool: a BaseTool over any SearchBackend, passed straight to the spine and the trainer."""
from __future__ import annotations

from typing import Any

from agenttune_lib.tools.base import BaseTool, ToolError

__all__ = ["SearchCorpusTool"]


class SearchCorpusTool(BaseTool):
    """Searches the document corpus and returns the top passages with their chunk ids."""

    name = "search_corpus"
    description = (
        "Search the document corpus. Returns the most relevant passages, each with its chunk id and "
        "document title. Use short keyword queries; search again with different words if needed."
    )

    #: A result's passage is never cut shorter than this, however many results share the budget.
    MIN_RESULT_CHARS = 160

    def __init__(self, backend: Any, k: int = 5, max_chars: int = 1200, name: str | None = None) -> None:
        """``max_chars`` is the passage-text budget of one call, shared by its results: k=5 shows five snippets,
        k=1 one whole passage (a chunk is at most 1,200 characters), so a narrow search can read its passage."""
        self.backend = backend
        self.k = k
        self.max_chars = max_chars
        if name:
            self.name = name
        self.parameters = {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what to search for"},
                "k": {"type": "integer", "minimum": 1, "maximum": 20, "description": f"number of passages (default {k})"},
            },
            "required": ["query"],
            "additionalProperties": False,
        }

    def execute(self, query: str, k: int | None = None) -> dict[str, Any]:
        if not isinstance(query, str) or not query.strip():
            raise ToolError("query must be a non-empty string", type="invalid_arguments")
        hits = self.backend.search(query.strip(), int(k or self.k))
        per = max(self.MIN_RESULT_CHARS, self.max_chars // max(len(hits), 1))
        return {
            "query": query,
            "results": [
                {
                    "chunk_id": h["chunk_id"],
                    "doc_id": h["doc_id"],
                    "title": h.get("title", ""),
                    "score": round(float(h["score"]), 4),
                    "text": h["text"][:per],
                }
                for h in hits
            ],
        }

    def retrieved_chunk_ids(self, result: dict[str, Any]) -> list[str]:
        """The chunk ids in one execute() result, for evidence rewards and lineage."""
        return [r["chunk_id"] for r in result.get("results", [])]
