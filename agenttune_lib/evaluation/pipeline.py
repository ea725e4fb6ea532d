"""Which models need a report, evaluating them, and the before/after plot: what the evaluation_report asset calls."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agenttune_lib.evaluation.report_model import EvaluationConfig, EvaluationReport, evaluate_model, latest_report

__all__ = ["ModelTarget", "evaluate_targets", "pending_targets", "plot_reports"]


@dataclasses.dataclass(frozen=True)
class ModelTarget:
    """A model to evaluate: the base checkpoint alone, or an adapter applied to it."""

    adapter_id: str
    model_kind: str
    base_model: str
    base_path: str
    adapter_path: str | None = None


def pending_targets(
    warehouse: Any,
    base_id: str,
    base_path: str,
    config: EvaluationConfig,
    adapter_ids: Sequence[str] = (),
    max_adapters: int = 1,
    include_base: bool = True,
) -> list[ModelTarget]:
    """The base model (unless it already has a report under this config) and adapters from the ``adapters`` table.

    ``adapter_ids`` names adapters explicitly; otherwise the newest ``max_adapters`` adapters
    with no report under this config are taken. An unknown adapter id raises, naming it.
    """
    fp = config.fingerprint()
    targets = []
    if include_base and latest_report(warehouse, base_id, fp) is None:
        targets.append(ModelTarget(base_id, "base", base_id, base_path))
    known: dict[str, str] = {}
    if warehouse.has_table("adapters"):
        known = {a: p for a, p in warehouse.execute("SELECT adapter_id, path FROM adapters ORDER BY created_at DESC")}
    if adapter_ids:
        missing = [a for a in adapter_ids if a not in known]
        if missing:
            raise KeyError(f"adapters {missing} are not in the warehouse's adapters table")
        chosen = list(adapter_ids)
    else:
        chosen = [a for a in known if latest_report(warehouse, a, fp) is None][:max_adapters]
    for a in chosen:
        if not (Path(known[a]) / "adapter_config.json").exists():
            raise FileNotFoundError(f"adapter {a!r}: {known[a]} is not a PEFT adapter directory (no adapter_config.json)")
        targets.append(ModelTarget(a, "adapter", base_id, base_path, known[a]))
    return targets


def evaluate_targets(
    targets: Sequence[ModelTarget],
    config: EvaluationConfig,
    load_generator: Callable[[str, str | None], Callable[..., str]] | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> list[EvaluationReport]:
    """One report per target; ``load_generator(base_path, adapter_path)`` builds its generate callable."""
    if load_generator is None:
        from agenttune_lib.evaluation.generation import load_eval_generator as load_generator
    reports = []
    for t in targets:
        generate = load_generator(t.base_path, t.adapter_path)
        reports.append(evaluate_model(generate, t.adapter_id, t.base_model, config, model_kind=t.model_kind, progress=progress))
    return reports


def plot_reports(reports: Sequence[EvaluationReport], path: str | Path, title: str = "before / after", labels: Sequence[str] | None = None) -> Path:
    """Grouped bars per score (BFCL categories, τ² success, TAC, 1-LCF), one bar per report, with seed spread as error bars."""
    if labels is not None and len(labels) != len(reports):
        raise ValueError(f"{len(labels)} labels for {len(reports)} reports")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys: list[str] = []
    for r in reports:
        for row in r.category_rows():
            key = f"{row['benchmark']}:{row['category']}"
            if key not in keys:
                keys.append(key)
    keys += ["TAC", "1-LCF"]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(keys)), 3.6))
    width = 0.8 / max(1, len(reports))
    for i, r in enumerate(reports):
        rows = {f"{x['benchmark']}:{x['category']}": x for x in r.category_rows()}
        nan = float("nan")  # a score this report did not measure draws no bar
        means = [rows[k]["mean"] if k in rows else nan for k in keys[:-2]]
        errs = [rows[k]["std"] if k in rows else 0.0 for k in keys[:-2]]
        tac, lcf = r.trajectory_means.get("TAC"), r.trajectory_means.get("LCF")
        means += [tac if tac is not None else nan, 1.0 - lcf if lcf is not None else nan]
        errs += [0.0, 0.0]
        ax.bar([j + i * width for j in range(len(keys))], means, width, yerr=errs, label=(labels[i] if labels else r.adapter_id)[:48], capsize=2)
    ax.set_xticks([j + width * (len(reports) - 1) / 2 for j in range(len(keys))])
    ax.set_xticklabels(keys, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("score (mean over seeds)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
