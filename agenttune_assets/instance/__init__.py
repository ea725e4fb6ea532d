"""Which Dagster instance the platform uses: embedded SQLite by default, PostgreSQL by environment.

The templates (``sqlite.yaml``, ``postgres.yaml``) ship inside the package, so a non-editable install
finds them. A ``dagster.yaml`` is written once into the instance directory and never overwritten:
a user's edits to it survive every CLI call.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from agenttune_lib.config import PlatformPaths

INSTANCE_KINDS = ("sqlite", "postgres")
_PG_DEFAULTS = {
    "AGENTTUNE_PG_HOST": "127.0.0.1",
    "AGENTTUNE_PG_PORT": "5432",
    "AGENTTUNE_PG_USER": "postgres",
    "AGENTTUNE_PG_PASSWORD": "",
    "AGENTTUNE_PG_DB": "postgres",
}


class InstanceConfigError(RuntimeError):
    """The requested instance kind and the instance directory's ``dagster.yaml`` disagree, or the file is unreadable."""


def template_path(kind: str) -> Path:
    """The packaged ``dagster.yaml`` template for ``kind`` (``sqlite`` or ``postgres``)."""
    kind = _check_kind(kind)
    return Path(__file__).with_name(f"{kind}.yaml")


def _check_kind(kind: str) -> str:
    kind = kind.lower()
    if kind not in INSTANCE_KINDS:
        raise ValueError(f"AGENTTUNE_INSTANCE must be one of {INSTANCE_KINDS}, got {kind!r}")
    return kind


def instance_kind_of(config_file: Path) -> str:
    """``postgres`` when ``config_file`` stores runs in PostgreSQL, else ``sqlite`` (Dagster's default storage)."""
    try:
        data = yaml.safe_load(config_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InstanceConfigError(f"cannot read Dagster instance config {config_file}: {exc}") from exc
    if not isinstance(data, dict):
        raise InstanceConfigError(f"Dagster instance config {config_file} is not a YAML mapping")
    text = yaml.safe_dump({k: data.get(k) for k in ("storage", "run_storage", "event_log_storage", "schedule_storage")})
    return "postgres" if "postgres" in text else "sqlite"


def default_home(kind: str) -> Path:
    """``$AGENTTUNE_HOME/dagster`` (SQLite) or ``$AGENTTUNE_HOME/dagster-postgres``."""
    return PlatformPaths.from_env().home / ("dagster" if _check_kind(kind) == "sqlite" else "dagster-postgres")


def init_instance(home: Path, kind: str = "sqlite") -> tuple[Path, bool]:
    """Write ``home/dagster.yaml`` from the ``kind`` template unless it exists; (path, written).

    An existing file is never overwritten; if it configures the other storage kind that is an
    :class:`InstanceConfigError` naming the file and both kinds.
    """
    kind = _check_kind(kind)
    target = Path(home) / "dagster.yaml"
    if target.exists():
        found = instance_kind_of(target)
        if found != kind:
            raise InstanceConfigError(
                f"{target} configures a {found} instance but {kind} was requested (AGENTTUNE_INSTANCE / --kind); "
                f"unset AGENTTUNE_INSTANCE, point DAGSTER_HOME elsewhere, or edit that file yourself — it is never overwritten"
            )
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL: two processes initialising at once cannot both write (nor clobber a file created meanwhile).
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return init_instance(home, kind)
    with os.fdopen(fd, "w") as fh:
        fh.write(template_path(kind).read_text())
    return target, True


def prepare_dagster_home(kind: str | None = None, home: Path | None = None) -> Path:
    """Set ``DAGSTER_HOME`` (unless already set) to an instance dir of ``kind``, initialise it once, return it.

    ``kind`` defaults to ``$AGENTTUNE_INSTANCE`` (``sqlite``). With ``DAGSTER_HOME`` set, that directory is
    used: its ``dagster.yaml`` is created from the template if missing, and must match an explicitly requested
    kind. The Postgres connection comes from ``AGENTTUNE_PG_HOST/PORT/USER/PASSWORD/DB`` (defaults:
    127.0.0.1:5432, postgres).
    """
    requested = kind or os.environ.get("AGENTTUNE_INSTANCE") or None
    if requested is not None:
        requested = _check_kind(requested)
    if os.environ.get("DAGSTER_HOME"):
        base = Path(os.environ["DAGSTER_HOME"])
        existing = base / "dagster.yaml"
        effective = requested or (instance_kind_of(existing) if existing.exists() else "sqlite")
    else:
        effective = requested or "sqlite"
        base = home or default_home(effective)
    init_instance(base, effective)
    if effective == "postgres":
        for key, value in _PG_DEFAULTS.items():
            os.environ.setdefault(key, value)
    os.environ["DAGSTER_HOME"] = str(base)
    return base
