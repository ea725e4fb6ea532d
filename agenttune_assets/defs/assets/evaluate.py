"""[evaluate] evaluation_report: base vs candidate adapter on held-out QA and τ² items, paired intervals, per-item rows in the warehouse."""

import base64
import json
import time
from pathlib import Path

import dagster as dg

from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, ServingResource, WarehouseResource
from agenttune_lib.warehouse.queries import adapter_paths


class EvaluationReportConfig(dg.Config):
    """Held-out suite sizes; `agenttune materialize --profile` sets them (agenttune_assets/profiles.py); bench/calibration.py runs the full splits.

    QA: the first ``qa_limit`` validation items; each item gets one search per gold hop plus the answer (``qa_hop_steps``:
    hops + 1 + ``qa_step_slack`` steps up to ``qa_max_steps``, never fewer than hops + 1), so a student that walks the
    chain as its expert teacher did can answer. Per-item rows record each item's ``step_budget`` and ``hops``. τ²: the ``tau2_n_tasks`` test
    tasks with the fewest gold actions (at most ``tau2_max_actions``), none fixed by construction, each
    with gold actions + ``tau2_step_slack`` steps. BFCL (``bfcl_categories``, platform arm by default: the
    tool rendering the platform serves) gives the gate its irrelevance and simple-call guards.
    """

    qa_limit: int = 40
    qa_max_steps: int = 6
    qa_hop_steps: bool = True
    qa_step_slack: int = 1  # the expert reads a passage shown cut short once more: hops + 2 steps, within qa_max_steps
    qa_search_backend: str = "hybrid"
    qa_final_answer_turn: bool = False  # ask for the answer before each item's last step (QASuiteConfig.final_answer_turn)
    tau2_n_tasks: int = 3
    tau2_max_actions: int = 2
    tau2_step_slack: int = 2
    bfcl_categories: list[str] = []
    bfcl_limit: int = 50
    bfcl_arms: list[str] = ["platform"]
    max_new_tokens: int = 64
    batch_size: int = 16
    min_gain: float = 0.1
    base_model_path: str = ""
    adapter_ids: list[str] = []
    dtype: str = "auto"  # both models decode in it; auto = bfloat16 on hardware with native bf16, else float32

    def to_lib(self):
        from agenttune_lib.evaluation.batched import resolve_eval_dtype
        from agenttune_lib.evaluation.compare import EvalRunConfig
        from agenttune_lib.evaluation.suites import BFCLSuiteConfig, QASuiteConfig, Tau2SuiteConfig

        return EvalRunConfig(
            qa=QASuiteConfig(max_steps=self.qa_max_steps, hop_steps=self.qa_hop_steps, step_slack=self.qa_step_slack,
                             final_answer_turn=self.qa_final_answer_turn) if self.qa_limit > 0 else None, qa_limit=self.qa_limit,
            tau2=Tau2SuiteConfig(step_slack=self.tau2_step_slack) if self.tau2_n_tasks > 0 else None,
            bfcl=BFCLSuiteConfig(categories=tuple(self.bfcl_categories), limit=self.bfcl_limit, arms=tuple(self.bfcl_arms)) if self.bfcl_categories else None,
            max_new_tokens=self.max_new_tokens, batch_size=self.batch_size, min_gain=self.min_gain, dtype=resolve_eval_dtype(self.dtype),
        )


def _base(config: EvaluationReportConfig, models: ModelsResource) -> tuple[str, str]:
    """(base model id, checkpoint path): the given path, or the packaged base model converted under the models dir."""
    if config.base_model_path:
        path = Path(config.base_model_path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"base_model_path={config.base_model_path!r} is not a model checkpoint (no config.json)")
        return f"base:{path.name}", str(path)
    from agenttune_lib.models.base import ensure_base_model

    info = ensure_base_model(models.get())
    return f"base:{info.name}@{info.version}", str(info.path)


def _candidate(wh, adapter_ids: list[str]):
    """(adapter id, path) of the named adapter, else the newest in the ``adapters`` table; None when there is none."""
    known = adapter_paths(wh)
    if known is None:
        if adapter_ids:
            raise KeyError(f"adapters {adapter_ids} requested but the warehouse has no adapters table")
        return None
    if adapter_ids:
        missing = [a for a in adapter_ids if a not in known]
        if missing:
            raise KeyError(f"adapters {missing} are not in the warehouse's adapters table")
        return adapter_ids[0], known[adapter_ids[0]]
    return next(iter(known.items()), None)


