"""QA suite: held-out synthesized questions run as the agent runs them (ReAct with the corpus search tool).

Per item: exact match and containment of the gold answer in the final answer, searches per
question, and Doc@k of the agent's own searches (a gold chunk's document among the first k
chunks its searches returned) — the paper's Tables 9–10 measures. Episodes run in lockstep.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agenttune_lib.evaluation.lockstep import run_lockstep
from agenttune_lib.evaluation.suites.common import SuiteResult, config_hash, decoding_of, policy_stats
from agenttune_lib.tools.base import BaseTool

__all__ = ["QASuiteConfig", "run_qa_suite", "chunk_doc_map", "FINAL_ANSWER_PROMPT"]


#: The last-step request of ``QASuiteConfig.final_answer_turn``.
FINAL_ANSWER_PROMPT = "You have no searches left. Answer the question now in a few words, from the results above."


@dataclasses.dataclass(frozen=True)
class QASuiteConfig:
    """How items run: the agent's own prompt settings (as the collect stage uses them), step budget and Doc@k's k.

    ``hop_steps``: each item gets one search per gold hop plus the answer (``hops + 1`` steps, plus ``step_slack`` up to
    ``max_steps``; never fewer than ``hops + 1``), so an agent that walks the chain as the expert teacher does is not
    cut off before it can answer; an item without ``hops`` gets ``max_steps``. Off: every item gets ``max_steps``.
    """

    max_steps: int = 4
    tool_format: str = "compact"
    max_tool_chars: int | None = 2400
    doc_k: int = 8
    limit: int | None = None
    hop_steps: bool = False
    step_slack: int = 0
    #: Ask for the answer before the last step (``FINAL_ANSWER_PROMPT``): measures whether an agent that keeps
    #: searching can answer from what it found. Off: the last step is prompted like the others.
    final_answer_turn: bool = False

    def __post_init__(self) -> None:
        if self.max_steps < 2:
            raise ValueError(f"max_steps must be >= 2 (one search and one answer), got {self.max_steps}")
        if self.step_slack < 0:
            raise ValueError(f"step_slack must be >= 0, got {self.step_slack}")
        if self.doc_k < 1:
            raise ValueError(f"doc_k must be >= 1, got {self.doc_k}")

    def steps_for(self, item: Mapping[str, Any]) -> int:
        """The step budget of one item (see ``hop_steps``)."""
        hops = item.get("hops")
        if not self.hop_steps or not isinstance(hops, int) or hops < 1:
            return self.max_steps
        return max(2, hops + 1, min(self.max_steps, hops + 1 + self.step_slack))


class _RecordingTool(BaseTool):
    """One episode's view of the shared search tool: serialised calls, and the (chunk, doc) ids it returned."""

    def __init__(self, inner: Any, lock: threading.Lock) -> None:
        self.name, self.description, self.parameters = inner.name, inner.description, inner.parameters
        self.inner, self.lock = inner, lock
        self.hits: list[tuple[str, str]] = []

    def execute(self, **kwargs: Any) -> Any:
        with self.lock:
            out = self.inner.execute(**kwargs)
        if isinstance(out, Mapping):
            self.hits += [(str(r.get("chunk_id")), str(r.get("doc_id"))) for r in out.get("results", [])]
        return out


def chunk_doc_map(search_tool: Any) -> dict[str, str] | None:
    """chunk id -> doc id from the search tool's index (hybrid, BM25 or dense backend); None when it has no chunk table."""
    backend = getattr(search_tool, "backend", None)
    for b in (backend, getattr(backend, "lexical", None), getattr(backend, "dense", None)):
        chunks = getattr(b, "chunks", None) if b is not None else None
        if callable(chunks):
            chunks = chunks()
        if isinstance(chunks, Mapping) and "chunk_id" in chunks and "doc_id" in chunks:
            return dict(zip((str(c) for c in chunks["chunk_id"]), (str(d) for d in chunks["doc_id"])))
    return None


def _final_text(log: Any) -> str:
    from agenttune_lib.events import EventKind

    for e in reversed(list(log)):
        if e.kind is EventKind.TEXT and not e.payload.get("malformed_tool_call"):
            content = e.payload.get("content", "")
            return content if isinstance(content, str) else str(content)
    return ""


