"""Stage 3: answer-first generation. ``gold_chunk_ids`` are in hop order: the question describes hop 1 (the start
passage), each hop shares a hidden bridge term with the next, and the last hop holds the typed answer."""
from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from agenttune_lib.rag.metrics import answer_in, normalise_answer
from agenttune_lib.rag.synthesis.annotate import sentences, term_key
from agenttune_lib.rag.synthesis.answers import unique_spans
from agenttune_lib.rag.synthesis.jsonx import JSONExtractionError, extract_json
from agenttune_lib.rag.synthesis.llm import CallLog, LLMClient, LLMResponse, call_llm

__all__ = ["PathContext", "Candidate", "ExtractiveGenerator", "LLMGenerator", "qa_id_for", "chain_options", "render_question", "chain_of"]


def qa_id_for(question: str, answer: str, gold_chunk_ids: Sequence[str]) -> str:
    """Content-addressed QA id, so the same question over the same evidence keeps its id across runs."""
    raw = "\x1f".join([normalise_answer(question), normalise_answer(answer), *gold_chunk_ids])
    return "qa-" + hashlib.sha256(raw.encode("utf-8")).hexdigest()[:24]


@dataclasses.dataclass
class PathContext:
    """A sampled path with what generation needs: texts, titles, annotations and the edges' shared terms."""

    path_id: str
    chunk_ids: list[str]
    doc_ids: list[str]
    titles: list[str]
    texts: list[str]
    entities: list[list[str]]
    keyphrases: list[list[str]]
    edge_terms: list[list[str]]  # edge_terms[i] links chunk i and i+1
    edge_types: list[str]
    doc_texts: list[str] = dataclasses.field(default_factory=list)  # every chunk of the path's document(s)

    @property
    def hops(self) -> int:
        return len(self.chunk_ids)


@dataclasses.dataclass
class Candidate:
    """One generated QA candidate and the accounting of the call that produced it."""

    candidate_id: str
    path_id: str
    gold_chunk_ids: list[str]
    hops: int
    question: str
    answer: str
    answer_chunk_id: str
    doc_ids: list[str]
    bridge_terms: list[str] = dataclasses.field(default_factory=list)
    evidence: str = ""
    answer_kind: str = ""
    answer_type: str = ""
    clue: list[str] = dataclasses.field(default_factory=list)
    generator: str = ""
    attempt: int = 0
    status: str = "candidate"
    discard_reason: str = ""
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0

    @property
    def qa_id(self) -> str:
        return qa_id_for(self.question, self.answer, self.gold_chunk_ids)

    def to_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row["qa_id"] = self.qa_id
        return row


def chain_of(row: Any) -> list[dict[str, Any]]:
    """The evidence chain of a candidate or item row, in hop order: each hop's chunk, the bridge term that leads
    into it and out of it (never named in the question), and for hop 1 the clue phrases the question uses."""
    get = (lambda k: row.get(k)) if isinstance(row, dict) else (lambda k: getattr(row, k, None))
    gold = list(get("gold_chunk_ids") or [])
    bridges = list(get("bridge_terms") or [])
    bridges += [""] * max(0, len(gold) - 1 - len(bridges))
    clue = list(get("clue") or [])
    return [{"hop": i + 1, "chunk_id": c, "bridge_in": bridges[i - 1] if i > 0 else "", "bridge_out": bridges[i] if i < len(gold) - 1 else "",
             "clue": clue if i == 0 else []} for i, c in enumerate(gold)]


def _contains_term(sentence: str, key: str) -> bool:
    return f" {key} " in f" {term_key(sentence)} "


def _failed(ctx: PathContext, generator: str, attempt: int, reason: str, response: LLMResponse | None = None) -> Candidate:
    gold = list(reversed(ctx.chunk_ids))
    c = Candidate(f"{ctx.path_id}:{attempt}", ctx.path_id, gold, ctx.hops, "", "", gold[-1], list(ctx.doc_ids), generator=generator, attempt=attempt, status="discarded", discard_reason=f"generation: {reason}")
    if response is not None:
        c.model, c.prompt_tokens, c.completion_tokens, c.cost_usd, c.latency_s = response.model, response.prompt_tokens, response.completion_tokens, response.cost_usd, response.latency_s
    return c


