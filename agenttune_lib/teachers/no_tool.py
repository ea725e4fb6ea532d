"""No-tool demonstrations: prompts that offer tools none of which fits, answered in plain text without a call.

Distilling only episodes that call tools teaches a student to call a tool for every prompt (BFCL
irrelevance fell 1.00 -> 0.54 without these). The prompts are built from the platform's own data —
corpus passages and titles, QA train questions, the real τ² retail, workspace-file and corpus-search
tools — never from BFCL's files: either the offered tools cannot answer (a QA train question or a
contract passage offered only retail or file tools, an order question offered only corpus search),
or the prompt needs no tool (repeat, capitalise or count words of a passage's phrase), or the offered
retail tools are siblings of the one a retail request needs (``near_miss``: same domain, another job). A QA train
question appears both here (unfit tools: decline) and in the QA expert's episodes (search offered:
call it), so the student learns to match the question to the offered tools, not to call on every
question. Each reply is fixed by construction, so the episode's answer check decides success like
any other teacher episode.
"""
from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agenttune_lib.spine.state import Generation
from agenttune_lib.teachers.base import TeacherInfo, scripted_generation
from agenttune_lib.teachers.near_miss import NEAR_MISS_NEEDS, near_miss_item

__all__ = ["NoToolTeacher", "no_tool_items", "no_tool_items_from_platform", "NO_TOOL_KINDS"]

#: What each item asks: tools that do not fit (three directions), sibling tools of another job, or a task that needs none.
NO_TOOL_KINDS = ("unfit_qa", "unfit_retail", "unfit_search", "unfit_near", "repeat", "upper", "count_words")
#: The order items cycle through: a real question offered unfit tools (the contrast to the QA episodes) and a near
#: miss (the contrast to a call whose tool name matches the question) four in eleven each, the rest three in eleven.
_CYCLE = ("unfit_qa", "unfit_near", "unfit_retail", "unfit_qa", "unfit_near", "unfit_search", "unfit_qa", "unfit_near",
          "repeat", "unfit_qa", "unfit_near")
_CYCLE_TAIL = ("upper", "count_words")
#: What a family of offered tools works on, for the declining reply.
_SCOPE = {"retail": "retail orders, users and products", "files": "files in a local workspace"}
_SENTENCE = re.compile(r"[^.;:\n]{30,160}[.;]")


