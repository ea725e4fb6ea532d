"""Deterministic tools the bundled templates call from tool_call stages (spine BaseTools via ``as_tool``)."""
from __future__ import annotations

import difflib
import re
import unicodedata
from typing import Any

__all__ = ["default_tools", "fuzzy_match", "ratio", "keyword_hits"]


def _norm(text: Any) -> str:
    """Lowercase ASCII tokens, sorted, so word order and accents do not matter."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode()
    return " ".join(sorted(re.sub(r"[^a-z0-9 ]+", " ", text.lower()).split()))


def fuzzy_match(query: str, candidates: list, threshold: float = 0.85) -> dict:
    """Best fuzzy match of a name against a list (difflib ratio over normalized tokens).

    Args:
        query: the name to screen.
        candidates: names to screen against.
        threshold: similarity at or above which a candidate counts as a hit.
    """
    q = _norm(query)
    best, best_score = None, 0.0
    hits = []
    for cand in candidates:
        c = _norm(cand)
        score = difflib.SequenceMatcher(None, q, c).ratio() if q and c else 0.0
        if score > best_score:
            best, best_score = cand, score
        if score >= threshold:
            hits.append(cand)
    return {"best_match": best, "score": round(best_score, 4), "hit": best_score >= threshold, "hits": hits}


def ratio(numerator: float, denominator: float) -> dict:
    """numerator / denominator, e.g. a debt-to-income ratio.

    Args:
        numerator: the dividend.
        denominator: the divisor; must not be zero.
    """
    num, den = float(numerator), float(denominator)
    if den == 0:
        raise ValueError("denominator is zero")
    return {"value": round(num / den, 6)}


def keyword_hits(text: str, keywords: list) -> dict:
    """Which keywords occur in a text (case-insensitive, whole words).

    Args:
        text: the text to scan.
        keywords: words or phrases to look for.
    """
    low = str(text).lower()
    found = [k for k in keywords if re.search(r"\b" + re.escape(str(k).lower()) + r"\b", low)]
    return {"count": len(found), "found": found}


def default_tools() -> dict[str, Any]:
    """The bundled templates' tools as spine BaseTools; a runner's own ``tools=`` override these by name."""
    from agenttune_lib.tools import as_tool

    return {fn.__name__: as_tool(fn) for fn in (fuzzy_match, ratio, keyword_hits)}

