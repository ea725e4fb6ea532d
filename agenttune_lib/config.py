"""Where the platform keeps its durable state on disk."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class PlatformPaths:
    """The platform's home directory and the stores under it."""

    home: Path

    @classmethod
    def from_env(cls) -> "PlatformPaths":
        """``$AGENTTUNE_HOME``, or ``./.agenttune`` in the working directory."""
        return cls(Path(os.environ.get("AGENTTUNE_HOME", ".agenttune")).resolve())

    @property
    def warehouse(self) -> Path:
        return self.home / "warehouse.duckdb"

    @property
    def models(self) -> Path:
        return self.home / "models"

    @property
    def artifacts(self) -> Path:
        return self.home / "artifacts"

    def ensure(self) -> "PlatformPaths":
        for path in (self.home, self.models, self.artifacts):
            path.mkdir(parents=True, exist_ok=True)
        return self
