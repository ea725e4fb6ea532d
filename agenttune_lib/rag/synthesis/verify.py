"""Stage 4: closed-loop verification (answerability, chain dependency, single passage, hidden bridge, retrieval
shortcut, retrieval necessity), one targeted regeneration, then the final gate (answer length, near-duplicate
questions, answer diversity). Every rejected candidate keeps its ``discard_reason``."""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agenttune_lib.rag.metrics import answer_in, normalise_answer
from agenttune_lib.rag.synthesis.annotate import STOPWORDS, term_key
from agenttune_lib.rag.synthesis.answers import ANSWER_TYPES, unique_spans
from agenttune_lib.rag.synthesis.generate import Candidate, PathContext
from agenttune_lib.rag.synthesis.jsonx import JSONExtractionError, extract_json
from agenttune_lib.rag.synthesis.llm import CallLog, LLMClient, call_llm

__all__ = ["Verifier", "ExtractiveVerifier", "LLMVerifier", "ChainChecks", "verify_candidates", "answerability_gate", "token_f1", "question_content_words", "CHECKS"]

CHECKS = ("answerability", "chain_dependency", "single_passage", "hidden_bridge", "retrieval_shortcut", "retrieval_necessity")


class Verifier(Protocol):
    def check(self, cand: Candidate, ctx: PathContext, call_log: CallLog | None = None) -> list[str]: ...


def token_f1(prediction: str, gold: str) -> float:
    p, g = normalise_answer(prediction).split(), normalise_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = sum(min(p.count(w), g.count(w)) for w in set(p))
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def hop_texts(cand: Candidate, ctx: PathContext) -> list[str]:
    """The candidate's passages in its hop order (start passage first, answer passage last)."""
    by_id = dict(zip(ctx.chunk_ids, ctx.texts))
    return [by_id[c] for c in cand.gold_chunk_ids]


class ExtractiveVerifier:
    """Lexical checks against the path's passages; returns ``check: detail`` for each failure."""

    name = "extractive-verifier-v2"

    def check(self, cand: Candidate, ctx: PathContext, call_log: CallLog | None = None) -> list[str]:
        failures = []
        if not cand.question.strip() or not cand.answer.strip():
            return ["answerability: empty question or answer"]
        texts = hop_texts(cand, ctx)
        if not answer_in(cand.answer, texts[-1]):
            failures.append("answerability: the answer is not in the answer passage")
        elif cand.answer_type in ANSWER_TYPES and normalise_answer(cand.answer) not in {s.key for s in unique_spans(texts[-1]) if s.answer_type == cand.answer_type}:
            failures.append(f"answerability: ambiguous, the answer passage has another {cand.answer_type.replace('_', ' ')}")
        for i, term in enumerate(cand.bridge_terms[: len(texts) - 1]):
            key = term_key(term)
            if term and not (f" {key} " in f" {term_key(texts[i])} " and f" {key} " in f" {term_key(texts[i + 1])} "):
                failures.append(f"answerability: bridge term {term!r} does not link hop {i + 1} to hop {i + 2}")
                break
        if any(answer_in(cand.answer, t) for t in texts[:-1]):
            failures.append("chain_dependency: an earlier hop contains the answer, so the chain is not needed")
        if answer_in(cand.answer, cand.question):
            failures.append("retrieval_necessity: the answer appears in the question")
        return failures


_ANSWER_SYSTEM = 'Answer the question in at most 8 words. Reply as JSON: {"answer": "..."}. If it cannot be answered, answer "unknown".'