def _deployed_arm_note(report, deployed_id: str | None, scored: bool):
    """Per suite, whether the deployed arm was scored now or reused from a report; else why there is no deployed arm."""
    if not scored:
        return "the candidate is the deployed adapter" if deployed_id else "no adapter deployed"
    return {s: f"reused {report.reused[f'{s}:deployed']}" if f"{s}:deployed" in report.reused else "scored"
            for s, pair in report.results.items() if pair.get("deployed") is not None}


def _table(rows: list[dict], columns: list[tuple[str, str]]) -> dg.TableMetadataValue:
    return dg.MetadataValue.table(
        [dg.TableRecord({c: r.get(c) for c, _ in columns}) for r in rows],
        schema=dg.TableSchema(columns=[dg.TableColumn(c, t) for c, t in columns]),
    )


def _fmt(x, pct=True):
    return "—" if x is None else (f"{x:+.1%}" if pct == "+" else f"{x:.1%}" if pct else f"{x:.3g}")


@dg.asset(group_name="evaluate", deps=["trained_adapter", "base_model", "qa_splits", "retrieval_index"], pool="warehouse", kinds={"duckdb", "python"})
def evaluation_report(
    context: dg.AssetExecutionContext,
    config: EvaluationReportConfig,
    warehouse: WarehouseResource,
    models: ModelsResource,
    artifacts: ArtifactsResource,
    serving: ServingResource,
) -> dg.MaterializeResult:
    """Paired base-vs-candidate comparison per suite (diff, 95 % interval, n, MDE) in ``evaluation_items`` / ``evaluation_comparisons``;
    the adapter serving now (DEPLOYED.json) is scored on the same items as the ``deployed`` arm."""
    from agenttune_lib.evaluation.compare import ModelSpec, run_comparison
    from agenttune_lib.evaluation.legacy import write_legacy_reports
    from agenttune_lib.evaluation.suites import select_tau2_tasks

    t0 = time.perf_counter()
    wh = warehouse.get()
    lib = config.to_lib()
    base_id, base_path = _base(config, models)
    cand = _candidate(wh, config.adapter_ids)
    from agenttune_lib.models.serving import resolve_served_model

    served = resolve_served_model(serving.deploy_dir(), base_path)  # on the evaluation's base; a pointer to a missing adapter raises
    deployed = ModelSpec(served.adapter_id, base_path, str(served.adapter_path)) if served.adapter_id and served.adapter_id != (cand[0] if cand else None) else None
    qa_items, search = [], None
    if lib.qa is not None:
        from agenttune_lib.rag import SearchCorpusTool, load_backend
        from agenttune_lib.rag.splits import load_qa_split
        from agenttune_lib.rag.workflow import RagPaths

        qa_items = load_qa_split(wh, "validation")
        if len(qa_items) < config.qa_limit:
            context.log.warning(f"QA validation split has {len(qa_items)} items, fewer than qa_limit={config.qa_limit}")
        search = SearchCorpusTool(load_backend(RagPaths.under(artifacts.get()).index, config.qa_search_backend))
    tasks = select_tau2_tasks("test", config.tau2_n_tasks, config.tau2_max_actions) if lib.tau2 is not None else None
    report = run_comparison(
        wh, ModelSpec(base_id, base_path), ModelSpec(cand[0], base_path, cand[1]) if cand else None, lib,
        qa_items=qa_items, search_tool=search, tau2_tasks=tasks, progress=context.log.info, deployed=deployed,
    )
    write_legacy_reports(wh, report, lib, run_id=context.run_id, asset_key=context.asset_key.to_user_string())
    seconds = time.perf_counter() - t0
    metadata = _report_metadata(report, base_id, seconds, wh, lib, artifacts.get())
    metadata["deployed"] = dg.MetadataValue.text(served.served_adapter_id)
    metadata["deployed_arm"] = dg.MetadataValue.json(_deployed_arm_note(report, served.adapter_id, deployed is not None))
    context.log.info(f"evaluation took {seconds:.1f}s: {json.dumps({k: round(v, 1) for k, v in report.seconds.items()})}")
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(report.report_id))


