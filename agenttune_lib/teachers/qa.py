"""QA expert: walks each item's gold evidence chain with real ``search_corpus`` calls, then answers.

Queries come from the chain, never from the answer: hop 1 searches with the clue phrases
the question uses (or the question's keywords when an item has no chain), hop k+1 with
hop k's bridge term, each also with the document's title from the question. ``query_source``
says what else a query may be built from: ``"context"`` (default) only text the student also
sees (the question, the shown sentences that name the bridge term, the rarest words of passages
earlier searches showed), so every query can be imitated; a gold passage shown cut short before
its answer is searched again alone with the rarest words of its shown part, to read it whole; ``"passage"`` also the gold passage's own rarest words, which rank each hop's
chunk first but which a student that never saw the passage cannot reproduce. For each hop the
expert tries its candidate queries against the real index, keeps the one that ranks that hop's
gold chunk highest and asks for just that many results, so the tool's text budget shows the
passage whole; a hop whose chunk an earlier search already returned needs no search of its own.
Answer words are removed from every query. The expert answers only when the answer is in what
its searches showed (the tool results as clipped in its context); otherwise it says it did not
find it, and the episode is no success. ``evidence`` records which search returned which gold chunk.
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from agenttune_lib.spine.state import Generation
from agenttune_lib.teachers.base import TeacherInfo, count_assistant_turns, scripted_generation, tool_call_text

__all__ = ["QAExpertTeacher", "question_keywords", "answer_in_context", "NOT_FOUND", "QUERY_SOURCES"]

_STOP = frozenset(
    "a an the of in on at to for from by with and or is are was were be been which what who whom whose when where how "
    "does do did this that these those it its as under per into than then there their they them any all each other "
    "same such only also not no can could should would may might must shall will".split()
)
_QUOTED = re.compile(r'"([^"]{2,})"')
_TITLE = re.compile(r"^\s*In ([^,?]{3,120}),")
_SENTENCE_END = re.compile(r"(?<=[.;:!?])\s+")

#: The expert's reply when its context does not hold the answer (never the gold answer from nowhere).
NOT_FOUND = "I could not find the answer in the passages I retrieved."
#: What the expert's queries may be built from (module docstring).
QUERY_SOURCES = ("context", "passage")


def _spaces(text: str) -> str:
    return " ".join(text.split())


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^a-z0-9%]+", " ", str(text).lower())).strip()


_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|[nrt\"\\/])")


def _unescape(text: str) -> str:
    """JSON string escapes (``\\n``, ``\\"``, ``\\u2019``) as the characters they stand for; a clipped result is no longer JSON."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] == "u" else {"n": " ", "r": " ", "t": " "}.get(m.group(1), m.group(1)), text)


def answer_in_context(answer: str, messages: Sequence[dict[str, Any]]) -> bool:
    """Whether the normalized answer appears in a tool result the model was shown (JSON escapes read as text)."""
    gold = _norm(answer)
    return bool(gold) and any(m.get("role") == "tool" and gold in _norm(_unescape(str(m.get("content", "")))) for m in messages)
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'./-]*")


def _words(text: str) -> list[str]:
    return [w.strip(".'/-") for w in _WORD.findall(text or "") if w.strip(".'/-")]


def question_keywords(question: str, limit: int = 10) -> str:
    """The question's content words in order (stopwords and duplicates removed)."""
    seen: set[str] = set()
    out = []
    for w in _words(question):
        low = w.lower()
        if low in _STOP or low in seen or len(low) < 2:
            continue
        seen.add(low)
        out.append(w)
    return " ".join(out[:limit])


def _phrases(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value if v)
    return str(value or "")