class LLMVerifier:
    """Three model calls per candidate: with all passages in hop order (answerable), with the answer passage
    alone (must fail: single_passage) and closed-book (must fail); a reply matching the gold answer at token
    F1 >= ``threshold`` counts."""

    def __init__(self, client: LLMClient, threshold: float = 0.6) -> None:
        self.client = client
        self.threshold = threshold
        self.name = f"llm-verifier:{getattr(client, 'model', 'llm')}"

    def _ask(self, question: str, passages: Sequence[str], purpose: str, ref: str, call_log: CallLog | None) -> str:
        context = "\n\n".join(f"PASSAGE {i + 1}:\n{p}" for i, p in enumerate(passages))
        user = f"{context}\n\nQUESTION: {question}" if passages else f"QUESTION: {question}"
        response = call_llm(self.client, [{"role": "system", "content": _ANSWER_SYSTEM}, {"role": "user", "content": user}], json_mode=True, max_tokens=48)
        if call_log is not None:
            call_log.record("stage4_verify", purpose, response, ref)
        try:
            data = extract_json(response.text)
            return str(data.get("answer", "")) if isinstance(data, dict) else str(data)
        except JSONExtractionError:
            return response.text.strip()

    def check(self, cand: Candidate, ctx: PathContext, call_log: CallLog | None = None) -> list[str]:
        if not cand.question.strip() or not cand.answer.strip():
            return ["answerability: empty question or answer"]
        texts = hop_texts(cand, ctx)
        failures = []
        full = self._ask(cand.question, texts, "answerability", cand.candidate_id, call_log)
        if token_f1(full, cand.answer) < self.threshold:
            failures.append(f"answerability: with all passages the model answered {full[:60]!r}")
        alone = self._ask(cand.question, texts[-1:], "single_passage", cand.candidate_id, call_log)
        if token_f1(alone, cand.answer) >= self.threshold:
            failures.append("single_passage: the answer passage alone suffices")
        closed = self._ask(cand.question, [], "retrieval_necessity", cand.candidate_id, call_log)
        if token_f1(closed, cand.answer) >= self.threshold:
            failures.append("retrieval_necessity: answered closed-book")
        return failures


_TEMPLATE_WORDS: frozenset[str] | None = None


def _template_words() -> frozenset[str]:
    """Words of the question templates: they carry no evidence, so they never count toward passage overlap."""
    global _TEMPLATE_WORDS
    if _TEMPLATE_WORDS is None:
        from agenttune_lib.rag.synthesis import generate

        text = " ".join(" ".join(v) for v in generate._ASKS.values()) + " " + " ".join(generate._STARTS)
        text += " in start from uses another passage also that turn shares further one last reached defined term phrase name with"
        _TEMPLATE_WORDS = frozenset(term_key(text).split()) | STOPWORDS
    return _TEMPLATE_WORDS


def question_content_words(question: str, title: str = "") -> set[str]:
    """The question's evidence-bearing words: not stopwords, template words or the document's title words."""
    skip = _template_words() | set(term_key(title).split())
    return {w for w in term_key(question).split() if len(w) > 2 and w not in skip}


class ChainChecks:
    """Checks that need more than the path: the question must not name a bridge (hidden_bridge), no single
    passage of the document may hold both the answer and the question's clue (single_passage: at least
    ``overlap`` of the question's content words), and the answer passage must not be in the top ``k`` of any
    backend for the question alone (retrieval_shortcut). Backends are searched in one batch per round, BM25
    first; a candidate that already failed is not searched again, so the dense encoder sees only survivors."""

    def __init__(self, backends: Mapping[str, Any] | None = None, k: int = 8, overlap: float = 0.75) -> None:
        self.backends = dict(backends or {})
        self.k = k
        self.overlap = overlap
        self.fired: Counter[str] = Counter()
        self._words: dict[str, set[str]] = {}
        self._norm: dict[str, str] = {}

    def single_passage(self, cand: Candidate, ctx: PathContext) -> str | None:
        words = question_content_words(cand.question, ctx.titles[0] if ctx.titles else "")
        if not words:
            return None
        akey = f" {normalise_answer(cand.answer)} "
        for text in ctx.doc_texts or ctx.texts:
            norm = self._norm.get(text)
            if norm is None:
                norm = self._norm[text] = f" {normalise_answer(text)} "
            if akey.strip() and akey in norm:
                have = self._words.get(text)
                if have is None:
                    have = self._words[text] = set(term_key(text).split())
                share = len(words & have) / len(words)
                if share >= self.overlap:
                    return f"single_passage: one passage holds the answer and {share:.0%} of the question's content words"
        return None

    def __call__(self, cands: Sequence[Candidate], contexts: Mapping[str, PathContext]) -> list[list[str]]:
        out: list[list[str]] = [[] for _ in cands]
        for i, cand in enumerate(cands):
            qkey = f" {term_key(cand.question)} "
            named = next((b for b in cand.bridge_terms if b and f" {term_key(b)} " in qkey), None)
            if named:
                out[i].append(f"hidden_bridge: the question names the bridge term {named!r}")
            reason = self.single_passage(cand, contexts[cand.path_id])
            if reason:
                out[i].append(reason)
        for name, backend in sorted(self.backends.items(), key=lambda kv: kv[0] != "bm25"):  # cheap lexical search first
            todo = [i for i in range(len(cands)) if not out[i]]  # a candidate already rejected needs no (dense) search
            if not todo:
                break
            questions = [cands[i].question for i in todo]
            results = backend.search_many(questions, self.k) if hasattr(backend, "search_many") else [backend.search(q, self.k) for q in questions]
            for i, hits in zip(todo, results):
                if cands[i].answer_chunk_id in {h["chunk_id"] for h in hits[: self.k]}:
                    out[i].append(f"retrieval_shortcut: the answer passage is in the top {self.k} of {name} for the question alone")
        for failures in out:
            self.fired.update(f.split(":")[0] for f in failures)
        return out