def _item_row(item: Mapping[str, Any], log: Any, tool: _RecordingTool, chunk_doc: Mapping[str, str] | None, k: int, evaluator: Any,
              step_budget: int) -> dict[str, Any]:
    from agenttune_lib.events import EventKind
    from agenttune_lib.rag.metrics import answer_in, normalise_answer

    final = _final_text(log)
    gold = str(item["answer"])
    calls = [e for e in log if e.kind is EventKind.TOOL_CALL]
    searches = sum(1 for e in calls if e.payload.get("name") == tool.name)
    errors = [e for e in log if e.is_error]
    # A valid call parsed, named the offered tool with arguments it accepts, and ran: its result is not an error.
    valid_calls = sum(1 for e in log if e.kind is EventKind.TOOL_RESULT and not e.is_error)
    gold_docs = {chunk_doc.get(str(c)) for c in item.get("gold_chunk_ids") or ()} - {None} if chunk_doc else set(item.get("doc_ids") or ())
    doc_at_k = None
    if gold_docs:
        doc_at_k = float(any(doc in gold_docs for _, doc in tool.hits[:k]))
    contains = answer_in(gold, final)
    exact = bool(final.strip()) and normalise_answer(final) == normalise_answer(gold)
    error_type = "" if final else ("no_final_answer" if not errors else str((errors[-1].payload.get("error") or {}).get("type", "tool_error")))
    return {
        "item_id": str(item["qa_id"]), "category": f"hops={item.get('hops', '?')}", "output": final, "score": float(contains),
        "success": contains, "excluded": False, "error_type": error_type,
        "metrics": {"exact_match": float(exact), "containment": float(contains), "searches": float(searches), f"doc_at_{k}": doc_at_k,
                    "valid_call": float(valid_calls > 0), "valid_calls": valid_calls,
                    "tool_calls": len(calls), "tool_errors": len(errors), "trajectory_id": log.id,
                    "step_budget": step_budget, "hops": item.get("hops"),
                    **{k2: v for k2, v in evaluator.evaluate(log).items() if k2 in ("TAC", "LCF")}},
    }


def run_qa_suite(
    policy: Any,
    items: Sequence[Mapping[str, Any]],
    search_tool: Any,
    config: QASuiteConfig | None = None,
    chunk_doc: Mapping[str, str] | None = None,
    decoding: Mapping[str, Any] | None = None,
) -> SuiteResult:
    """Run every QA item (``qa_id``, ``question``, ``answer``, ``gold_chunk_ids``) with ``search_tool``; one row per item.

    ``policy`` is a spine model callable; with ``generate_batch`` its turns are batched across items.
    ``chunk_doc`` (chunk id -> doc id) defaults to the search tool's index.
    """
    from agenttune_lib.spine.episode import run_episode
    from agenttune_lib.spine.harness import DictToolHarness
    from agenttune_lib.spine.strategies import ReActStrategy

    config = config or QASuiteConfig()
    items = list(items)[: config.limit] if config.limit is not None else list(items)
    if not items:
        raise ValueError("run_qa_suite needs at least one QA item")
    for it in items:
        for key in ("qa_id", "question", "answer"):
            if not it.get(key):
                raise ValueError(f"QA item {it.get('qa_id', '?')!r} has no {key!r}")
    if not hasattr(search_tool, "execute") or not getattr(search_tool, "name", None):
        raise TypeError(f"search_tool must be a tool with name and execute(), got {type(search_tool).__name__}")
    chunk_doc = chunk_doc if chunk_doc is not None else chunk_doc_map(search_tool)
    from agenttune_lib.evaluation.trajectory import TrajectoryEvaluator

    evaluator = TrajectoryEvaluator({search_tool.name: search_tool.parameters})
    lock = threading.Lock()
    tools: list[_RecordingTool] = [_RecordingTool(search_tool, lock) for _ in items]

    def episode(i: int, model: Any) -> Any:
        steps = config.steps_for(items[i])
        harness = DictToolHarness([tools[i]], max_steps=steps)
        strategy = ReActStrategy(model, max_steps=steps, tool_format=config.tool_format, max_tool_chars=config.max_tool_chars,
                                 final_answer_prompt=FINAL_ANSWER_PROMPT if config.final_answer_turn else None)
        it = items[i]
        return run_episode(strategy, harness, {"prompt": it["question"], "answer": it["answer"], "qa_id": it["qa_id"]})

    start = time.perf_counter()
    logs, turns = run_lockstep(list(range(len(items))), episode, policy,
                               tools=[search_tool.to_schema()] if hasattr(search_tool, "to_schema") else None)
    rows = []
    for it, log, tool in zip(items, logs, tools):
        if isinstance(log, Exception):
            rows.append({"item_id": str(it["qa_id"]), "category": f"hops={it.get('hops', '?')}", "output": "", "score": 0.0, "success": False,
                         "excluded": False, "error_type": f"crash:{type(log).__name__}",
                         "metrics": {"error": str(log)[:300], "step_budget": config.steps_for(it), "hops": it.get("hops")}})
        else:
            rows.append(_item_row(it, log, tool, chunk_doc, config.doc_k, evaluator, config.steps_for(it)))
    extra = {"search_tool": search_tool.name, "search_k": getattr(search_tool, "k", None), "search_max_chars": getattr(search_tool, "max_chars", None),
             "backend": type(getattr(search_tool, "backend", None)).__name__, "decoding": decoding_of(policy, decoding)}
    record = {**dataclasses.asdict(config), **extra, "n_items": len(items), "policy": policy_stats(policy)}
    return SuiteResult("qa", rows, record, config_hash("qa", config, [it["qa_id"] for it in items], extra),
                       time.perf_counter() - start, turns, logs=[lg for lg in logs if not isinstance(lg, Exception)])

