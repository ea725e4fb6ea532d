"""QA search over the real index: the policy calls ``search_corpus``; reward = answer match against the gold answer."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["QASearchEnvironment", "qa_search_tasks"]

INSTRUCTIONS = (
    "Answer the user's question about the document corpus. Search it with the search_corpus tool (short keyword "
    "queries), then reply with the answer alone, without a tool call."
)


class QASearchEnvironment:
    """One QA item per episode over a SearchBackend (the platform's index); searches are counted.

    Reward: normalized exact match 1.0, else token F1 of the final answer against the gold answer (0..0.99).
    """

    name = "qa_search"

    def __init__(self, backend: Any = None, k: int = 3, max_chars: int = 400, max_tool_turns: int | None = None) -> None:
        if backend is None:
            raise ValueError("qa_search needs backend= (a SearchBackend, e.g. agenttune_lib.rag.load_backend(index_path, 'bm25'))")
        self.backend = backend
        self.k = k
        self.max_chars = max_chars
        self.max_tool_turns = max_tool_turns
        self.task: dict[str, Any] | None = None
        self.searches = 0

    @classmethod
    def from_index(cls, index_path: str, kind: str = "bm25", **kw: Any) -> "QASearchEnvironment":
        from agenttune_lib.rag import load_backend

        return cls(load_backend(index_path, kind=kind), **kw)

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        missing = [k for k in ("question", "answer") if not task.get(k)]
        if missing:
            raise ValueError(f"qa_search task lacks {missing} (qa_id={task.get('qa_id')!r})")
        self.task = dict(task)
        self.searches = 0
        return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": str(task["question"])}]

    def tools(self) -> list[Any]:
        from agenttune_lib.rag.tool import SearchCorpusTool

        env = self

        class _CountedSearch(SearchCorpusTool):
            def execute(self, query: str, k: int | None = None) -> dict[str, Any]:
                env.searches += 1
                return super().execute(query, k)

        return [_CountedSearch(self.backend, k=self.k, max_chars=self.max_chars)]

    def reward(self, completion: list[dict[str, Any]]) -> float:
        from agenttune_lib.rl.rewards.builtin import answer_correctness_reward

        if self.task is None:
            raise RuntimeError("qa_search: reward before reset(task)")
        return float(answer_correctness_reward([completion], answer=[self.task["answer"]])[0])

    def success(self, completion: list[dict[str, Any]]) -> bool:
        return self.reward(completion) >= 1.0

    def metrics(self, completion: list[dict[str, Any]]) -> dict[str, Any]:
        return {"searches": self.searches}


def qa_search_tasks(warehouse: Any, split: str = "train", limit: int | None = None) -> list[dict[str, Any]]:
    """QA items of ``split`` (``agenttune_lib.rag.load_qa_split``) as environment tasks."""
    from agenttune_lib.rag import load_qa_split

    rows = load_qa_split(warehouse, split)[: limit if limit is not None else None]
    return [{"qa_id": r["qa_id"], "question": r["question"], "answer": r["answer"], "gold_chunk_ids": list(r.get("gold_chunk_ids") or [])} for r in rows]
