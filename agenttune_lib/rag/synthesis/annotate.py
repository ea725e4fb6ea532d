"""Stage 1a: per-chunk entities, keyphrases and a summary, extractively or by an injected LLM."""
from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from agenttune_lib.rag.synthesis.jsonx import JSONExtractionError, extract_json
from agenttune_lib.rag.synthesis.llm import CallLog, LLMClient, call_llm

__all__ = ["Annotation", "ExtractiveAnnotator", "LLMAnnotator", "term_key", "sentences", "STOPWORDS"]

STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before being below between both but by
    can could did do does doing down during each either else etc few for from further had has have having he her here hers him his how
    i if in into is it its itself just may me might more most must my no nor not now of off on once only or other otherwise our out over
    own per same shall she should so some such than that the their them then there these they this those through thus to too under
    until up upon us very was we were what when where whether which while who whom why will with within without would you your
    hereby herein hereof hereto hereunder thereof therein thereto whereas any all one two""".split()
)
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'\-]*")
_CAPSEQ = re.compile(r"\b([A-Z][a-zA-Z0-9&\-]+(?:[ \t]+(?:of|and|for|&)[ \t]+[A-Z][a-zA-Z0-9&\-]+|[ \t]+[A-Z][a-zA-Z0-9&\-]+){1,4})\b")
_QUOTED = re.compile(r"[\"“']([A-Z][A-Za-z0-9\-]+(?: [A-Za-z0-9\-]+){0,4})[\"”']")
_SENT = re.compile(r"(?<=[.!?;])\s+|\n+")


def term_key(term: str) -> str:
    """The normalised form two chunks must share for a term to link them."""
    return " ".join(_WORD.findall(term.lower()))


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT.split(text) if s and s.strip()]


@dataclasses.dataclass
class Annotation:
    """What stage 1 knows about one chunk."""

    chunk_id: str
    entities: list[str]
    keyphrases: list[str]
    summary: str


def _entities(text: str) -> list[str]:
    found: list[str] = []
    for match in _QUOTED.finditer(text):
        found.append(match.group(1).strip())
    for match in _CAPSEQ.finditer(text):
        phrase = match.group(1).strip()
        words = phrase.split()
        if phrase.isupper() and len(words) > 2:  # shouted disclaimers, not names
            continue
        while words and words[0].lower() in STOPWORDS:
            words = words[1:]
        while words and words[-1].lower() in STOPWORDS:
            words = words[:-1]
        if len(words) >= 2 or (words and phrase in [m.group(1) for m in _QUOTED.finditer(text)]):
            found.append(" ".join(words))
    seen: set[str] = set()
    out = []
    for e in found:
        key = term_key(e)
        if key and key not in seen and len(key) > 3:
            seen.add(key)
            out.append(e)
    return out


def _ngrams(text: str, max_n: int = 3) -> list[str]:
    """Candidate keyphrases: 1-3 word runs inside one punctuation-free segment, no stopword at either end."""
    grams = []
    for segment in re.split(r"[^A-Za-z0-9'\-\s]+", text):
        words = [w.lower() for w in _WORD.findall(segment)]
        for n in range(1, max_n + 1):
            for i in range(len(words) - n + 1):
                gram = words[i : i + n]
                if gram[0] in STOPWORDS or gram[-1] in STOPWORDS or any(len(w) < 2 for w in gram):
                    continue
                if (n == 1 and len(gram[0]) < 5) or sum(map(len, gram)) < 5:
                    continue
                grams.append(" ".join(gram))
    return grams


class ExtractiveAnnotator:
    """Capitalised and quoted names as entities, TF-IDF n-grams as keyphrases, the lead sentence as summary."""

    name = "extractive-annotator-v1"

    def __init__(self, keyphrases_per_chunk: int = 8, entities_per_chunk: int = 12) -> None:
        self.keyphrases_per_chunk = keyphrases_per_chunk
        self.entities_per_chunk = entities_per_chunk

    def annotate(self, chunks: Sequence[Any], call_log: CallLog | None = None) -> list[Annotation]:
        grams = [Counter(_ngrams(c.text)) for c in chunks]
        df: Counter[str] = Counter()
        for g in grams:
            df.update(g.keys())
        n = max(1, len(chunks))
        out = []
        for chunk, counts in zip(chunks, grams):
            scored = sorted(counts.items(), key=lambda kv: (-(1 + math.log(kv[1])) * math.log((1 + n) / (1 + df[kv[0]])) * (1 + 0.5 * kv[0].count(" ")), kv[0]))
            picked: list[str] = []
            for gram, _ in scored:
                if df[gram] < 2 and len(chunks) > 1:  # a phrase no other chunk has cannot link anything
                    continue
                if any(gram in p or p in gram for p in picked):
                    continue
                picked.append(gram)
                if len(picked) >= self.keyphrases_per_chunk:
                    break
            sents = sentences(chunk.text)
            summary = (sents[0] if sents else chunk.text)[:240]
            out.append(Annotation(chunk.chunk_id, _entities(chunk.text)[: self.entities_per_chunk], picked, summary))
        return out


_ANNOTATE_PROMPT = (
    "Extract from the passage: up to 10 named entities or defined terms (exact surface form), up to 8 "
    'keyphrases (exact phrases from the text) and a one-sentence summary. Reply as JSON: {"entities": [...], '
    '"keyphrases": [...], "summary": "..."}'
)


class LLMAnnotator:
    """One JSON-mode call per chunk; a malformed reply falls back to the extractive annotation of that chunk."""

    def __init__(self, client: LLMClient) -> None:
        self.client = client
        self.name = f"llm-annotator:{getattr(client, 'model', 'llm')}"
        self._fallback = ExtractiveAnnotator()

    def annotate(self, chunks: Sequence[Any], call_log: CallLog | None = None) -> list[Annotation]:
        fallback = {a.chunk_id: a for a in self._fallback.annotate(chunks)}
        out = []
        for chunk in chunks:
            response = call_llm(self.client, [{"role": "system", "content": _ANNOTATE_PROMPT}, {"role": "user", "content": chunk.text}], json_mode=True, max_tokens=384)
            if call_log is not None:
                call_log.record("stage1_annotate", "annotate", response, chunk.chunk_id)
            try:
                data = extract_json(response.text)
                entities = [str(e) for e in data.get("entities", []) if str(e).strip()]
                keyphrases = [str(k) for k in data.get("keyphrases", []) if str(k).strip()]
                summary = str(data.get("summary", "")).strip() or fallback[chunk.chunk_id].summary
                if not entities and not keyphrases:  # nothing to link chunks with: keep the extractive terms
                    entities, keyphrases = fallback[chunk.chunk_id].entities, fallback[chunk.chunk_id].keyphrases
                out.append(Annotation(chunk.chunk_id, entities, keyphrases, summary))
            except (JSONExtractionError, AttributeError):
                out.append(fallback[chunk.chunk_id])
        return out
