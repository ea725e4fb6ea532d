"""The code location: every asset, check, job, sensor and schedule under ``defs/``."""
from __future__ import annotations

import importlib
import pkgutil

import dagster as dg

from agenttune_assets.defs import asset_checks, assets
from agenttune_assets.defs.resources import default_resources


def _optional_list(module_name: str, attr: str) -> list:
    try:
        module = importlib.import_module(f"agenttune_assets.defs.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"agenttune_assets.defs.{module_name}":
            return []
        raise
    return list(getattr(module, attr, []))


def _submodules(package) -> list:
    return [importlib.import_module(f"{package.__name__}.{m.name}") for m in pkgutil.iter_modules(package.__path__)]


def _main_job(loaded_assets: list) -> dg.UnresolvedAssetJobDefinition:
    """The whole graph in one run; partitioned assets are excluded (one job cannot mix partitionings)
    and materialized per default partition by ``agenttune materialize`` instead."""
    partitioned = [
        key
        for a in loaded_assets
        if isinstance(a, dg.AssetsDefinition) and a.partitions_def is not None
        for key in a.keys
    ]
    selection = dg.AssetSelection.all() - dg.AssetSelection.assets(*partitioned) if partitioned else dg.AssetSelection.all()
    return dg.define_asset_job(
        "main_job", selection=selection, description="Materialize the whole AgentTune asset graph: corpus to deployed adapter."
    )


def build_definitions() -> dg.Definitions:
    """Collect definitions from the ``defs`` packages."""
    asset_modules = _submodules(assets)
    check_modules = _submodules(asset_checks)
    loaded = dg.load_assets_from_modules(asset_modules)
    for module in asset_modules:
        PARTITIONED_DEFAULTS.update(getattr(module, "MAIN_JOB_PARTITIONS", {}))
    return dg.Definitions(
        assets=loaded,
        asset_checks=dg.load_asset_checks_from_modules(check_modules),
        jobs=[_main_job(loaded), *_optional_list("jobs", "JOBS")],
        sensors=_optional_list("sensors", "SENSORS"),
        schedules=_optional_list("schedules", "SCHEDULES"),
        resources=default_resources(),
    )


#: asset key -> partition keys that ``agenttune materialize`` runs after the main job
#: (declared by an asset module as ``MAIN_JOB_PARTITIONS``).
PARTITIONED_DEFAULTS: dict[str, list[str]] = {}

defs = build_definitions()


def get_main_job() -> dg.JobDefinition:
    """The resolved main job (module-level, so ``dg.reconstructable`` can rebuild it in run workers)."""
    return defs.resolve_job_def("main_job")
