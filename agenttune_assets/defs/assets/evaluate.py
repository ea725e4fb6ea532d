"""[evaluate] evaluation_report: BFCL per category, τ² success and trajectory metrics for the base model and each new adapter."""

import base64
import json
from pathlib import Path

import dagster as dg

from agenttune_assets.defs.resources import ArtifactsResource, ModelsResource, WarehouseResource
from agenttune_lib.evaluation.pipeline import evaluate_targets, pending_targets, plot_reports
from agenttune_lib.evaluation.report_model import (
    EvaluationConfig, calibration_report, deployed_adapter_id, latest_report, write_report,
)
from agenttune_lib.evaluation.settings import EvalSettings


class EvaluationReportConfig(dg.Config):
    """A small, seeded sample by default (fits the main job); bench/calibration.py runs the full calibration."""

    bfcl_categories: list[str] = ["simple_python", "irrelevance"]
    bfcl_limit: int = 1
    tau2_split: str = "test"
    tau2_limit: int = 1
    tau2_max_steps: int = 1
    seeds: list[int] = [0, 1, 2]
    template_mode: str = "native"
    keep_thinking_history: bool = True
    temperature: float = 0.7
    max_new_tokens: int = 32
    base_model_path: str = ""
    adapter_ids: list[str] = []
    max_adapters: int = 1

    def to_lib(self) -> EvaluationConfig:
        return EvaluationConfig(
            bfcl_categories=tuple(self.bfcl_categories), bfcl_limit=self.bfcl_limit, tau2_split=self.tau2_split,
            tau2_limit=self.tau2_limit, tau2_max_steps=self.tau2_max_steps,
            settings=EvalSettings(seeds=tuple(self.seeds), template_mode=self.template_mode, keep_thinking_history=self.keep_thinking_history,
                                  temperature=self.temperature, max_new_tokens=self.max_new_tokens),
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


def _table(rows: list[dict], columns: list[tuple[str, str]]) -> dg.TableMetadataValue:
    return dg.MetadataValue.table(
        [dg.TableRecord({c: (rows_value if rows_value is not None else None) for c, rows_value in ((c, r.get(c)) for c, _ in columns)}) for r in rows],
        schema=dg.TableSchema(columns=[dg.TableColumn(c, t) for c, t in columns]),
    )


@dg.asset(group_name="evaluate", deps=["trained_adapter", "base_model"], kinds={"duckdb", "python"})
def evaluation_report(
    context: dg.AssetExecutionContext,
    config: EvaluationReportConfig,
    warehouse: WarehouseResource,
    models: ModelsResource,
    artifacts: ArtifactsResource,
) -> dg.MaterializeResult:
    """One report per new adapter and one for the base model, each a mean and spread over seeds, stored in ``evaluation_reports``."""
    wh = warehouse.get()
    lib_config = config.to_lib()
    base_id, base_path = _base(config, models)
    targets = pending_targets(wh, base_id, base_path, lib_config, config.adapter_ids, config.max_adapters)
    context.log.info(f"evaluating {[t.adapter_id for t in targets]} under config {lib_config.fingerprint()}")
    reports = evaluate_targets(targets, lib_config)
    for r in reports:
        r.run_id, r.asset_key = context.run_id, context.asset_key.to_user_string()
        write_report(wh, r)
    shown = {r.adapter_id: r for r in reports}
    for extra in (base_id, deployed_adapter_id(wh)):
        if extra and extra not in shown:
            prior = latest_report(wh, extra, lib_config.fingerprint()) or latest_report(wh, extra)
            if prior is not None:
                shown[extra] = prior
    ordered = sorted(shown.values(), key=lambda r: (r.model_kind != "base", r.created_at))
    score_rows = [{"model": r.adapter_id, **row} for r in ordered for row in r.category_rows()]
    traj_rows = [{"model": r.adapter_id, "metric": m, "mean": v} for r in ordered for m, v in sorted(r.trajectory_means.items())]
    summary = [
        {"model": r.adapter_id, "kind": r.model_kind, "report_id": r.report_id,
         "bfcl_mean": (r.bfcl_overall or {}).get("mean"), "bfcl_std": (r.bfcl_overall or {}).get("std"),
         "tau2_mean": (r.tau2_success or {}).get("mean"), "tau2_std": (r.tau2_success or {}).get("std"),
         "TAC": r.trajectory_means.get("TAC"), "LCF": r.trajectory_means.get("LCF"), "new": r.adapter_id in {x.adapter_id for x in reports}}
        for r in ordered
    ]
    metadata: dict = {
        "evaluated": dg.MetadataValue.int(len(reports)),
        "report_ids": dg.MetadataValue.json([r.report_id for r in reports]),
        "reports": _table(summary, [("model", "string"), ("kind", "string"), ("report_id", "string"), ("bfcl_mean", "float"),
                                    ("bfcl_std", "float"), ("tau2_mean", "float"), ("tau2_std", "float"), ("TAC", "float"),
                                    ("LCF", "float"), ("new", "bool")]),
        "scores": _table(score_rows, [("model", "string"), ("benchmark", "string"), ("category", "string"), ("mean", "float"),
                                      ("std", "float"), ("n_seeds", "int"), ("n_items", "int")]),
        "trajectory_metrics": _table(traj_rows, [("model", "string"), ("metric", "string"), ("mean", "float")]),
        "conditions": dg.MetadataValue.json(ordered[0].settings if ordered else {}),
        "config_fingerprint": dg.MetadataValue.text(lib_config.fingerprint()),
    }
    calibration = calibration_report(wh, base_id)
    if calibration is not None:
        metadata["calibration_3_seeds"] = _table(
            [{"model": calibration.adapter_id, "created_at": calibration.created_at, **row} for row in calibration.category_rows()],
            [("model", "string"), ("created_at", "string"), ("benchmark", "string"), ("category", "string"), ("mean", "float"),
             ("std", "float"), ("n_seeds", "int"), ("n_items", "int")])
        metadata["calibration_conditions"] = dg.MetadataValue.json(calibration.settings)
    plotted = ([calibration] if calibration is not None else []) + ordered
    if plotted:
        labels = [f"{r.adapter_id} ({'calibration' if r is calibration else r.model_kind})" for r in plotted]
        png = plot_reports(plotted, artifacts.get() / "evaluation" / f"report_{context.run_id}.png", title="evaluation: base → adapters", labels=labels)
        encoded = base64.b64encode(png.read_bytes()).decode()
        metadata["plot"] = dg.MetadataValue.md(f"![before/after](data:image/png;base64,{encoded})")
        metadata["plot_path"] = dg.MetadataValue.path(str(png))
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(json.dumps(sorted(r.report_id for r in ordered))[:200]))