def _phrases(chunks: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(title, phrase) pairs: the first short sentence of each passage."""
    out = []
    for c in chunks:
        m = _SENTENCE.search(str(c.get("text", "")))
        if m:
            out.append((str(c.get("title") or "the agreement").strip(), " ".join(m.group(0).split())))
    return out


def no_tool_items(chunks: Sequence[dict[str, Any]], retail_tools: Sequence[Any], search_tool: Any, n: int, seed: int = 0,
                  questions: Sequence[str] = (), file_tools: Sequence[Any] = (),
                  retail_db: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Up to ``n`` items (``task_id``, ``prompt``, ``answer``, ``kind``, ``tools``) cycling through ``NO_TOOL_KINDS``.

    ``retail_tools`` are BaseTools of the τ² retail domain, ``search_tool`` the corpus search tool, ``file_tools``
    (optional) workspace file tools; each item offers one to three of them. ``questions`` (QA train questions)
    feed the ``unfit_qa`` kind, ``retail_db`` (the τ² retail database) the ``unfit_near`` kind; each is left out
    without its input. A prompt is built once (fewer than ``n`` items when a small
    corpus repeats its phrases). Raises ValueError when the passages give no usable phrase.
    """
    if n <= 0:
        return []
    phrases = _phrases(chunks)
    if not phrases:
        raise ValueError(f"no_tool_items: none of the {len(chunks)} passages has a sentence of 30-160 characters to build prompts from")
    if not retail_tools:
        raise ValueError("no_tool_items: no retail tools given (the unfit-tool prompts offer them)")
    rng = random.Random(seed)
    rng.shuffle(phrases)
    questions = [q for q in dict.fromkeys(str(q).strip() for q in questions) if q]
    rng.shuffle(questions)
    cycle = [k for k in _CYCLE + _CYCLE_TAIL if (questions or k != "unfit_qa") and (retail_db or k != "unfit_near")]
    needs = list(NEAR_MISS_NEEDS)
    rng.shuffle(needs)
    items = []
    seen: set[str] = set()
    used = near_used = 0  # questions and near-miss needs taken so far (the scripted teacher answers by prompt)
    for i in range(n):
        kind = cycle[i % len(cycle)]
        if kind == "unfit_qa" and used >= len(questions):
            kind = "unfit_retail"
        title, phrase = phrases[i % len(phrases)]
        retail = rng.sample(list(retail_tools), k=min(len(retail_tools), rng.randint(1, 3)))
        if kind == "unfit_qa":
            family = "files" if file_tools and i % 2 else "retail"
            tools = rng.sample(list(file_tools), k=min(len(file_tools), rng.randint(1, 3))) if family == "files" else retail
            prompt, used = questions[used], used + 1
            answer = (f"The tools I have ({', '.join(t.name for t in tools)}) work on {_SCOPE[family]}; none of them "
                      "can look up the documents this question is about, so I cannot answer it with them.")
        elif kind == "unfit_near":
            near, near_used = near_miss_item(needs[near_used % len(needs)], retail_tools, retail_db, rng), near_used + 1
            if near is None:
                continue
            prompt, answer, tools = near["prompt"], near["answer"], near["tools"]
        elif kind == "unfit_retail":
            tools = retail
            prompt = f"In {title}, what does this passage require: “{phrase}”?"
            answer = f"The tools I have ({', '.join(t.name for t in tools)}) work on retail orders and accounts, not on {title}, so none of them can answer this."
        elif kind == "unfit_search":
            tools = [search_tool]
            order = f"#W{rng.randint(1000000, 9999999)}"
            prompt = f"What is the current status of my order {order}?"
            answer = f"I can only search the contract corpus; it holds no orders, so I cannot look up order {order}."
        elif kind == "repeat":
            tools = [search_tool, *retail[:1]]
            prompt = f"Repeat this sentence exactly: {phrase}"
            answer = phrase
        elif kind == "upper":
            tools = retail[:2]
            words = phrase.split()[:6]
            prompt = f"Write this phrase in capital letters: {' '.join(words)}"
            answer = " ".join(words).upper()
        else:
            tools = [search_tool]
            words = phrase.split()[:rng.randint(4, 9)]
            prompt = f"How many words are in this phrase: “{' '.join(words)}”?"
            answer = f"{len(words)} words."
        if prompt not in seen:  # a repeated passage phrase would give one prompt two replies
            seen.add(prompt)
            items.append({"task_id": f"no_tool:{kind}:{i}", "prompt": prompt, "answer": answer, "kind": kind, "tools": tools})
    return items


class NoToolTeacher:
    """A scripted policy that answers each no-tool item's prompt with its fixed reply, as the student's tokens."""

    info = TeacherInfo("expert_no_tool", "unfit-or-unneeded/1")

    def __init__(self, items: Sequence[dict[str, Any]], tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        self.answers = {str(it["prompt"]).strip(): str(it["answer"]) for it in items}

    def next_text(self, messages: Sequence[dict[str, str]]) -> str:
        user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
        text = str(user).strip()
        answer = self.answers.get(text)
        if answer is None:
            answer = next((a for p, a in self.answers.items() if p and p in text), None)
        if answer is None:
            raise LookupError(f"NoToolTeacher: no item has this prompt: {text[:120]!r}")
        return answer

    def __call__(self, messages: Any) -> Generation | str:
        if isinstance(messages, str):
            raise TypeError("NoToolTeacher needs chat messages (input_format='messages'), got a prompt string")
        text = self.next_text(messages)
        return scripted_generation(self.tokenizer, messages, text) if self.tokenizer is not None else text


def no_tool_items_from_platform(warehouse: Any, rag_paths: Any, search_tool: Any, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``no_tool_items`` over the platform's corpus (passages outside every validation item's gold chain), its QA
    train questions, its real τ² retail tools and database, read-only file tools over the corpus artifacts directory, and its
    corpus search tool (built on the hybrid index when ``search_tool`` is None)."""
    from agenttune_lib.rag import SearchCorpusTool, load_backend
    from agenttune_lib.rag.splits import load_qa_split
    from agenttune_lib.rag.workflow import load_chunks
    from agenttune_lib.spine.tau2 import Tau2RetailHarness, Tau2RetailTool, fresh_db, tau2_tool_schemas
    from agenttune_lib.tools.builtins import GrepTool, ListFilesTool, ReadFileTool

    held_out = {str(c) for row in load_qa_split(warehouse, "validation") for c in row.get("gold_chunk_ids") or ()}
    chunks = [c.to_row() for c in load_chunks(rag_paths) if c.chunk_id not in held_out]
    harness = Tau2RetailHarness()
    retail = [Tau2RetailTool(schema, harness) for schema in tau2_tool_schemas()]
    search = search_tool if search_tool is not None else SearchCorpusTool(load_backend(rag_paths.index, "hybrid"))
    questions = [str(row["question"]) for row in load_qa_split(warehouse, "train")]
    files = [cls(rag_paths.root) for cls in (ReadFileTool, ListFilesTool, GrepTool)]
    return no_tool_items(chunks, retail, search, n, seed, questions=questions, file_tools=files, retail_db=fresh_db())