class QAExpertTeacher:
    """A scripted policy over QA items: the planned searches in order, then the gold answer, as student tokens.

    ``search`` is the ``SearchCorpusTool`` the harness runs (its backend plans the queries);
    the item is found from the question in the first user message, so the teacher is also
    usable as an evaluation policy.
    """

    info = TeacherInfo("expert_qa", "evidence-chain/1")

    def __init__(self, search: Any, items: Sequence[dict[str, Any]], tokenizer: Any = None, max_candidates: int = 8,
                 query_source: str = "context") -> None:
        if not hasattr(search, "backend") or not hasattr(search, "execute"):
            raise TypeError(f"QAExpertTeacher needs a SearchCorpusTool (with .backend), got {type(search).__name__}")
        if query_source not in QUERY_SOURCES:
            raise ValueError(f"QAExpertTeacher query_source must be one of {QUERY_SOURCES}, got {query_source!r}")
        self.query_source = query_source
        self.search = search
        self.tokenizer = tokenizer
        self.max_candidates = max_candidates
        self.items = {str(r["qa_id"]): dict(r) for r in items}
        for qa_id, row in self.items.items():
            for key in ("question", "answer", "gold_chunk_ids"):
                if not row.get(key):
                    raise ValueError(f"QA item {qa_id!r} has no {key!r}; the expert needs the question, answer and gold chain")
        self._by_question = {str(r["question"]).strip(): qa_id for qa_id, r in self.items.items()}

    # -- planning ---------------------------------------------------------------------
    def _chain(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        chain = item.get("chain")
        if isinstance(chain, str) and chain:
            chain = json.loads(chain)
        if chain:
            return sorted((dict(c) for c in chain), key=lambda c: int(c.get("hop", 0)))
        return [{"hop": i + 1, "chunk_id": str(c), "bridge_in": "", "bridge_out": "", "clue": ""} for i, c in enumerate(item["gold_chunk_ids"])]

    def _strip_answer(self, query: str, answer: str) -> str:
        banned = {w.lower() for w in _words(answer)}
        return " ".join(w for w in query.split() if w.strip(".,;:()\"'").lower() not in banned).strip()

    @functools.cached_property
    def _passages(self) -> tuple[dict[str, str], dict[str, int]]:
        """(chunk id -> text, word -> number of chunks holding it) of the search index, for distinctive-term queries."""
        backend = self.search.backend
        owner = backend if hasattr(backend, "chunks") else getattr(backend, "lexical", None)  # a hybrid index keeps them in its lexical half
        chunks = owner.chunks() if owner is not None and hasattr(owner, "chunks") else {"chunk_id": [], "text": []}
        texts = {str(c): str(t) for c, t in zip(chunks["chunk_id"], chunks["text"])}
        df: dict[str, int] = {}
        for text in texts.values():
            for w in {w.lower() for w in _words(text)}:
                df[w] = df.get(w, 0) + 1
        return texts, df

    def _distinctive(self, chunk_id: str, answer: str, n: int, text: str | None = None) -> str:
        """The ``n`` rarest content words of a passage (or of ``text``, a shown part of it), answer words excluded, in order."""
        texts, df = self._passages
        text = texts.get(chunk_id, "") if text is None else text
        banned = {w.lower() for w in _words(answer)} | _STOP
        words = []
        for w in _words(text):
            low = w.lower()
            if len(low) >= 3 and low not in banned and not low.isdigit() and low not in {x.lower() for x in words}:
                words.append(w)
        keep = set(sorted(words, key=lambda w: (df.get(w.lower(), 0), words.index(w)))[:n])
        return " ".join(w for w in words if w in keep)

    def _candidates(self, item: dict[str, Any], hop: dict[str, Any], shown: Sequence[str] = ()) -> list[str]:
        """Candidate queries for one hop; ``shown`` are the chunks earlier searches of the walk returned."""
        keywords = question_keywords(item["question"])
        bridge = str(hop.get("bridge_in") or "")
        clue = _phrases(hop.get("clue"))
        title_match = _TITLE.match(str(item["question"]))
        title = title_match.group(1).strip() if title_match else ""
        first = int(hop.get("hop", 1)) == 1
        raw = [clue, f"{clue} {keywords}"] if first else [bridge, f"{bridge} {keywords}"]
        raw += [f"{title} {clue}" if first else f"{title} {bridge}", keywords, f"{bridge} {clue}"]
        # the question's own quoted terms (items without a chain name their bridge terms in the question)
        quoted = [q for q in _QUOTED.findall(item["question"]) if len(q) <= 80]
        head = quoted[0] if quoted else ""
        raw += [f"{head} {q}" if q != head else q for q in quoted]
        chunk, answer = str(hop.get("chunk_id")), str(item["answer"])
        if self.query_source == "passage":
            rare = [self._distinctive(chunk, answer, 6), self._distinctive(chunk, answer, 10)]
        else:  # text in the student's own context: the shown sentences naming the bridge term, the newest passage's rarest words
            rare = []
            if not first:
                last = [self._distinctive(c, answer, 6) for c in list(shown)[-1:] if c != chunk]
                rare = self._bridge_sentences(bridge, shown[-2:]) + [f"{bridge} {w}" for w in last] + last
        out: list[str] = []
        for q in raw:
            q = self._strip_answer(" ".join(q.split()), str(item["answer"]))
            if q and q not in out:
                out.append(q)
        out = out[: self.max_candidates]
        for q in rare:
            q = self._strip_answer(q, answer)
            if q and q not in out:
                out.append(q)
        return out

    def _bridge_sentences(self, bridge: str, shown: Sequence[str]) -> list[str]:
        """Queries from the sentences of shown passages that name ``bridge``: their keywords, and the bridge with a few."""
        key = _norm(bridge)
        if not key:
            return []
        texts = self._passages[0]
        out = []
        for chunk in shown:
            for sentence in _SENTENCE_END.split(texts.get(chunk, "")):
                if f" {key} " in f" {_norm(sentence)} ":
                    out += [question_keywords(sentence, 8), f"{bridge} {question_keywords(sentence, 5)}"]
        return out[:4]

    def _hits(self, query: str) -> list[str]:
        return [str(h["chunk_id"]) for h in self.search.backend.search(query, self.search.k)]

    @functools.lru_cache(maxsize=4096)
    def plan(self, qa_id: str) -> tuple[dict[str, Any], ...]:
        """The searches for one item: per hop not already covered, the candidate query that ranks its gold chunk
        highest (ties: the earlier candidate), asking for results down to that rank; ``found`` says whether any did."""
        item = self.items[qa_id]
        steps: list[dict[str, Any]] = []
        covered: set[str] = set()
        shown: list[str] = []
        for hop in self._chain(item):
            chunk = str(hop["chunk_id"])
            if chunk in covered:
                continue
            candidates = self._candidates(item, hop, shown)
            if not candidates:
                continue
            best: tuple[int, str, list[str]] | None = None
            for q in candidates:
                got = self._hits(q)
                if chunk in got and (best is None or got.index(chunk) < best[0]):
                    best = (got.index(chunk), q, got)
                    if best[0] == 0:
                        break
            if best is None:
                chosen, k, hits = candidates[0], int(self.search.k), self._hits(candidates[0])
            else:
                chosen, k, hits = best[1], best[0] + 1, best[2][: best[0] + 1]
            covered.update(hits)
            shown.extend(h for h in hits if h not in shown)
            steps.append({"hop": int(hop.get("hop", len(steps) + 1)), "chunk_id": chunk, "query": chosen, "k": k, "found": chunk in hits})
        return tuple(steps)

    def _chars_shown(self, n_results: int) -> int:
        """Characters of each passage one search of ``n_results`` results shows (``SearchCorpusTool.execute``'s budget)."""
        budget = int(getattr(self.search, "max_chars", 1200))
        return max(int(getattr(self.search, "MIN_RESULT_CHARS", 160)), budget // max(n_results, 1))

    def read_query(self, qa_id: str, messages: Sequence[dict[str, Any]]) -> str | None:
        """A query for a gold passage that holds the answer but that the context shows cut short before it: the rarest
        words of the part shown, used only where it ranks that passage first, so a search with k=1 shows it whole."""
        item = self.items[qa_id]
        answer, texts = _norm(item["answer"]), self._passages[0]
        context = _spaces(" ".join(_unescape(str(m.get("content", ""))) for m in messages if m.get("role") == "tool"))
        for hop in reversed(self._chain(item)):
            chunk = str(hop["chunk_id"])
            full = texts.get(chunk, "")
            if chunk not in context or not answer or answer not in _norm(full[: self._chars_shown(1)]):
                continue
            lo, hi = 0, len(full)  # the longest start of the passage the context holds (containment is monotone in length)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if _spaces(full[:mid]) in context else (lo, mid - 1)
            shown = full[:lo].rsplit(" ", 1)[0] if full[lo:lo + 1].strip() else full[:lo]  # not the word cut in two
            for n in (6, 10):
                query = self._strip_answer(self._distinctive(chunk, str(item["answer"]), n, text=shown), str(item["answer"]))
                if query and self._hits(query)[:1] == [chunk]:
                    return query
        return None

    def steps_needed(self, qa_id: str) -> int:
        """Every planned search, one read of a passage shown cut short, and the answer."""
        return len(self.plan(str(qa_id))) + 2

    # -- the policy -------------------------------------------------------------------
    def item_for(self, messages: Sequence[dict[str, str]]) -> str:
        user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
        text = user.strip() if isinstance(user, str) else ""
        qa_id = self._by_question.get(text)
        if qa_id is None:
            qa_id = next((q for question, q in self._by_question.items() if question and question in text), None)
        if qa_id is None:
            raise LookupError(f"QAExpertTeacher: no QA item has this question: {text[:120]!r}")
        return qa_id

    def next_text(self, messages: Sequence[dict[str, str]]) -> str:
        qa_id = self.item_for(messages)
        plan = self.plan(qa_id)
        step = count_assistant_turns(messages)
        if step < len(plan):
            args: dict[str, Any] = {"query": plan[step]["query"]}
            if plan[step].get("k", self.search.k) != self.search.k:
                args["k"] = int(plan[step]["k"])
            return tool_call_text(self.search.name, args)
        answer = str(self.items[qa_id]["answer"])
        if answer_in_context(answer, messages):
            return answer
        read = self.read_query(qa_id, messages) if step == len(plan) and self.query_source == "context" else None
        return tool_call_text(self.search.name, {"query": read, "k": 1}) if read else NOT_FOUND

    def __call__(self, messages: Any) -> Generation | str:
        if isinstance(messages, str):
            raise TypeError("QAExpertTeacher needs chat messages (input_format='messages'), got a prompt string")
        text = self.next_text(messages)
        return scripted_generation(self.tokenizer, messages, text) if self.tokenizer is not None else text

    def evidence(self, log: Any, task: Any) -> list[dict[str, Any]]:
        """Per gold chunk: which search call (index, query) first returned it and at what rank, from the log's real results."""
        from agenttune_lib.events import EventKind

        qa_id = str(task.get("qa_id")) if isinstance(task, dict) else str(task)
        item = self.items[qa_id]
        searches = []
        for e in log:
            if e.kind is EventKind.TOOL_RESULT and e.payload.get("name") == self.search.name and not e.is_error:
                content = e.payload.get("content")
                data = json.loads(content) if isinstance(content, str) else content
                if isinstance(data, dict):
                    searches.append((data.get("query"), [str(r.get("chunk_id")) for r in data.get("results", [])]))
        out = []
        for hop in self._chain(item):
            chunk = str(hop["chunk_id"])
            found = next(((i, q, ids.index(chunk) + 1) for i, (q, ids) in enumerate(searches) if chunk in ids), None)
            out.append({"hop": int(hop.get("hop", 0)), "chunk_id": chunk, "search": None if found is None else found[0],
                        "query": None if found is None else found[1], "rank": None if found is None else found[2]})
        return out
