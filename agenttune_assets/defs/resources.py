"""Dagster resources: thin configurable handles onto the library's stores and models."""
from __future__ import annotations

from pathlib import Path

import dagster as dg

from agenttune_lib.config import PlatformPaths
from agenttune_lib.warehouse import Warehouse


def _default_home() -> str:
    return str(PlatformPaths.from_env().home)


class WarehouseResource(dg.ConfigurableResource):
    """The DuckDB EventLog warehouse; connections are opened per call, never held across steps."""

    path: str = ""

    def get(self) -> Warehouse:
        path = self.path or str(PlatformPaths.from_env().warehouse)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return Warehouse(path)


class ModelsResource(dg.ConfigurableResource):
    """Where converted model checkpoints and trained adapters live."""

    path: str = ""

    def get(self) -> Path:
        path = Path(self.path or PlatformPaths.from_env().models)
        path.mkdir(parents=True, exist_ok=True)
        return path


class ArtifactsResource(dg.ConfigurableResource):
    """Where file artifacts (Parquet stages, indexes, reports) live."""

    path: str = ""

    def get(self) -> Path:
        path = Path(self.path or PlatformPaths.from_env().artifacts)
        path.mkdir(parents=True, exist_ok=True)
        return path


def default_resources() -> dict[str, dg.ConfigurableResource]:
    """The embedded default: everything under ``$AGENTTUNE_HOME`` (./.agenttune)."""
    return {
        "warehouse": WarehouseResource(),
        "models": ModelsResource(),
        "artifacts": ArtifactsResource(),
    }
