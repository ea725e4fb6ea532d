"""Which Dagster instance the platform uses: embedded SQLite by default, PostgreSQL by environment."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from agenttune_lib.config import PlatformPaths

INSTANCE_KINDS = ("sqlite", "postgres")
_PG_DEFAULTS = {
    "AGENTTUNE_PG_HOST": "127.0.0.1",
    "AGENTTUNE_PG_PORT": "5432",
    "AGENTTUNE_PG_USER": "postgres",
    "AGENTTUNE_PG_PASSWORD": "",
    "AGENTTUNE_PG_DB": "postgres",
}


def _config_source(kind: str) -> Path:
    if kind == "postgres":
        return Path(__file__).with_name("postgres.yaml")
    repo_default = Path.cwd() / "dagster.yaml"
    if repo_default.exists():
        return repo_default
    return Path(__file__).resolve().parents[2] / "dagster.yaml"


def prepare_dagster_home(kind: str | None = None, home: Path | None = None) -> Path:
    """Set ``DAGSTER_HOME`` (unless already set) to an instance dir of ``kind`` and return it.

    ``kind`` defaults to ``$AGENTTUNE_INSTANCE`` (``sqlite``). The Postgres connection comes
    from ``AGENTTUNE_PG_HOST/PORT/USER/PASSWORD/DB`` (defaults: 127.0.0.1:5432, postgres).
    """
    kind = (kind or os.environ.get("AGENTTUNE_INSTANCE") or "sqlite").lower()
    if kind not in INSTANCE_KINDS:
        raise ValueError(f"AGENTTUNE_INSTANCE must be one of {INSTANCE_KINDS}, got {kind!r}")
    if kind == "postgres":
        for key, value in _PG_DEFAULTS.items():
            os.environ.setdefault(key, value)
    if os.environ.get("DAGSTER_HOME"):
        return Path(os.environ["DAGSTER_HOME"])
    base = home or (PlatformPaths.from_env().home / ("dagster" if kind == "sqlite" else "dagster-postgres"))
    base.mkdir(parents=True, exist_ok=True)
    source = _config_source(kind)
    if not source.exists():
        raise FileNotFoundError(f"no Dagster instance config found at {source}")
    shutil.copyfile(source, base / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(base)
    return base
