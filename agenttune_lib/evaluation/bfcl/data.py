"""BFCL v4 test entries and ground truth, read from the files the ``bfcl-eval`` package ships (Apache-2.0)."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import random
from pathlib import Path
from typing import Any

__all__ = ["KNOWN_INCONSISTENT_GROUND_TRUTH", "AST_CATEGORIES", "RELEVANCE_CATEGORIES", "SINGLE_TURN_CATEGORIES", "BFCLEntry", "bfcl_data_dir", "load_bfcl"]

#: Single-turn Python categories scored by AST matching against ``possible_answer``.
AST_CATEGORIES: tuple[str, ...] = (
    "simple_python", "multiple", "parallel", "parallel_multiple",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
)
#: Categories scored by whether any call was made (irrelevance: none is correct).
RELEVANCE_CATEGORIES: tuple[str, ...] = ("irrelevance", "live_irrelevance", "live_relevance")
SINGLE_TURN_CATEGORIES: tuple[str, ...] = AST_CATEGORIES + RELEVANCE_CATEGORIES

#: Entries of bfcl-eval 2026.3.23 whose ground truth contradicts the offered function (a required
#: parameter has no acceptable value, or an answer parameter is undocumented): no output can pass,
#: under BFCL's own checker as under ours. They stay in the scored set, as BFCL keeps them.
KNOWN_INCONSISTENT_GROUND_TRUTH: frozenset[str] = frozenset({
    "live_simple_106-63-0", "live_simple_112-68-0",
    "live_multiple_507-149-4", "live_multiple_862-181-3", "live_multiple_964-207-0",
})


@dataclasses.dataclass(frozen=True)
class BFCLEntry:
    """One BFCL test: the conversation turns, the offered functions, and the acceptable answers (None for relevance)."""

    id: str
    category: str
    question: list[list[dict[str, Any]]]
    functions: list[dict[str, Any]]
    ground_truth: list[dict[str, dict[str, list[Any]]]] | None

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The single-turn conversation (first turn's messages)."""
        return [dict(m) for m in self.question[0]]


def bfcl_data_dir() -> Path:
    """The ``bfcl_eval/data`` folder, found without importing the package (its checker imports provider SDKs)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "BFCL data needs the bfcl-eval package: pip install --no-deps bfcl-eval==2026.3.23"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data"
    if not path.is_dir():
        raise FileNotFoundError(f"bfcl-eval is installed but has no data folder at {path}")
    return path


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path.name} line {n}: not JSON ({exc})") from None
    return rows


@functools.lru_cache(maxsize=32)
def _load_all(category: str) -> tuple[BFCLEntry, ...]:
    if category not in SINGLE_TURN_CATEGORIES:
        raise ValueError(f"unknown or unsupported BFCL category {category!r}; supported: {list(SINGLE_TURN_CATEGORIES)}")
    root = bfcl_data_dir()
    entries = _read_jsonl(root / f"BFCL_v4_{category}.json")
    answers: list[dict[str, Any]] | None = None
    if category in AST_CATEGORIES:
        answers = _read_jsonl(root / "possible_answer" / f"BFCL_v4_{category}.json")
        if len(answers) != len(entries):
            raise ValueError(f"BFCL {category}: {len(entries)} entries but {len(answers)} answers")
    out = []
    for i, e in enumerate(entries):
        gt = answers[i]["ground_truth"] if answers is not None else None
        out.append(BFCLEntry(id=e["id"], category=category, question=e["question"], functions=e["function"], ground_truth=gt))
    return tuple(out)


def load_bfcl(category: str, limit: int | None = None, sample_seed: int | None = None) -> list[BFCLEntry]:
    """Entries of one category; ``limit`` takes the first n, or a seeded random sample of n with ``sample_seed``."""
    entries = list(_load_all(category))
    if limit is not None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if sample_seed is not None:
            entries = sorted(random.Random(sample_seed).sample(entries, min(limit, len(entries))), key=lambda e: e.id)
        else:
            entries = entries[:limit]
    return entries
