"""Typed answer spans a lawyer would ask for (defined terms, durations and notice periods, amounts, percentages,
dates, parties, governing law, venue, section references), found with pattern rules.

Pattern rules, not a statistical NER, because contract text is formulaic for exactly these types ("thirty (30)
days", "governed by the laws of the State of X", ``"Software" means``, "Acme, Inc.") and rules run over the whole
corpus in well under a second; spaCy's small English NER (``en_core_web_sm``) took ~20 s per 300 chunks on the
shared 2-core machine and labels defined terms such as "Software" as ORG, which would make wrong answers.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

from agenttune_lib.rag.metrics import normalise_answer

__all__ = ["TypedSpan", "ANSWER_TYPES", "extract_spans", "unique_spans"]

ANSWER_TYPES = ("defined_term", "notice_period", "duration", "amount", "percentage", "date", "party", "governing_law", "venue", "section_ref")

_NUMWORD = r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|twenty|thirty|forty|forty-five|fifty|sixty|ninety|hundred|one hundred(?: and twenty| eighty)?)"
_UNIT = r"(?:calendar |business |working )?(?:days?|weeks?|months?|years?|hours?)"
_DURATION = re.compile(rf"\b(?:{_NUMWORD}\s*\(\d{{1,4}}\)|{_NUMWORD}|\d{{1,4}})[\s-]+{_UNIT}\b", re.IGNORECASE)
_PERCENT = re.compile(rf"\b(?:{_NUMWORD}\s+(?:percent|per cent)\s*\(\d+(?:\.\d+)?\s?%\)|\d+(?:\.\d+)?\s?(?:%|percent\b|per cent\b))", re.IGNORECASE)
_AMOUNT = re.compile(r"(?:\b(?:US|U\.S\.|USD|EUR|GBP|CAD|AUD)\s?)?[$€£]\s?\d(?:[\d,]*\d)?(?:\.\d+)?(?:\s(?:million|thousand|billion))?|\b\d(?:[\d,]*\d)?(?:\.\d+)?\s(?:USD|EUR|GBP|US dollars|dollars|euros|pounds)\b")
_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
_DATE = re.compile(rf"\b(?:{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}|\d{{1,2}}(?:st|nd|rd|th)?\s+(?:day\s+of\s+)?{_MONTH},?\s+\d{{4}}|\d{{4}}-\d{{2}}-\d{{2}})\b")
_SUFFIX = r"(?:Inc|Incorporated|Ltd|Limited|LLC|L\.L\.C|GmbH|Corporation|Corp|Company|AG|S\.A|B\.V|plc|PLC|AB|Oy|SAS|S\.r\.l|Pty Ltd|LLP|Co)\.?"
_PARTY = re.compile(rf"\b((?:[A-Z][A-Za-z0-9&\-]+|[A-Z]{{2,}})(?:\s+(?:[A-Z][A-Za-z0-9&\-]+|of|and|&)){{0,5}},?\s+{_SUFFIX})(?![A-Za-z])")
_PLACE = r"((?:the\s+)?(?:State|Commonwealth|Province|Republic|Federal Republic|Kingdom|Canton)\s+of\s+[A-Z][A-Za-z]+(?:\s+[A-Z][A-Za-z]+){0,2}|[A-Z][A-Za-z]+(?:\s+(?:and\s+)?[A-Z][A-Za-z]+){0,3})"
_LAW = re.compile(rf"\blaws?\s+(?:in\s+force\s+in\s+|of\s+)(?:the\s+)?{_PLACE}")
_VENUE = re.compile(rf"\b(?i:courts?)\s+(?:(?:located|sitting|situated)\s+)?(?:in|of|for)\s+(?:the\s+)?(?:(?i:city|county)\s+of\s+)?{_PLACE}")
_SECTION = re.compile(r"\b(?:Sections?|Articles?|Clauses?|Paragraphs?)\s+\d+(?:\.\d+){0,3}(?:\s?\([a-z0-9]{1,4}\))?", re.IGNORECASE)
_QUOTE = r"[\"“”']"
_DEFINED = re.compile(rf"(?:\(\s*(?:the\s+|each\s+a\s+|a\s+|an\s+|hereinafter\s+(?:referred\s+to\s+as\s+)?(?:the\s+)?)?{_QUOTE}([A-Z][A-Za-z0-9\-]+(?:\s+[A-Za-z0-9\-]+){{0,4}}){_QUOTE}|{_QUOTE}([A-Z][A-Za-z0-9\-]+(?:\s+[A-Za-z0-9\-]+){{0,4}}){_QUOTE}\s+(?:means|shall\s+mean|refers\s+to|has\s+the\s+meaning|shall\s+have\s+the\s+meaning))")
_PLACE_STOP = {"the", "this", "such", "any", "all", "its", "which", "that", "agreement", "license", "licence", "terms", "software", "these", "you", "your"}


@dataclasses.dataclass(frozen=True)
class TypedSpan:
    """One typed answer candidate: its exact surface text, type and character offset in its passage."""

    text: str
    answer_type: str
    start: int

    @property
    def key(self) -> str:
        return normalise_answer(self.text)


def _sentence_around(text: str, start: int, end: int) -> str:
    left = max(text.rfind(". ", 0, start), text.rfind("\n", 0, start), text.rfind("; ", 0, start))
    right_candidates = [i for i in (text.find(". ", end), text.find("\n", end), text.find("; ", end)) if i >= 0]
    return text[left + 1 : min(right_candidates) if right_candidates else len(text)]


def _place_ok(place: str) -> bool:
    words = place.split()
    return bool(words) and words[0].lower() not in _PLACE_STOP and not any(w.lower() in {"agreement", "license", "licence", "software"} for w in words)


def _iter_spans(text: str) -> Iterator[TypedSpan]:
    for m in _DEFINED.finditer(text):
        term = (m.group(1) or m.group(2)).strip()
        if len(term) > 2:
            yield TypedSpan(term, "defined_term", m.start(1) if m.group(1) else m.start(2))
    for m in _DURATION.finditer(text):
        sentence = _sentence_around(text, m.start(), m.end()).lower()
        kind = "notice_period" if "notice" in sentence or "prior written" in sentence else "duration"
        yield TypedSpan(m.group(0).strip(), kind, m.start())
    for m in _PERCENT.finditer(text):
        yield TypedSpan(m.group(0).strip(), "percentage", m.start())
    for m in _AMOUNT.finditer(text):
        yield TypedSpan(m.group(0).strip(), "amount", m.start())
    for m in _DATE.finditer(text):
        yield TypedSpan(m.group(0).strip(), "date", m.start())
    for m in _PARTY.finditer(text):
        name = m.group(1).strip()
        words = name.split()
        shouted = sum(w.isupper() and len(w) > 3 for w in words)
        if words[0].lower() not in {"the", "this", "any", "such", "each", "all"} and shouted <= 2:
            yield TypedSpan(name, "party", m.start(1))
    for m in _LAW.finditer(text):
        sentence = _sentence_around(text, m.start(), m.end()).lower()
        place = m.group(1).strip()
        if ("govern" in sentence or "construed" in sentence) and _place_ok(place):
            yield TypedSpan(place, "governing_law", m.start(1))
    for m in _VENUE.finditer(text):
        place = m.group(1).strip()
        if _place_ok(place):
            yield TypedSpan(place, "venue", m.start(1))
    for m in _SECTION.finditer(text):
        yield TypedSpan(m.group(0).strip(), "section_ref", m.start())


def extract_spans(text: str) -> list[TypedSpan]:
    """Every typed span of a passage, at most one per (type, normalised text), in order of appearance."""
    seen: set[tuple[str, str]] = set()
    out = []
    for span in sorted(_iter_spans(text), key=lambda s: s.start):
        key = (span.answer_type, span.key)
        if span.key and key not in seen:
            seen.add(key)
            out.append(span)
    return out


def unique_spans(text: str) -> list[TypedSpan]:
    """Spans that are the only value of their type in the passage, so "what <type> does it state" has one answer.
    Durations and notice periods count as one family (a question about a period must not have two answers)."""
    spans = extract_spans(text)
    family = lambda t: "period" if t in ("duration", "notice_period") else t  # noqa: E731
    counts: dict[str, int] = {}
    for s in spans:
        counts[family(s.answer_type)] = counts.get(family(s.answer_type), 0) + 1
    return [s for s in spans if counts[family(s.answer_type)] == 1]
