"""Base vs candidate on the same held-out items: run the suites, store per-item rows and paired comparisons, plot them.

What the ``evaluation_report`` asset calls. Base rows already stored under the same suite
config hash are reused (the base model does not change between runs); anything else runs.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agenttune_lib.evaluation.paired import PairedComparison
from agenttune_lib.evaluation.store import compare_items, find_items_report, load_items, write_comparisons, write_config, write_items
from agenttune_lib.evaluation.suites import BFCLSuiteConfig, QASuiteConfig, SuiteResult, Tau2SuiteConfig

__all__ = ["EvalRunConfig", "ModelSpec", "ComparisonReport", "SUITE_METRICS", "run_comparison", "plot_comparison", "comparison_table"]

#: The metrics compared per suite (the first is the suite's headline score).
SUITE_METRICS: dict[str, tuple[str, ...]] = {
    # valid_call: the share of questions with at least one valid tool call (parsed, accepted, run)
    "qa": ("score", "exact_match", "valid_call", f"doc_at_{QASuiteConfig().doc_k}", "searches"),
    "tau2": ("success", "action_recall", "communicate_info"),
    "bfcl_strict": ("score",),
    "bfcl_platform": ("score",),
}


def suite_metrics(suite: str) -> tuple[str, ...]:
    """The compared metrics of a suite or of its constrained arm (``qa+constrained`` -> qa's)."""
    return SUITE_METRICS.get(suite.split("+")[0], SUITE_METRICS.get("bfcl_platform") if suite.startswith("bfcl") else ("score",))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model to evaluate: its id (``base:<name>@<version>`` or an adapter id), base checkpoint and optional PEFT adapter dir."""

    model_id: str
    base_path: str
    adapter_path: str | None = None


@dataclasses.dataclass(frozen=True)
class EvalRunConfig:
    """Which suites run and how: greedy decoding, batch size, the minimum gain worth detecting and the interval's confidence."""

    qa: QASuiteConfig | None = QASuiteConfig()
    qa_limit: int | None = 40
    tau2: Tau2SuiteConfig | None = Tau2SuiteConfig()
    bfcl: BFCLSuiteConfig | None = None
    max_new_tokens: int = 96
    batch_size: int = 16
    temperature: float = 0.0
    seed: int = 0
    min_gain: float = 0.1
    #: Also run every suite under structured decoding, reported as its own suites (``qa+constrained``, ``bfcl_constrained``…).
    constrained_arm: bool = False
    confidence: float = 0.95
    n_resamples: int = 2000
    #: The dtype both models decode in (``float32`` or ``bfloat16``; resolve "auto" with ``resolve_eval_dtype`` first).
    dtype: str = "float32"

    def __post_init__(self) -> None:
        from agenttune_lib.evaluation.batched import EVAL_DTYPES

        if self.dtype not in EVAL_DTYPES:
            raise ValueError(f"EvalRunConfig.dtype must be one of {EVAL_DTYPES} (resolve 'auto' first), got {self.dtype!r}")

    def decoding(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "seed": self.seed, "dtype": self.dtype}

    def fingerprint(self) -> str:
        body = dataclasses.asdict(self)
        return hashlib.sha256(repr(sorted(body.items())).encode()).hexdigest()[:12]


@dataclasses.dataclass
class ComparisonReport:
    """One evaluation run: per suite, both models' results, the paired comparisons, and the do-nothing baseline (τ²)."""

    report_id: str
    base_id: str
    candidate_id: str | None
    results: dict[str, dict[str, SuiteResult | None]]
    comparisons: dict[str, list[PairedComparison]]
    reused: dict[str, str]
    seconds: dict[str, float]
    created_at: str
    #: The adapter serving when the report ran (DEPLOYED.json), scored on the same items as its own ``deployed`` arm; None: none.
    deployed_id: str | None = None

    def summary_rows(self) -> list[dict[str, Any]]:
        """One row per suite and compared metric: base, candidate, diff, interval, n, MDE, n for the minimum gain."""
        rows = []
        for suite, comps in self.comparisons.items():
            for c in comps:
                rows.append({"suite": suite, "metric": c.metric, "n": c.n, "base": c.base_mean, "candidate": c.candidate_mean, "diff": c.diff,
                             "ci_low": c.ci_low, "ci_high": c.ci_high, "mde": c.mde, "min_gain": c.min_gain, "n_required": c.n_required,
                             "detected": c.excludes_zero})
        return rows


def _policy_loader(config: EvalRunConfig) -> Callable[[ModelSpec], Any]:
    def load(spec: ModelSpec) -> Any:
        from agenttune_lib.evaluation.batched import load_policy

        return load_policy(spec.base_path, spec.adapter_path, max_new_tokens=config.max_new_tokens, batch_size=config.batch_size,
                           temperature=config.temperature, seed=config.seed, dtype=config.dtype)
    return load


def _run_suites(policy: Any, config: EvalRunConfig, qa_items: Sequence[Mapping[str, Any]], search_tool: Any, tau2_tasks: Sequence[Any] | None,
                progress: Callable[[str], None]) -> dict[str, SuiteResult]:
    from agenttune_lib.evaluation.suites import run_bfcl_suite

    out = _run_arm(policy, config, qa_items, search_tool, tau2_tasks, progress, "")
    if config.constrained_arm:
        if not hasattr(policy, "model") or not hasattr(policy, "tokenizer"):
            raise TypeError("the constrained arm needs a model policy (BatchedChatPolicy)")
        from agenttune_lib.evaluation.batched import BatchedChatPolicy

        con = BatchedChatPolicy(policy.model, policy.tokenizer, max_new_tokens=config.max_new_tokens, batch_size=config.batch_size,
                                temperature=config.temperature, seed=config.seed, constrained=True)
        multi = dataclasses.replace(config, bfcl=None)
        out.update(_run_arm(con, multi, qa_items, search_tool, tau2_tasks, progress, "+constrained"))
        if config.bfcl is not None:
            for name, res in run_bfcl_suite(policy, dataclasses.replace(config.bfcl, arms=("constrained",)), decoding=config.decoding()).items():
                out[name] = res
                progress(f"{name}: {len(res.rows)} items in {res.seconds:.1f}s")
    return out


def _run_arm(policy: Any, config: EvalRunConfig, qa_items: Sequence[Mapping[str, Any]], search_tool: Any, tau2_tasks: Sequence[Any] | None,
             progress: Callable[[str], None], suffix: str) -> dict[str, SuiteResult]:
    from agenttune_lib.evaluation.suites import run_bfcl_suite, run_qa_suite, run_tau2_suite

    out: dict[str, SuiteResult] = {}
    dec = config.decoding()
    if config.qa is not None:
        items = list(qa_items)[: config.qa_limit] if config.qa_limit is not None else list(qa_items)
        res = run_qa_suite(policy, items, search_tool, config.qa, decoding=dec)
        res.suite = "qa" + suffix
        out[res.suite] = res
        progress(f"{res.suite}: {len(items)} items in {res.seconds:.1f}s")
    if config.tau2 is not None:
        res = run_tau2_suite(policy, tau2_tasks, config.tau2, decoding=dec)
        res.suite = "tau2" + suffix
        out[res.suite] = res
        progress(f"{res.suite}: {len(res.rows)} tasks in {res.seconds:.1f}s")
    if config.bfcl is not None:
        for name, res in run_bfcl_suite(policy, config.bfcl, decoding=dec).items():
            out[name] = res
            progress(f"{name}: {len(res.rows)} items in {res.seconds:.1f}s")
    return out


def _stored(warehouse: Any, suite: str, model_id: str, chash: str) -> SuiteResult | None:
    found = find_items_report(warehouse, suite, model_id, chash)
    if found is None:
        return None
    rows = load_items(warehouse, found[0], suite, found[1])
    return SuiteResult(suite, rows, {"reused_from_report": found[0]}, chash, 0.0)


def run_comparison(
    warehouse: Any,
    base: ModelSpec,
    candidate: ModelSpec | None,
    config: EvalRunConfig,
    qa_items: Sequence[Mapping[str, Any]] = (),
    search_tool: Any = None,
    tau2_tasks: Sequence[Any] | None = None,
    load_policy: Callable[[ModelSpec], Any] | None = None,
    reuse_base: bool = True,
    progress: Callable[[str], None] | None = None,
    deployed: ModelSpec | None = None,
) -> ComparisonReport:
    """Evaluate the candidate (when given) and the base model on every configured suite, store rows and comparisons.

    ``load_policy(spec)`` builds a policy (default: a batched greedy policy over base + adapter).
    Base rows stored earlier under the same suite config hash are reused when ``reuse_base``.
    ``deployed`` (the adapter the deployment pointer names) is scored on the same items as the ``deployed`` arm
    (rows labelled ``deployed``; its rows stored earlier under the same config hash are reused), so the candidate can
    be checked against what serves; the paired comparisons stay base vs candidate.
    """
    if config.qa is not None and (search_tool is None or not qa_items):
        raise ValueError("the QA suite needs qa_items (the validation split) and a search_tool; set qa=None to skip it")
    load_policy = load_policy or _policy_loader(config)
    progress = progress or (lambda msg: None)
    now = dt.datetime.now(dt.timezone.utc)
    report_id = hashlib.sha256(f"{base.model_id}|{candidate.model_id if candidate else ''}|{config.fingerprint()}|{now.isoformat()}".encode()).hexdigest()[:16]
    results: dict[str, dict[str, SuiteResult | None]] = {}
    seconds: dict[str, float] = {}
    reused: dict[str, str] = {}
    if candidate is not None:
        t0 = time.perf_counter()
        cand_res = _run_suites(load_policy(candidate), config, qa_items, search_tool, tau2_tasks, lambda m: progress(f"candidate {m}"))
        seconds["candidate"] = time.perf_counter() - t0
        for suite, res in cand_res.items():
            results.setdefault(suite, {})["candidate"] = res
    base_res: dict[str, SuiteResult] = {}
    if reuse_base and candidate is not None:
        for suite, res in list(cand_res.items()):
            prior = _stored(warehouse, suite, base.model_id, res.config_hash)
            if prior is not None:
                base_res[suite] = prior
                reused[suite] = prior.config["reused_from_report"]
    if candidate is None or any(s not in base_res for s in cand_res):
        t0 = time.perf_counter()
        fresh = _run_suites(load_policy(base), config, qa_items, search_tool, tau2_tasks, lambda m: progress(f"base {m}"))
        seconds["base"] = time.perf_counter() - t0
        for suite, res in fresh.items():
            base_res.setdefault(suite, res)
    for suite, res in base_res.items():
        results.setdefault(suite, {})["base"] = res
    if deployed is not None:
        _deployed_arm(warehouse, deployed, results, report_id, reused, seconds, load_policy(deployed) if _needs_run(warehouse, deployed, results) else None,
                      config, qa_items, search_tool, tau2_tasks, progress)
    comparisons: dict[str, list[PairedComparison]] = {}
    for suite, pair in results.items():
        b, c = pair.get("base"), pair.get("candidate")
        for res in (b, c):
            if res is not None and "reused_from_report" not in res.config:
                write_config(warehouse, suite, res.config_hash, res.config)
        if b is not None and suite not in reused:
            write_items(warehouse, report_id, suite, "base", base.model_id, b.rows, b.config_hash)
            if b.baseline_rows:
                write_items(warehouse, report_id, suite, "do_nothing", "do_nothing", b.baseline_rows, b.config_hash)
        if c is not None:
            write_items(warehouse, report_id, suite, "candidate", candidate.model_id, c.rows, c.config_hash)  # type: ignore[union-attr]
            if c.baseline_rows and (b is None or suite in reused):
                write_items(warehouse, report_id, suite, "do_nothing", "do_nothing", c.baseline_rows, c.config_hash)
        if b is None or c is None:
            continue
        comps = compare_items([{**r, "config_hash": b.config_hash} for r in b.rows], [{**r, "config_hash": c.config_hash} for r in c.rows],
                              metrics=suite_metrics(suite), by_category=suite.startswith("bfcl"),
                              min_gain=config.min_gain, confidence=config.confidence, n_resamples=config.n_resamples)
        comparisons[suite] = comps
        write_comparisons(warehouse, report_id, suite, comps, c.config_hash, candidate.model_id, base.model_id,  # type: ignore[union-attr]
                          headline=suite_metrics(suite)[0])
    return ComparisonReport(report_id, base.model_id, candidate.model_id if candidate else None, results, comparisons, reused, seconds, now.isoformat(),
                            deployed.model_id if deployed else None)


def _needs_run(warehouse: Any, deployed: ModelSpec, results: Mapping[str, Mapping[str, SuiteResult | None]]) -> bool:
    """Whether some evaluated suite has no stored rows of the deployed adapter under its config hash."""
    for pair in results.values():
        ref = pair.get("candidate") or pair.get("base")
        if ref is not None and _stored(warehouse, ref.suite, deployed.model_id, ref.config_hash) is None:
            return True
    return False


def _deployed_arm(warehouse: Any, deployed: ModelSpec, results: dict[str, dict[str, SuiteResult | None]], report_id: str, reused: dict[str, str],
                  seconds: dict[str, float], policy: Any, config: EvalRunConfig, qa_items: Sequence[Mapping[str, Any]], search_tool: Any,
                  tau2_tasks: Sequence[Any] | None, progress: Callable[[str], None]) -> None:
    """The deployed adapter's rows per suite: reused when stored under the same config hash, else run now and written."""
    fresh: dict[str, SuiteResult] = {}
    if policy is not None:
        t0 = time.perf_counter()
        fresh = _run_suites(policy, config, qa_items, search_tool, tau2_tasks, lambda m: progress(f"deployed {m}"))
        seconds["deployed"] = time.perf_counter() - t0
    for suite, pair in results.items():
        ref = pair.get("candidate") or pair.get("base")
        if ref is None:
            continue
        prior = _stored(warehouse, suite, deployed.model_id, ref.config_hash)
        if prior is not None:
            pair["deployed"] = prior
            reused[f"{suite}:deployed"] = prior.config["reused_from_report"]
        elif suite in fresh:
            pair["deployed"] = fresh[suite]
            write_items(warehouse, report_id, suite, "deployed", deployed.model_id, fresh[suite].rows, fresh[suite].config_hash)


def comparison_table(report: ComparisonReport) -> list[dict[str, Any]]:
    """Per suite: n, base / candidate / do-nothing headline score, diff and interval, MDE, flagged (excluded) items."""
    out = []
    for suite, pair in report.results.items():
        b, c = pair.get("base"), pair.get("candidate")
        ref = c or b
        if ref is None:
            continue
        metric = suite_metrics(suite)[0]
        head = next((x for x in report.comparisons.get(suite, []) if x.metric == metric), None)
        baseline = ref.baseline_rows
        out.append({
            "suite": suite, "metric": metric, "n": ref.n, "excluded": sum(1 for r in ref.rows if r.get("excluded")),
            "base": b.mean(metric) if b else None, "candidate": c.mean(metric) if c else None,
            "do_nothing": (sum(float(r["success"]) for r in baseline if not r.get("excluded")) / max(1, sum(1 for r in baseline if not r.get("excluded")))) if baseline else None,
            "diff": head.diff if head else None, "ci_low": head.ci_low if head else None, "ci_high": head.ci_high if head else None,
            "mde": head.mde if head else None, "n_required": head.n_required if head else None, "config_hash": ref.config_hash,
            "base_reused_from": report.reused.get(suite),
        })
    return out


def plot_comparison(report: ComparisonReport, path: str | Path, title: str = "base vs candidate") -> Path:
    """Left: base and candidate per suite/category with 95 % bootstrap bars; right: paired differences with their intervals and MDE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from scipy import stats

    keys: list[tuple[str, str | None]] = []
    for suite, pair in report.results.items():
        ref = pair.get("candidate") or pair.get("base")
        if ref is None:
            continue
        if suite.startswith("bfcl"):
            keys += [(suite, cat) for cat in ref.categories()]
        else:
            keys.append((suite, None))

    def interval(res: SuiteResult | None, suite: str, cat: str | None) -> tuple[float, float, float]:
        if res is None:
            return float("nan"), 0.0, 0.0
        metric = suite_metrics(suite)[0]
        vals = [float(r["success"] if metric == "success" else r["score"]) for r in res.rows
                if not r.get("excluded") and (cat is None or r.get("category") == cat) and r.get("score") is not None]
        if not vals:
            return float("nan"), 0.0, 0.0
        m = float(np.mean(vals))
        if len(vals) < 2 or len(set(vals)) == 1:
            return m, 0.0, 0.0
        ci = stats.bootstrap((np.asarray(vals),), np.mean, confidence_level=0.95, n_resamples=1000, method="percentile",
                             rng=np.random.default_rng(0)).confidence_interval
        return m, m - float(ci.low), float(ci.high) - m

    labels = [f"{s}:{c}" if c else s for s, c in keys]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(keys) + 4), 3.8))
    x = np.arange(len(keys))
    for i, label in enumerate(("base", "candidate")):
        pts = [interval(report.results[s].get(label), s, c) for s, c in keys]
        ax1.bar(x + (i - 0.5) * 0.38, [p[0] for p in pts], 0.38, yerr=np.array([[p[1] for p in pts], [p[2] for p in pts]]), capsize=3, label=label)
    ax1.set_xticks(x)
    ax1.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax1.set_ylim(0, 1.05)
    ax1.set_ylabel("headline score (95% bootstrap)")
    ax1.legend(fontsize=7)
    diffs = []
    for s, c in keys:
        metric = suite_metrics(s)[0]
        name = f"{metric}:{c}" if c else metric
        diffs.append(next((x for x in report.comparisons.get(s, []) if x.metric == name), None))
    for i, d in enumerate(diffs):
        if d is None:
            continue
        ax2.errorbar([i], [d.diff], yerr=[[d.diff - d.ci_low], [d.ci_high - d.diff]], fmt="o", capsize=4, color="C3" if d.excludes_zero else "C7")
        ax2.plot([i - 0.3, i + 0.3], [d.mde, d.mde], ls=":", color="C2")
        ax2.text(i, d.ci_high, f" n={d.n}", fontsize=7, va="bottom", ha="center")
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("candidate - base (95% paired CI; dotted: MDE)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

