"""Score a chat model on BFCL single-turn categories over seeds, with the conditions recorded."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from agenttune_lib.evaluation.bfcl.checker import check_entry_output
from agenttune_lib.evaluation.bfcl.data import BFCLEntry, load_bfcl
from agenttune_lib.evaluation.bfcl.prompt import bfcl_system_prompt, bfcl_system_prompt_template
from agenttune_lib.evaluation.report import aggregate_seeds
from agenttune_lib.evaluation.settings import EvalSettings, serialize_history

__all__ = ["BFCLResult", "ChatGenerate", "run_bfcl", "score_outputs"]

#: ``generate(messages, seed=…, temperature=…, max_new_tokens=…) -> assistant text``.
ChatGenerate = Callable[..., str]


@dataclasses.dataclass
class BFCLResult:
    """Per-category accuracy (mean/spread over seeds), per-item verdicts, and the recorded conditions."""

    categories: dict[str, dict[str, Any]]
    overall: dict[str, Any]
    items: list[dict[str, Any]]
    settings: dict[str, Any]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def score_outputs(entries: Sequence[BFCLEntry], outputs: Sequence[str]) -> list[dict[str, Any]]:
    """Verdicts for pre-generated outputs (the zero-model path): one dict per entry."""
    if len(entries) != len(outputs):
        raise ValueError(f"{len(entries)} entries but {len(outputs)} outputs")
    rows = []
    for entry, text in zip(entries, outputs):
        res = check_entry_output(entry, text)
        rows.append({"id": entry.id, "category": entry.category, "valid": res.valid, "error_type": res.error_type, "error": res.error, "output": text})
    return rows


def run_bfcl(
    generate: ChatGenerate,
    categories: Sequence[str],
    limit: int | None = 10,
    settings: EvalSettings | None = None,
    sample_seed: int | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> BFCLResult:
    """Generate and score ``limit`` entries per category once per seed; accuracy is a mean and spread over seeds.

    ``progress(category, n_done)`` is called after each generation (for a progress bar).
    """
    settings = settings or EvalSettings()
    template = bfcl_system_prompt_template()
    start = time.perf_counter()
    entries = {cat: load_bfcl(cat, limit=limit, sample_seed=sample_seed) for cat in categories}
    per_seed: dict[int, dict[str, float]] = {}
    items: list[dict[str, Any]] = []
    for seed in settings.seeds:
        scores: dict[str, float] = {}
        n_valid = n_total = 0
        for cat, cat_entries in entries.items():
            outputs = []
            for entry in cat_entries:
                messages = serialize_history(bfcl_system_prompt(entry.functions, template), entry.messages, settings)
                outputs.append(generate(messages, seed=seed, temperature=settings.temperature, max_new_tokens=settings.max_new_tokens))
                if progress is not None:
                    progress(cat, 1)
            rows = score_outputs(cat_entries, outputs)
            for row in rows:
                row["seed"] = seed
            items += rows
            valid = sum(r["valid"] for r in rows)
            scores[cat] = valid / len(rows) if rows else float("nan")
            n_valid += valid
            n_total += len(rows)
        scores["overall"] = n_valid / n_total if n_total else float("nan")
        per_seed[seed] = scores
    agg = aggregate_seeds(per_seed)
    overall = agg.pop("overall")
    record = settings.record(template)
    record.update({"benchmark": "bfcl_v4", "limit_per_category": limit, "sample_seed": sample_seed,
                   "n_per_category": {c: len(e) for c, e in entries.items()}})
    return BFCLResult(categories=agg, overall=overall, items=items, settings=record, seconds=time.perf_counter() - start)