class ExtractiveGenerator:
    """Deterministic answer-first questions over a path with hidden bridges (no model needed).

    Hop 1 is the start passage the question describes by a few of its own phrases (never a quoted sentence);
    each hop k+1 shares a term with hop k, and the question names only the kind of that term ("a defined term",
    "a phrase"), never the term; the last hop holds a typed answer (a notice period, an amount, a party, a
    governing law, ...) that is the only span of its type there. Both orientations of a sampled path are tried;
    attempt ``n`` takes the ``n``-th best (orientation, answer, bridges, clue) option.
    """

    name = "typed-chain-v2"
    model = "extractive"

    def __init__(self) -> None:
        self._options: dict[str, list[dict[str, Any]]] = {}
        self._used: Counter[str] = Counter()  # answers chosen so far: later paths prefer fresh ones

    def generate(self, ctx: PathContext, attempt: int = 0, feedback: str | None = None, call_log: CallLog | None = None) -> Candidate:
        t0 = time.perf_counter()
        if any(not terms for terms in ctx.edge_terms):
            return _failed(ctx, self.name, attempt, "a path edge has no shared term (abstract edge) to phrase a hop with")
        if ctx.path_id not in self._options:
            self._options[ctx.path_id] = chain_options(ctx)
        options = sorted(self._options[ctx.path_id], key=lambda o: self._used[normalise_answer(o["answer"])])  # stable: spread answers
        if attempt >= len(options):
            why = "no typed answer span unique in an end passage of the path, with distinct bridges and a clue phrase" if not options else f"no option #{attempt + 1}"
            return _failed(ctx, self.name, attempt, why)
        opt = options[attempt]
        self._used[normalise_answer(opt["answer"])] += 1
        question = render_question(opt, ctx.titles[0], f"{ctx.path_id}:{attempt}")
        cand = Candidate(
            f"{ctx.path_id}:{attempt}", ctx.path_id, opt["order"], ctx.hops, question, opt["answer"], opt["order"][-1], list(ctx.doc_ids),
            bridge_terms=opt["bridges"], evidence=opt["evidence"], answer_kind=opt["answer_type"], answer_type=opt["answer_type"],
            clue=opt["clue"], generator=self.name, attempt=attempt, model=self.model,
        )
        cand.latency_s = time.perf_counter() - t0
        if call_log is not None:
            call_log.record("stage3_generate", "generate" if attempt == 0 else "regenerate", LLMResponse("", self.model, 0, 0, cand.latency_s, 0.0), cand.candidate_id)
        return cand


_KEYED: dict[int, tuple[Sequence[str], list[str]]] = {}


def _keyed(texts: Sequence[str]) -> list[str]:
    """`` term_key(text) `` of each text, padded for whole-word lookups; memoised per list (a document's chunks)."""
    hit = _KEYED.get(id(texts))
    if hit is None or hit[0] is not texts:
        if len(_KEYED) > 256:
            _KEYED.clear()
        hit = _KEYED[id(texts)] = (texts, [f" {term_key(t)} " for t in texts])
    return hit[1]


def _doc_df(key: str, doc_keys: Sequence[str]) -> int:
    return sum(f" {key} " in k for k in doc_keys)


def _bridge_kind(term: str, entities: Sequence[str]) -> str:
    key = term_key(term)
    if any(term_key(e) == key for e in entities):
        return "defined term" if term[:1].isupper() else "name"
    return "phrase"


def chain_options(ctx: PathContext) -> list[dict[str, Any]]:
    """Every usable (orientation, answer, bridges, clue) for a path, best first: rarer bridges in the document,
    answers of rarer types, then a stable order."""
    doc_keys = _keyed(ctx.doc_texts or ctx.texts)
    title_key = f" {term_key(ctx.titles[0])} "
    out = []
    n = ctx.hops
    for orient in ("forward", "reverse"):
        idx = list(range(n)) if orient == "forward" else list(range(n - 1, -1, -1))
        texts = [ctx.texts[i] for i in idx]
        ents = [ctx.entities[i] + ctx.keyphrases[i] for i in idx]
        edges = [ctx.edge_terms[min(a, b)] for a, b in zip(idx, idx[1:])]  # edges[j] links hop j and hop j+1
        used: set[str] = set()
        bridges, kinds, dfs = [], [], []
        for j, terms in enumerate(edges):
            ranked = sorted((t for t in terms if term_key(t) and term_key(t) not in used and f" {term_key(t)} " not in title_key),
                            key=lambda t: (_doc_df(term_key(t), doc_keys), len(t)))
            if not ranked:
                break
            pick = ranked[0]
            used.add(term_key(pick))
            bridges.append(pick)
            kinds.append(_bridge_kind(pick, ctx.entities[idx[j]] + ctx.entities[idx[j + 1]]))
            dfs.append(_doc_df(term_key(pick), doc_keys))
        if len(bridges) != n - 1:
            continue
        answer_text = texts[-1]
        others = "\n".join(texts[:-1])
        for span in unique_spans(answer_text):
            key = span.key
            if answer_in(span.text, others) or answer_in(span.text, ctx.titles[0]) or len(span.text.split()) > 8:
                continue
            if any(key in term_key(b) or term_key(b) in key for b in bridges if term_key(b)):
                continue
            clue = _clue(texts, ents[0], bridges[0], span.text, ctx.titles[0], used)
            if not clue:
                continue
            evidence = next((s for s in sentences(answer_text) if answer_in(span.text, s)), "")
            order = [ctx.chunk_ids[i] for i in idx]
            out.append({"order": order, "answer": span.text, "answer_type": span.answer_type, "bridges": bridges, "kinds": kinds,
                        "clue": clue, "evidence": evidence, "rank": (max(dfs), _TYPE_RARITY.get(span.answer_type, 5), orient, span.start)})
    out.sort(key=lambda o: o["rank"])
    return out


