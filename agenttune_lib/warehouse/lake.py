"""DuckLake connections for the warehouse: Parquet data files plus a catalog database (SQLite or PostgreSQL).

A plain DuckDB file admits one writing process and blocks readers while it is held; with DuckLake
every connection is an in-memory DuckDB that attaches the catalog, so several processes (or hosts,
with a PostgreSQL catalog and shared data files) append at once, readers never wait for a file lock,
and every commit is a snapshot that can be read back as it was (``AT (VERSION => n)``).
The extensions come from the ``duckdb-ext-*`` wheels (DuckDB 1.4.4): nothing is downloaded.
"""
from __future__ import annotations

import importlib.util
import os
import random
import time
from pathlib import Path

import duckdb

LAKE_PREFIX = "ducklake:"
LAKE_ALIAS = "lake"
_EXTENSIONS = ("ducklake", "sqlite_scanner", "postgres_scanner", "parquet", "json")
_RETRY_MARKERS = ("database is locked", "conflict", "Conflict", "could not serialize", "deadlock", "SQLITE_BUSY")


class LakeError(RuntimeError):
    """A DuckLake catalog could not be attached or its extensions are missing."""


def is_lake(path: str | Path) -> bool:
    return str(path).startswith(LAKE_PREFIX)


def sqlite_lake_url(catalog_file: str | Path) -> str:
    """``ducklake:sqlite:<file>``: the embedded multi-writer catalog (data files next to it in ``data/``)."""
    return f"{LAKE_PREFIX}sqlite:{Path(catalog_file).resolve()}"


def postgres_lake_url(dbname: str, host: str = "127.0.0.1", port: int = 5432, user: str = "postgres", password: str = "") -> str:
    """``ducklake:postgres:<libpq dsn>``: the production catalog several hosts share."""
    dsn = f"dbname={dbname} host={host} port={port} user={user}" + (f" password={password}" if password else "")
    return f"{LAKE_PREFIX}postgres:{dsn}"


def default_data_path(url: str) -> str:
    """Where data files go when not configured: ``data/`` beside a SQLite catalog, else ``$AGENTTUNE_LAKE_DATA_PATH``."""
    rest = url[len(LAKE_PREFIX):]
    if rest.startswith("sqlite:"):
        return str(Path(rest[len("sqlite:"):]).parent / "data") + "/"
    env = os.environ.get("AGENTTUNE_LAKE_DATA_PATH")
    if not env:
        raise LakeError(f"{url}: a PostgreSQL catalog needs data_path= or $AGENTTUNE_LAKE_DATA_PATH (shared or object storage)")
    return env.rstrip("/") + "/"


def extension_dir() -> Path:
    spec = importlib.util.find_spec("duckdb_ext")
    if spec is None or not spec.submodule_search_locations:
        raise LakeError("the duckdb-ext-* wheels are not installed (pip install duckdb-ext-ducklake==1.4.4.20260205 ...)")
    base = Path(list(spec.submodule_search_locations)[0]) / "extensions" / f"v{duckdb.__version__}" / "linux_amd64"
    if not (base / "ducklake.duckdb_extension").exists():
        raise LakeError(f"no DuckLake extension for DuckDB {duckdb.__version__} under {base}")
    return base


def retryable(exc: BaseException) -> bool:
    """A catalog lock or a commit conflict with another writer: try again."""
    return any(m in str(exc) for m in _RETRY_MARKERS)


def open_lake(url: str, data_path: str | None, read_only: bool = False, timeout_s: float = 120.0) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the lake attached as ``lake`` and selected (``USE lake``)."""
    if not is_lake(url):
        raise LakeError(f"not a DuckLake URL: {url!r} (expected ducklake:sqlite:<file> or ducklake:postgres:<dsn>)")
    ext = extension_dir()
    data = data_path or default_data_path(url)
    if url[len(LAKE_PREFIX):].startswith("sqlite:"):
        Path(url[len(LAKE_PREFIX) + len("sqlite:"):]).parent.mkdir(parents=True, exist_ok=True)
    if "://" not in data:
        Path(data).mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        con = duckdb.connect()
        try:
            for name in _EXTENSIONS:
                con.execute(f"LOAD '{ext / (name + '.duckdb_extension')}'")
            opts = f"DATA_PATH '{data}'" + (", READ_ONLY" if read_only else "")
            con.execute(f"ATTACH '{url}' AS {LAKE_ALIAS} ({opts})")
            con.execute(f"USE {LAKE_ALIAS}")
            return con
        except duckdb.Error as exc:
            con.close()
            if not retryable(exc) or time.monotonic() > deadline:
                raise LakeError(f"cannot attach {url}: {exc}") from exc
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