def _report_metadata(report, base_id: str, seconds: float, wh, lib, artifacts_root: Path) -> dict:
    """The report's metadata: a markdown summary, the suites and comparisons tables, stored BFCL scores, the plot."""
    from agenttune_lib.evaluation.compare import comparison_table, plot_comparison

    suites = comparison_table(report)
    detail = report.summary_rows()
    lines = ["| suite | n | base | candidate | diff | 95% CI | smallest detectable gain (MDE) | do-nothing |", "|---|---|---|---|---|---|---|---|"]
    for s in suites:
        ci = "—" if s["ci_low"] is None else f"[{s['ci_low']:+.1%}, {s['ci_high']:+.1%}]"
        lines.append(f"| {s['suite']} ({s['metric']}) | {s['n']} (+{s['excluded']} flagged) | {_fmt(s['base'])} | {_fmt(s['candidate'])} | "
                     f"{_fmt(s['diff'], '+')} | {ci} | {_fmt(s['mde'])} | {_fmt(s['do_nothing'])} |")
    metadata: dict = {
        "report_id": dg.MetadataValue.text(report.report_id),
        "base": dg.MetadataValue.text(base_id),
        "candidate": dg.MetadataValue.text(report.candidate_id or "none (no adapter yet: base scored alone)"),
        "summary": dg.MetadataValue.md("\n".join(lines)),
        "suites": _table(suites, [("suite", "string"), ("metric", "string"), ("n", "int"), ("excluded", "int"), ("base", "float"),
                                  ("candidate", "float"), ("do_nothing", "float"), ("diff", "float"), ("ci_low", "float"), ("ci_high", "float"),
                                  ("mde", "float"), ("n_required", "int"), ("config_hash", "string"), ("base_reused_from", "string")]),
        "comparisons": _table(detail, [("suite", "string"), ("metric", "string"), ("n", "int"), ("base", "float"), ("candidate", "float"),
                                       ("diff", "float"), ("ci_low", "float"), ("ci_high", "float"), ("mde", "float"), ("min_gain", "float"),
                                       ("n_required", "int"), ("detected", "bool")]),
        "per_item_rows": dg.MetadataValue.md(
            f"Per-item rows: the `evaluation_items` rows with report_id `{report.report_id}` "
            f"(comparisons: `evaluation_comparisons`, same report_id)."),
        "seconds": dg.MetadataValue.float(round(seconds, 1)),
        "seconds_by_model": dg.MetadataValue.json({k: round(v, 1) for k, v in report.seconds.items()}),
        "conditions": dg.MetadataValue.json({s: {k: v for k, v in (pair.get("candidate") or pair.get("base")).config.items() if k != "policy"}
                                             for s, pair in report.results.items()}),
        "generation": dg.MetadataValue.json({f"{s}:{lab}": r.config.get("policy") for s, pair in report.results.items()
                                             for lab, r in pair.items() if r is not None and r.config.get("policy")}),
    }
    from agenttune_lib.evaluation.store import latest_category_scores

    bfcl = [r for r in latest_category_scores(wh, [base_id] + ([report.candidate_id] if report.candidate_id else []))
            if not (lib.bfcl is not None and r["report_id"] == report.report_id)]
    if bfcl:  # BFCL runs outside the main job's budget (bench/calibration.py); its newest stored per-category scores are shown here
        metadata["bfcl_latest_stored"] = _table(bfcl, [("model", "string"), ("suite", "string"), ("category", "string"), ("mean", "float"),
                                                       ("n", "int"), ("report_id", "string"), ("config_hash", "string"), ("created_at", "string")])
    if report.results:
        png = plot_comparison(report, artifacts_root / "evaluation" / f"comparison_{report.report_id}.png",
                              title=f"{base_id} vs {report.candidate_id or '-'} (report {report.report_id})")
        metadata["plot"] = dg.MetadataValue.md(f"![paired comparison](data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()})\n\n"
                                               f"Per-item rows behind every bar: `evaluation_items` WHERE report_id = '{report.report_id}'.")
        metadata["plot_path"] = dg.MetadataValue.path(str(png))
    return metadata