_TYPE_RARITY = {"governing_law": 0, "venue": 0, "percentage": 0, "amount": 0, "date": 0, "notice_period": 1, "party": 2, "duration": 3, "section_ref": 4, "defined_term": 4}
_GENERIC = frozenset("agreement license licence licensee licensor software terms party parties section shall may".split())


def _clue(texts: Sequence[str], terms: Sequence[str], first_bridge: str, answer: str, title: str, bridges: set[str]) -> list[str]:
    """Up to two phrases of the start passage that identify it: in the sentence with the first bridge if
    possible, absent from every later hop, not a bridge, not in the title, not generic."""
    start, later = texts[0], f" {term_key(' '.join(texts[1:]))} "
    title_key = f" {term_key(title)} "
    kb = term_key(first_bridge)
    bridge_sents = [s for s in sentences(start) if _contains_term(s, kb)]
    picked: list[str] = []
    for term in sorted(terms, key=lambda t: (not any(_contains_term(s, term_key(t)) for s in bridge_sents), -len(term_key(t).split()), t)):
        key = term_key(term)
        if not key or key in bridges or key in _GENERIC or f" {key} " in title_key or f" {key} " in later or answer_in(answer, term):
            continue
        if kb in key or key in kb or any(set(key.split()) & set(term_key(p).split()) for p in picked):  # no overlapping clue phrases
            continue
        if len(key) < 5:
            continue
        picked.append(term.lower() if not term.isupper() else term.title())
        if len(picked) == 2:
            break
    return picked


