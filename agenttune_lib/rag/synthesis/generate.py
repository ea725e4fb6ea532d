"""Stage 3: answer-first generation. The answer is fixed in the first passage of a path; the question
starts from the last passage and needs the chain of bridge terms back to the answer."""
from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections.abc import Sequence
from typing import Any

from agenttune_lib.rag.metrics import answer_in, normalise_answer
from agenttune_lib.rag.synthesis.annotate import sentences, term_key
from agenttune_lib.rag.synthesis.jsonx import JSONExtractionError, extract_json
from agenttune_lib.rag.synthesis.llm import CallLog, LLMClient, LLMResponse, call_llm

__all__ = ["PathContext", "Candidate", "ExtractiveGenerator", "LLMGenerator", "qa_id_for"]

_ORDINALS = {2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth"}


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


def _contains_term(sentence: str, key: str) -> bool:
    return f" {key} " in f" {term_key(sentence)} "


def _trim(sentence: str, words: int = 28) -> str:
    parts = sentence.split()
    text = " ".join(parts[:words]) + (" …" if len(parts) > words else "")
    return text.replace('"', "'")


def _failed(ctx: PathContext, generator: str, attempt: int, reason: str, response: LLMResponse | None = None) -> Candidate:
    c = Candidate(f"{ctx.path_id}:{attempt}", ctx.path_id, list(ctx.chunk_ids), ctx.hops, "", "", ctx.chunk_ids[0], list(ctx.doc_ids), generator=generator, attempt=attempt, status="discarded", discard_reason=f"generation: {reason}")
    if response is not None:
        c.model, c.prompt_tokens, c.completion_tokens, c.cost_usd, c.latency_s = response.model, response.prompt_tokens, response.completion_tokens, response.cost_usd, response.latency_s
    return c


class ExtractiveGenerator:
    """Deterministic answer-first questions from the graph's entity and keyphrase links (no model needed).

    The answer is an entity or keyphrase of passage 1 that co-occurs in one sentence with the bridge term to
    passage 2 and appears in no later passage; the question quotes a sentence of the last passage and names
    the bridge terms back along the chain. Attempt ``n`` takes the ``n``-th best answer option.
    """

    name = "extractive-v1"
    model = "extractive"

    def generate(self, ctx: PathContext, attempt: int = 0, feedback: str | None = None, call_log: CallLog | None = None) -> Candidate:
        t0 = time.perf_counter()
        if any(not terms for terms in ctx.edge_terms):
            return _failed(ctx, self.name, attempt, "a path edge has no shared term (abstract edge) to phrase a hop with")
        first, last = ctx.texts[0], ctx.texts[-1]
        bridges = _distinct_bridges(ctx)
        if bridges is None:
            return _failed(ctx, self.name, attempt, "the path's edges share no distinct bridge terms, so its hops cannot be told apart")
        t1 = bridges[0]
        k1 = term_key(t1)
        later = "\n".join(ctx.texts[1:])
        bridge_keys = {term_key(b) for b in bridges}
        options: list[tuple[str, str, str]] = []  # (answer, kind, evidence sentence)
        evidence_sents = [s for s in sentences(first) if _contains_term(s, k1)]
        for kind, terms in (("named term", ctx.entities[0]), ("phrase", ctx.keyphrases[0])):
            for term in terms:
                key = term_key(term)
                if not key or key in bridge_keys or k1 in key or key in k1 or len(key.split()) > 6:
                    continue
                if answer_in(term, later) or answer_in(term, ctx.titles[0]):
                    continue
                sent = next((s for s in evidence_sents if _contains_term(s, key)), None)
                if sent is None:
                    continue
                surface = _surface(sent, key) or term
                if all(normalise_answer(surface) != normalise_answer(o[0]) for o in options):
                    options.append((surface, kind, sent))
        if attempt >= len(options):
            return _failed(ctx, self.name, attempt, f"no answer option #{attempt + 1} co-occurs with the bridge term {t1!r} in passage 1")
        options.sort(key=lambda o: len(rival_terms(o[0], o[1], o[2], ctx.entities[0], ctx.keyphrases[0], bridges)))  # unambiguous first (stable)
        answer, kind, evidence = options[attempt]
        clue_options = [s for s in sentences(last) if 6 <= len(s.split()) and not answer_in(answer, s) and not _contains_term(s, k1)]
        if len(bridges) > 0:
            k_last = term_key(bridges[-1])
            clue_options.sort(key=lambda s: (not _contains_term(s, k_last), -min(len(s.split()), 30)))
        if not clue_options:
            return _failed(ctx, self.name, attempt, "the last passage has no sentence usable as a clue")
        clue = _trim(clue_options[0])
        steps = list(reversed(bridges))
        chain = f'Following the term "{steps[0]}" leads to a second passage'
        for i, term in enumerate(steps[1:], start=3):
            chain += f', and following "{term}" from there leads to a {_ORDINALS.get(i, f"{i}th")} passage'
        final = _ORDINALS.get(ctx.hops, f"{ctx.hops}th")
        question = (
            f'In "{ctx.titles[-1]}", one passage states: "{clue}" {chain}. '
            f'In that {final} passage, which {kind} appears in the same sentence as "{t1}"?'
        )
        cand = Candidate(
            f"{ctx.path_id}:{attempt}", ctx.path_id, list(ctx.chunk_ids), ctx.hops, question, answer, ctx.chunk_ids[0], list(ctx.doc_ids),
            bridge_terms=bridges, evidence=evidence, answer_kind=kind, generator=self.name, attempt=attempt, model=self.model,
        )
        cand.latency_s = time.perf_counter() - t0
        if call_log is not None:
            call_log.record("stage3_generate", "generate" if attempt == 0 else "regenerate", LLMResponse("", self.model, 0, 0, cand.latency_s, 0.0), cand.candidate_id)
        return cand


def rival_terms(answer: str, kind: str, evidence: str, entities: Sequence[str], keyphrases: Sequence[str], bridges: Sequence[str]) -> list[str]:
    """Other terms of the answer's kind in the evidence sentence: each one makes the question ambiguous."""
    pool = entities if kind == "named term" else keyphrases
    akey = term_key(answer)
    skip = {term_key(b) for b in bridges}
    out = []
    for term in pool:
        key = term_key(term)
        if not key or key in skip or key == akey or key in akey or akey in key or any(key in b or b in key for b in skip):
            continue
        if _contains_term(evidence, key) and key not in {term_key(o) for o in out}:
            out.append(term)
    return out


def _distinct_bridges(ctx: PathContext) -> list[str] | None:
    """One shared term per edge, all different, preferring terms not in the document title."""
    title = f" {term_key(ctx.titles[0])} "
    used: set[str] = set()
    out = []
    for terms in ctx.edge_terms:
        fresh = [t for t in terms if term_key(t) not in used]
        if not fresh:
            return None
        pick = next((t for t in fresh if f" {term_key(t)} " not in title), fresh[0])
        used.add(term_key(pick))
        out.append(pick)
    return out


def _surface(sentence: str, key: str) -> str | None:
    words = key.split()
    pattern = r"\b" + r"[^A-Za-z0-9]+".join(re.escape(w) for w in words) + r"\b"
    match = re.search(pattern, sentence, flags=re.IGNORECASE)
    return match.group(0) if match else None


_GENERATE_SYSTEM = (
    "You write multi-hop questions for training a search agent. Work answer-first: choose a short answer span "
    "(1-6 words, copied exactly) from PASSAGE 1. Then write one question whose answer is that span and which can "
    "only be answered by reading the passages in order from the LAST passage back to PASSAGE 1: start from a detail "
    "of the last passage and bridge through each passage. The answer must not appear in the question or in the last "
    'passage. Reply as JSON: {"answer": "...", "question": "...", "reasoning": "..."}'
)


class LLMGenerator:
    """One structured JSON call per path through an injected LLMClient; feedback drives the regeneration."""

    def __init__(self, client: LLMClient, max_tokens: int = 384) -> None:
        self.client = client
        self.max_tokens = max_tokens
        self.name = f"llm:{getattr(client, 'model', 'llm')}"

    def generate(self, ctx: PathContext, attempt: int = 0, feedback: str | None = None, call_log: CallLog | None = None) -> Candidate:
        passages = "\n\n".join(f"PASSAGE {i + 1} ({ctx.titles[i]}):\n{text}" for i, text in enumerate(ctx.texts))
        user = passages
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
        return Candidate(
            f"{ctx.path_id}:{attempt}", ctx.path_id, list(ctx.chunk_ids), ctx.hops, question, answer, ctx.chunk_ids[0], list(ctx.doc_ids),
            bridge_terms=[t[0] if t else "" for t in ctx.edge_terms], evidence=sent, generator=self.name, attempt=attempt,
            model=response.model, prompt_tokens=response.prompt_tokens, completion_tokens=response.completion_tokens,
            cost_usd=response.cost_usd, latency_s=response.latency_s,
        )
