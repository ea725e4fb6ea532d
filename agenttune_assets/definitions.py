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


def build_definitions() -> dg.Definitions:
    """Collect definitions from the ``defs`` packages."""
    asset_modules = _submodules(assets)
    check_modules = _submodules(asset_checks)
    return dg.Definitions(
        assets=dg.load_assets_from_modules(asset_modules),
        asset_checks=dg.load_asset_checks_from_modules(check_modules),
        jobs=_optional_list("jobs", "JOBS"),
        sensors=_optional_list("sensors", "SENSORS"),
        schedules=_optional_list("schedules", "SCHEDULES"),
        resources=default_resources(),
    )


defs = build_definitions()