_ASKS: dict[str, tuple[str, ...]] = {
    # no form repeats the word that makes a span a notice period ("notice"), a venue ("courts") or a section
    # reference ("section"): the answer passage always has it, so it would be a lexical shortcut to that passage
    "notice_period": ("How far in advance must the other side be warned{where}?", "What advance-warning period applies{where}?", "How long beforehand must it be announced{where}?"),
    "duration": ("How long is the period stated{where}?", "What time period is specified{where}?", "What length of time does the agreement set{where}?"),
    "amount": ("What amount of money is stated{where}?", "How much money is specified{where}?", "What sum is named{where}?"),
    "percentage": ("What percentage is stated{where}?", "Which percentage figure appears{where}?", "What rate, as a percentage, is given{where}?"),
    "date": ("What date is given{where}?", "Which date does the agreement mention{where}?", "What calendar date appears{where}?"),
    "party": ("Which business is named{where}?", "Which legal entity does the agreement name{where}?", "What incorporated entity is identified{where}?"),
    "governing_law": ("Which jurisdiction's law governs, as stated{where}?", "What governing law is chosen{where}?", "Whose laws apply, according to the governing-law wording{where}?"),
    "venue": ("Which place is chosen for hearing disputes{where}?", "Where must disputes be heard, according to the wording{where}?", "Which venue for disputes is given{where}?"),
    "section_ref": ("Which numbered provision is cross-referenced{where}?", "What provision number is referred to{where}?", "Which other provision is cited{where}?"),
    "defined_term": ("Which term is defined{where}?", "What defined term is introduced{where}?", "Which capitalised term does the agreement define{where}?"),
}
_STARTS = ("the clause mentioning {clue}", "the passage about {clue}", "the provision that deals with {clue}")


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def render_question(opt: dict[str, Any], title: str, salt: str) -> str:
    """One question from the answer type and the chain; the form (nested or step by step) and the wording vary
    by a hash of ``salt``, so a corpus gets several forms per answer type."""
    h = int(hashlib.sha256(salt.encode()).hexdigest()[:8], 16)
    asks = _ASKS[opt["answer_type"]]
    ask = asks[h % len(asks)]
    clue = " and ".join(f"“{c}”" for c in opt["clue"])
    start = _STARTS[(h // 7) % len(_STARTS)].format(clue=clue)
    kinds = opt["kinds"]
    if (h // 31) % 2 == 0 or len(kinds) == 1:
        desc = start
        for kind in kinds[:-1]:
            desc = f"the passage that shares {_article(kind)} {kind} with {desc}"
        where = f" in the passage that shares {_article(kinds[-1])} {kinds[-1]} with {desc}"
        return f"In {title}, " + ask[0].lower() + ask[1:].format(where=where)
    steps = [f"In {title}, start from {start}; it uses {_article(kinds[0])} {kinds[0]} that another passage also uses."]
    for kind in kinds[1:]:
        steps.append(f"That passage in turn shares {_article(kind)} {kind} with a further one.")
    steps.append(ask.format(where=" in the last passage reached"))
    return " ".join(steps)


_GENERATE_SYSTEM = (
    "You write multi-hop questions for training a search agent over contracts. Work answer-first: choose a short "
    "answer span (1-6 words, copied exactly) from the LAST passage, of a type a lawyer asks for (a defined term, "
    "a notice period or duration, an amount or percentage, a date, a party, the governing law or venue, a section "
    "reference). Then write one question a person would ask, whose answer is that span, that starts from a detail "
    "of PASSAGE 1 and needs each passage in order: never name the term that links one passage to the next, and "
    "never quote a whole sentence. The answer must not appear in the question. "
    'Reply as JSON: {"answer": "...", "question": "...", "reasoning": "..."}'
)


class LLMGenerator:
    """One structured JSON call per path through an injected LLMClient; feedback drives the regeneration.
    Passages are shown in hop order (the start passage first, the answer passage last)."""

    def __init__(self, client: LLMClient, max_tokens: int = 384) -> None:
        self.client = client
        self.max_tokens = max_tokens
        self.name = f"llm:{getattr(client, 'model', 'llm')}"

    def generate(self, ctx: PathContext, attempt: int = 0, feedback: str | None = None, call_log: CallLog | None = None) -> Candidate:
        order = list(range(ctx.hops - 1, -1, -1))  # path index 0 is the answer end
        user = "\n\n".join(f"PASSAGE {n + 1} ({ctx.titles[i]}):\n{ctx.texts[i]}" for n, i in enumerate(order))
        if feedback:
            user += f"\n\nA previous attempt was rejected: {feedback}. Write a new answer/question pair that fixes this."
        response = call_llm(self.client, [{"role": "system", "content": _GENERATE_SYSTEM}, {"role": "user", "content": user}], json_mode=True, max_tokens=self.max_tokens)
        if call_log is not None:
            call_log.record("stage3_generate" if attempt == 0 else "stage4_regenerate", "generate", response, f"{ctx.path_id}:{attempt}")
        try:
            data = extract_json(response.text)
            question, answer = str(data["question"]).strip(), str(data["answer"]).strip()
        except (JSONExtractionError, KeyError, TypeError) as exc:
            return _failed(ctx, self.name, attempt, f"unparseable model reply ({exc})", response)
        if not question or not answer:
            return _failed(ctx, self.name, attempt, "model returned an empty question or answer", response)
        sent = next((s for s in sentences(ctx.texts[0]) if answer_in(answer, s)), "")
        gold = [ctx.chunk_ids[i] for i in order]
        bridges = [(ctx.edge_terms[i - 1][0] if ctx.edge_terms[i - 1] else "") for i in order[:-1]]
        return Candidate(
            f"{ctx.path_id}:{attempt}", ctx.path_id, gold, ctx.hops, question, answer, gold[-1], list(ctx.doc_ids),
            bridge_terms=bridges, evidence=sent, answer_type="llm", generator=self.name, attempt=attempt,
            model=response.model, prompt_tokens=response.prompt_tokens, completion_tokens=response.completion_tokens,
            cost_usd=response.cost_usd, latency_s=response.latency_s,
        )