def _check_all(cands: Sequence[Candidate], contexts: Mapping[str, PathContext], verifier: Any, chain_checks: Any, call_log: CallLog | None) -> list[list[str]]:
    failures = [verifier.check(c, contexts[c.path_id], call_log) for c in cands]
    if chain_checks is not None:
        for f, extra in zip(failures, chain_checks(cands, contexts)):
            f.extend(extra)
    return failures


def verify_candidates(candidates: Sequence[Candidate], contexts: dict[str, PathContext], verifier: Any, generator: Any, call_log: CallLog | None = None,
                      chain_checks: Any = None) -> list[Candidate]:
    """Check each candidate (the verifier's checks, then ``chain_checks`` in one batch); a failed one gets one
    regeneration with the failure as feedback. Returns every attempt: passing ones with status ``verified``,
    the rest ``discarded`` with their first reason."""
    out: list[Candidate] = []
    live = [c for c in candidates if c.status != "discarded"]  # generation itself failed: nothing to regenerate from
    first = dict(zip((c.candidate_id for c in live), _check_all(live, contexts, verifier, chain_checks, call_log)))
    retries: list[Candidate] = []
    for cand in candidates:
        out.append(cand)
        if cand.status == "discarded":
            continue
        failures = first[cand.candidate_id]
        if not failures:
            cand.status = "verified"
            continue
        cand.status, cand.discard_reason = "discarded", failures[0]
        retry = generator.generate(contexts[cand.path_id], attempt=cand.attempt + 1, feedback=failures[0], call_log=call_log)
        if retry.status == "discarded":
            retry.discard_reason = f"{failures[0]} (regeneration: {retry.discard_reason})"
            out.append(retry)
            continue
        retries.append(retry)
    for retry, failures in zip(retries, _check_all(retries, contexts, verifier, chain_checks, call_log)):
        if failures:
            retry.status, retry.discard_reason = "discarded", f"{failures[0]} (after regeneration)"
        else:
            retry.status = "verified"
        out.append(retry)
    return out


def answerability_gate(candidates: Sequence[Candidate], answer_text: dict[str, str], max_answer_words: int = 8, near_duplicate: float = 92.0,
                       max_same_answer: int = 1) -> list[Candidate]:
    """The final gate over verified candidates: answer short and present in its passage, question not a
    near-duplicate of a kept one (rapidfuzz token-sort ratio >= ``near_duplicate``), and no answer kept more
    than ``max_same_answer`` times (so the set cannot be learned as a prior such as "30 days"). Candidates are
    gated longest chain first (stable within a hop count); the returned list keeps the input order."""
    from rapidfuzz import fuzz, process

    kept_questions: list[str] = []
    answers: Counter[str] = Counter()
    for cand in sorted(candidates, key=lambda c: -c.hops):  # longer chains first: they are rarer, so they get first claim on an answer
        if cand.status != "verified":
            continue
        qkey = normalise_answer(cand.question)
        akey = normalise_answer(cand.answer)
        if len(cand.answer.split()) > max_answer_words:
            cand.status, cand.discard_reason = "discarded", f"gate: answer longer than {max_answer_words} words"
        elif not answer_in(cand.answer, answer_text.get(cand.answer_chunk_id, "")):
            cand.status, cand.discard_reason = "discarded", "gate: the answer is not in its gold passage"
        elif kept_questions and (match := process.extractOne(qkey, kept_questions, scorer=fuzz.token_sort_ratio, score_cutoff=near_duplicate)):
            cand.status, cand.discard_reason = "discarded", f"gate: near-duplicate question (rapidfuzz {match[1]:.0f} >= {near_duplicate:.0f})"
        elif answers[akey] >= max_same_answer:
            cand.status, cand.discard_reason = "discarded", f"gate: answer already kept {answers[akey]} time(s) (diversity cap {max_same_answer})"
        else:
            cand.status = "kept"
            kept_questions.append(qkey)
            answers[akey] += 1
    return list(candidates)
