"""Stage 4: closed-loop verification (answerability, chain dependency, retrieval necessity), one targeted
regeneration, then the final answerability gate. Every rejected candidate keeps its ``discard_reason``."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from agenttune_lib.rag.metrics import answer_in, normalise_answer
from agenttune_lib.rag.synthesis.annotate import term_key
from agenttune_lib.rag.synthesis.generate import Candidate, PathContext, rival_terms
from agenttune_lib.rag.synthesis.jsonx import JSONExtractionError, extract_json
from agenttune_lib.rag.synthesis.llm import CallLog, LLMClient, call_llm

__all__ = ["Verifier", "ExtractiveVerifier", "LLMVerifier", "verify_candidates", "answerability_gate", "token_f1", "CHECKS"]

CHECKS = ("answerability", "chain_dependency", "retrieval_necessity")


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


class ExtractiveVerifier:
    """Lexical checks against the path's passages; returns ``check: detail`` for each failure."""

    name = "extractive-verifier-v1"

    def check(self, cand: Candidate, ctx: PathContext, call_log: CallLog | None = None) -> list[str]:
        failures = []
        if not cand.question.strip() or not cand.answer.strip():
            return ["answerability: empty question or answer"]
        if not answer_in(cand.answer, ctx.texts[0]):
            failures.append("answerability: the answer is not in the answer passage")
        elif cand.answer_kind and cand.evidence:
            rivals = rival_terms(cand.answer, cand.answer_kind, cand.evidence, ctx.entities[0], ctx.keyphrases[0], cand.bridge_terms)
            if rivals:
                failures.append(f"answerability: ambiguous, the evidence sentence also names {rivals[0]!r}")
        for i, term in enumerate(cand.bridge_terms[: ctx.hops - 1]):
            key = term_key(term)
            if term and not (f" {key} " in f" {term_key(ctx.texts[i])} " and f" {key} " in f" {term_key(ctx.texts[i + 1])} "):
                failures.append(f"answerability: bridge term {term!r} does not link hop {i + 1} to hop {i + 2}")
                break
        if answer_in(cand.answer, ctx.texts[-1]):
            failures.append("chain_dependency: the last hop alone contains the answer")
        elif any(answer_in(cand.answer, t) for t in ctx.texts[1:-1]):
            failures.append("chain_dependency: an intermediate hop contains the answer, so the chain is not needed")
        if answer_in(cand.answer, cand.question):
            failures.append("retrieval_necessity: the answer appears in the question")
        return failures


_ANSWER_SYSTEM = 'Answer the question in at most 8 words. Reply as JSON: {"answer": "..."}. If it cannot be answered, answer "unknown".'


class LLMVerifier:
    """Three model calls per candidate: with all passages (answerable), closed-book (must fail) and with
    only the last passage (must fail); a reply matching the gold answer at token F1 >= ``threshold`` counts."""

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
        failures = []
        full = self._ask(cand.question, ctx.texts, "answerability", cand.candidate_id, call_log)
        if token_f1(full, cand.answer) < self.threshold:
            failures.append(f"answerability: with all passages the model answered {full[:60]!r}")
        last = self._ask(cand.question, ctx.texts[-1:], "chain_dependency", cand.candidate_id, call_log)
        if token_f1(last, cand.answer) >= self.threshold:
            failures.append("chain_dependency: the last hop alone suffices")
        closed = self._ask(cand.question, [], "retrieval_necessity", cand.candidate_id, call_log)
        if token_f1(closed, cand.answer) >= self.threshold:
            failures.append("retrieval_necessity: answered closed-book")
        return failures


def verify_candidates(candidates: Sequence[Candidate], contexts: dict[str, PathContext], verifier: Any, generator: Any, call_log: CallLog | None = None) -> list[Candidate]:
    """Check each candidate; a failed one gets one regeneration with the failure as feedback. Returns every
    attempt: passing ones with status ``verified``, the rest ``discarded`` with their reasons."""
    out: list[Candidate] = []
    for cand in candidates:
        ctx = contexts[cand.path_id]
        if cand.status == "discarded":  # generation itself failed; nothing to regenerate from
            out.append(cand)
            continue
        failures = verifier.check(cand, ctx, call_log)
        if not failures:
            cand.status = "verified"
            out.append(cand)
            continue
        cand.status, cand.discard_reason = "discarded", failures[0]
        out.append(cand)
        retry = generator.generate(ctx, attempt=cand.attempt + 1, feedback=failures[0], call_log=call_log)
        if retry.status == "discarded":
            retry.discard_reason = f"{failures[0]} (regeneration: {retry.discard_reason})"
            out.append(retry)
            continue
        retry_failures = verifier.check(retry, ctx, call_log)
        if retry_failures:
            retry.status, retry.discard_reason = "discarded", f"{retry_failures[0]} (after regeneration)"
        else:
            retry.status = "verified"
        out.append(retry)
    return out


def answerability_gate(candidates: Sequence[Candidate], answer_text: dict[str, str], max_answer_words: int = 8) -> list[Candidate]:
    """The final gate over verified candidates: answer short and present in its passage, question unique."""
    seen: set[str] = set()
    for cand in candidates:
        if cand.status != "verified":
            continue
        qkey = normalise_answer(cand.question)
        if len(cand.answer.split()) > max_answer_words:
            cand.status, cand.discard_reason = "discarded", f"gate: answer longer than {max_answer_words} words"
        elif not answer_in(cand.answer, answer_text.get(cand.answer_chunk_id, "")):
            cand.status, cand.discard_reason = "discarded", "gate: the answer is not in its gold passage"
        elif qkey in seen:
            cand.status, cand.discard_reason = "discarded", "gate: duplicate question"
        else:
            cand.status = "kept"
            seen.add(qkey)
    return list(candidates)
