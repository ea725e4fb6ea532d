"""A human-auditable sample of QA items: each item's chain (question, hop passages in order with the bridge
terms in bold, the answer span marked in its passage) and the verification verdicts, as Markdown."""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["audit_sample", "audit_markdown", "VERDICT_CHECKS"]

VERDICT_CHECKS = ("answerability", "chain_dependency", "single_passage", "hidden_bridge", "retrieval_shortcut", "retrieval_necessity")


def audit_sample(items: Sequence[Mapping[str, Any]], n: int = 20) -> list[Mapping[str, Any]]:
    """``n`` items, round-robin over (answer type, hop count) cells in a stable order, so every type and hop
    count a person should look at is in the sample."""
    cells: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for it in sorted(items, key=lambda r: str(r["qa_id"])):
        cells[(str(it.get("answer_type") or ""), int(it["hops"]))].append(it)
    out: list[Mapping[str, Any]] = []
    keys = sorted(cells)
    while len(out) < n and any(cells[k] for k in keys):
        for k in keys:
            if cells[k] and len(out) < n:
                out.append(cells[k].pop(0))
    return out


def _pattern(term: str) -> re.Pattern[str]:
    words = re.findall(r"[A-Za-z0-9]+", term)
    return re.compile(r"(?<![A-Za-z0-9])" + r"[^A-Za-z0-9]+".join(map(re.escape, words)) + r"(?![A-Za-z0-9])", re.IGNORECASE)


def _excerpt(text: str, marks: Sequence[tuple[str, str]], width: int = 600, anchors: Sequence[str] = ()) -> str:
    """The passage around the first of ``anchors`` it contains (else its first marked term), with each term
    wrapped as given (``**x**`` for bridges)."""
    text = " ".join(text.split())
    found = [m.start() for term in anchors if term and re.findall(r"[A-Za-z0-9]+", term) and (m := _pattern(term).search(text))]
    first = found[0] if found else min((m.start() for term, _ in marks if term and (m := _pattern(term).search(text))), default=0)
    lo = max(0, first - width // 2)
    piece = ("…" if lo else "") + text[lo : lo + width] + ("…" if lo + width < len(text) else "")
    for term, wrap in marks:
        if term and re.findall(r"[A-Za-z0-9]+", term):
            piece = _pattern(term).sub(lambda m: wrap.format(m.group(0)), piece)
    return piece.replace("|", "\\|")


def audit_markdown(items: Sequence[Mapping[str, Any]], chunk_text: Mapping[str, str], attempts: Sequence[Mapping[str, Any]] = ()) -> str:
    """Markdown for the given items: question, answer and type, each hop passage in order (bridge terms in bold,
    the answer in bold italics in the last hop, the clue phrases in italics in hop 1) and the verdicts: every
    check passed for the kept attempt, and the reasons earlier attempts of the same path were rejected."""
    rejected: dict[str, list[str]] = defaultdict(list)
    for a in attempts:
        if a.get("status") == "discarded" and a.get("discard_reason"):
            rejected[str(a["path_id"])].append(f"attempt {a['attempt']}: {a['discard_reason']}")
    blocks = []
    for n, it in enumerate(items, 1):
        lines = [f"**{n}. `{it['qa_id']}`** · {it['hops']} hops · {it.get('answer_type') or '?'} · {it.get('split', '')}",
                 f"> **Q:** {it['question']}", f"> **A:** {it['answer']}", ""]
        for hop in it.get("chain") or []:
            marks = [(hop.get("bridge_in") or "", "**{}**"), (hop.get("bridge_out") or "", "**{}**")]
            role = "start" if hop["hop"] == 1 else ("answer" if hop["chunk_id"] == it.get("answer_chunk_id") else "bridge")
            if role == "answer":
                marks.append((str(it["answer"]), "***{}***"))
            if hop.get("clue"):
                marks += [(c, "_{}_") for c in hop["clue"]]
            via = f" via **{hop['bridge_in']}**" if hop.get("bridge_in") else ""
            anchors = [str(it["answer"])] if role == "answer" else [hop.get("bridge_out") or "", *(hop.get("clue") or [])]
            lines.append(f"{hop['hop']}. hop {hop['hop']} ({role}{via}) `{hop['chunk_id'][:15]}`: {_excerpt(chunk_text.get(hop['chunk_id'], ''), marks, anchors=anchors)}")
        lines.append("")
        lines.append("Verdicts: " + ", ".join(f"{c} ✓" for c in VERDICT_CHECKS) + " (kept attempt)")
        for reason in rejected.get(str(it.get("path_id", "")), []):
            lines.append(f"- rejected {reason}")
        blocks.append("\n".join(lines))
    return "\n\n---\n\n".join(blocks)
