"""Format-insensitive patterns for a listed personal value: wherever it reappears, however it is written.

A model or a tool rarely copies a value byte for byte: "Maria López" comes back as "LOPEZ, Maria", a date of
birth 1988-04-12 as "12/04/1988" or "April 12, 1988", a phone +34 612 345 678 as "612-345-678", an income
54000 as "54,000". Exact-string masking misses all of these; these patterns do not.
"""
from __future__ import annotations

import datetime as dt
import itertools
import re
import unicodedata
from typing import Any

__all__ = ["value_patterns", "fold"]

#: Letters that may come back with or without an accent.
_ACCENTS = {
    "a": "aáàâäãåā", "e": "eéèêëē", "i": "iíìîïī", "o": "oóòôöõøō", "u": "uúùûüū",
    "n": "nñ", "c": "cç", "s": "sšś", "z": "zžź", "y": "yýÿ", "l": "lł",
}
_BOUND_L = r"(?<![0-9A-Za-z\u00C0-\u024F])"
_BOUND_R = r"(?![0-9A-Za-z\u00C0-\u024F])"
_DIGIT_SEP = r"[\s.,\-/()']{0,2}"
_NO_LEFT = "\x00noleft\x00"
_WORD_SEP = r"[\W_]+"
_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"]
_DATE_FORMATS = ("%Y-%m-%d", "%d/%m/%Y", "%m/%d/%Y", "%d.%m.%Y", "%Y/%m/%d", "%d-%m-%Y", "%Y%m%d", "%d %B %Y", "%B %d, %Y", "%B %d %Y", "%d %b %Y", "%b %d, %Y")
MIN_CHARS = 4


def fold(text: str) -> str:
    """Lower case without accents: what two spellings of one value share."""
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).lower()


def _letter(ch: str) -> str:
    base = fold(ch)
    if base in _ACCENTS:
        return "[" + _ACCENTS[base] + _ACCENTS[base].upper() + "]"
    return re.escape(ch)


def _word(token: str) -> str:
    return "".join(_letter(c) if c.isalpha() else re.escape(c) for c in fold(token))


def _digits_pattern(chars: str) -> str:
    return _DIGIT_SEP.join(_letter(c) if c.isalpha() else re.escape(c) for c in chars)


def _parse_date(text: str) -> dt.date | None:
    for fmt in _DATE_FORMATS:
        try:
            return dt.datetime.strptime(text.strip(), fmt).date()
        except ValueError:
            continue
    return None


def _date_patterns(day: dt.date) -> list[str]:
    d = rf"0?{day.day}" if day.day < 10 else str(day.day)
    m = rf"0?{day.month}" if day.month < 10 else str(day.month)
    y = rf"(?:{str(day.year)[:2]})?{str(day.year)[2:]}"
    sep = r"\s*[./\-\s]\s*"
    ordinal = r"(?:st|nd|rd|th)?"
    month = _MONTHS[day.month - 1]
    mname = rf"(?:{month}|{month[:3]}\.?)"
    return [
        rf"{day.year}{sep}{m}{sep}{d}",
        rf"{d}{sep}{m}{sep}{y}",
        rf"{m}{sep}{d}{sep}{y}",
        rf"{day.year}{day.month:02d}{day.day:02d}",
        rf"{d}{ordinal}\s*(?:of\s+)?{mname},?\s*{y}",
        rf"{mname}\s*{d}{ordinal},?\s*{y}",
    ]


def value_patterns(value: Any, field: str = "") -> list[re.Pattern[str]]:
    """Case-, accent-, spacing- and format-insensitive regexes matching ``value`` as it may be rewritten.

    Values shorter than four letters or digits give none (they would mask unrelated text). Names (a field
    whose key contains ``name``) also match in any word order and by each part of three letters or more.
    """
    if value is None or isinstance(value, bool):
        return []
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    alnum = "".join(c for c in text if c.isalnum())
    if len(alnum) < MIN_CHARS:
        return []
    sources: list[str] = []
    day = _parse_date(text) if not isinstance(value, (int, float)) else None
    if day is not None:
        sources += _date_patterns(day)
    digits = sum(c.isdigit() for c in alnum)
    if digits >= MIN_CHARS and digits * 2 >= len(alnum):
        sources.append(_digits_pattern(alnum))
        if text.lstrip().startswith(("+", "00")) and digits >= 10:
            # A phone written without (or with another spelling of) its country code: no left boundary.
            sources.append(_NO_LEFT + _digits_pattern(alnum[-9:]))
    else:
        tokens = re.findall(r"\w+", text)
        if tokens:
            sources.append(_WORD_SEP.join(_word(t) for t in tokens))
            if "name" in field.lower() and 1 < len(tokens) <= 4:
                for perm in itertools.permutations(tokens):
                    sources.append(_WORD_SEP.join(_word(t) for t in perm))
            if "name" in field.lower():
                sources += [_word(t) for t in tokens if len(t) >= 3]
    seen: set[str] = set()
    out = []
    for src in sorted(sources, key=len, reverse=True):
        if src not in seen:
            seen.add(src)
            left = "" if src.startswith(_NO_LEFT) else _BOUND_L
            out.append(re.compile(left + src.removeprefix(_NO_LEFT) + _BOUND_R, re.IGNORECASE))
    return out
