"""Stage 5: a hop-count x retrieval-difficulty matrix; retrieval ease is the power mean (p = -3) of the
question's cosine similarity to each gold chunk, so one hard hop dominates."""
from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["power_mean", "retrieval_difficulty", "assign_difficulty", "difficulty_matrix", "balanced_resample", "LEVELS"]

LEVELS = ("easy", "medium", "hard")


def power_mean(values: Sequence[float], p: float = -3.0, eps: float = 1e-3) -> float:
    """(mean x^p)^(1/p) over values clipped to [eps, 1]; p < 0 weights the smallest value most."""
    x = np.clip(np.asarray(values, dtype=np.float64), eps, 1.0)
    if x.size == 0:
        return 0.0
    if p == 0:
        return float(np.exp(np.mean(np.log(x))))
    return float(np.mean(x**p) ** (1.0 / p))


def retrieval_difficulty(question_vec: np.ndarray, gold_vecs: np.ndarray, p: float = -3.0) -> float:
    """1 - power_mean(cos(question, gold_i)): high when some gold chunk is far from the question."""
    from agenttune_lib.rag.embedding import normalise_rows

    sims = normalise_rows(np.asarray(gold_vecs, dtype=np.float32)) @ normalise_rows(np.asarray(question_vec, dtype=np.float32))[0]
    return 1.0 - power_mean(sims.tolist(), p)


def assign_difficulty(rows: list[dict[str, Any]], question_vecs: np.ndarray, chunk_vec: Callable[[str], np.ndarray], hops_range: tuple[int, int] = (2, 5), p: float = -3.0) -> list[dict[str, Any]]:
    """Add retrieval_difficulty, retrieval_level (tertiles), difficulty (0..1) and difficulty_cell to each row."""
    if not rows:
        return rows
    scores = [retrieval_difficulty(q, np.stack([chunk_vec(c) for c in r["gold_chunk_ids"]]), p) for r, q in zip(rows, question_vecs)]
    lo_cut, hi_cut = np.quantile(scores, [1 / 3, 2 / 3]) if len(scores) >= 3 else (min(scores), max(scores))
    lo, hi = hops_range
    ranks = np.argsort(np.argsort(scores)) / max(1, len(scores) - 1)
    for row, score, rank in zip(rows, scores, ranks):
        level = "easy" if score <= lo_cut else ("medium" if score <= hi_cut else "hard")
        row["retrieval_difficulty"] = round(float(score), 6)
        row["retrieval_level"] = level
        row["difficulty"] = round(0.5 * (row["hops"] - lo) / max(1, hi - lo) + 0.5 * float(rank), 6)
        row["difficulty_cell"] = f"{row['hops']}-hop/{level}"
    return rows


def difficulty_matrix(rows: Sequence[dict[str, Any]], hops_range: tuple[int, int] = (2, 5)) -> dict[str, dict[str, int]]:
    """Counts per hop count (rows) and retrieval level (columns)."""
    matrix = {f"{h}-hop": {lvl: 0 for lvl in LEVELS} for h in range(hops_range[0], hops_range[1] + 1)}
    for r in rows:
        matrix.setdefault(f"{r['hops']}-hop", {lvl: 0 for lvl in LEVELS})[r["retrieval_level"]] += 1
    return matrix


def balanced_resample(rows: Sequence[dict[str, Any]], per_cell: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Downsample every matrix cell to ``per_cell`` (default: the median non-empty cell size); never duplicates."""
    cells: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        cells[r["difficulty_cell"]].append(r)
    if not cells:
        return []
    cap = per_cell or int(np.median([len(v) for v in cells.values()]))
    rng = random.Random(seed)
    out = []
    for key in sorted(cells):
        members = cells[key]
        out.extend(members if len(members) <= cap else rng.sample(members, cap))
    return out
