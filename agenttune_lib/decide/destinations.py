"""Decision destinations dispatched after a run completes: a JSONL file, the DuckDB warehouse, PostgreSQL."""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agenttune_lib.decide.errors import DecideError

__all__ = [
    "Outbox",
    "DestinationRouter",
    "FileDestination",
    "DuckDBDestination",
    "PostgresDestination",
    "decision_record",
    "DEFAULT_TABLE",
]

DEFAULT_TABLE = "decide_decisions"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
COLUMNS = ("run_id", "template_id", "status", "label", "confidence", "reason", "steps", "created_at", "record")


def _table(name: str) -> str:
    if not _IDENT.match(name):
        raise DecideError(f"destination table name {name!r} is not a plain SQL identifier")
    return name


def decision_record(state: Any, created_at: str) -> dict[str, Any]:
    """The row a destination stores for one finished run."""
    verdict = dict(state.verdict or {})
    return {
        "run_id": state.run_id,
        "template_id": state.template_id,
        "status": state.status,
        "label": None if verdict.get("label") is None else str(verdict.get("label")),
        "confidence": float(verdict["confidence"]) if isinstance(verdict.get("confidence"), (int, float)) else None,
        "reason": None if verdict.get("reason") is None else str(verdict.get("reason")),
        "steps": int(state.steps),
        "created_at": created_at,
        "path": [s["stage_id"] for s in state.step_history],
        "error": state.error,
    }


class FileDestination:
    """Appends one JSON line per decision."""

    type = "file"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def write(self, record: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def _row(record: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **{k: record.get(k) for k in COLUMNS if k != "record"},
        "record": json.dumps(record, sort_keys=True, default=str),
    }


class DuckDBDestination:
    """Upserts decisions by run_id into a table of the DuckDB warehouse."""

    type = "duckdb"

    def __init__(self, path: str | Path, table: str = DEFAULT_TABLE) -> None:
        self.path = Path(path)
        self.table = _table(table)

    def write(self, record: Mapping[str, Any]) -> None:
        import pyarrow as pa

        from agenttune_lib.warehouse import Warehouse

        row = _row(record)
        schema = pa.schema(
            [
                ("run_id", pa.string()), ("template_id", pa.string()), ("status", pa.string()), ("label", pa.string()),
                ("confidence", pa.float64()), ("reason", pa.string()), ("steps", pa.int64()), ("created_at", pa.string()),
                ("record", pa.string()),
            ]
        )
        table = pa.Table.from_pylist([row], schema=schema)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        Warehouse(self.path).upsert_arrow(self.table, table, key="run_id")


class PostgresDestination:
    """Upserts decisions by run_id into a PostgreSQL table (SQLAlchemy + psycopg2)."""

    type = "postgres"

    def __init__(self, url: str, table: str = DEFAULT_TABLE, connect_timeout: int = 5) -> None:
        if url.startswith("postgresql://") or url.startswith("postgres://"):
            url = "postgresql+psycopg2://" + url.split("://", 1)[1]
        self.url = url
        self.table = _table(table)
        self.connect_timeout = connect_timeout
        self._engine: Any = None

    def engine(self) -> Any:
        if self._engine is None:
            import sqlalchemy

            self._engine = sqlalchemy.create_engine(self.url, connect_args={"connect_timeout": self.connect_timeout}, pool_pre_ping=True)
        return self._engine

    def ensure_table(self) -> None:
        import sqlalchemy

        with self.engine().begin() as con:
            con.execute(
                sqlalchemy.text(
                    f"""CREATE TABLE IF NOT EXISTS {self.table} (
                        run_id TEXT PRIMARY KEY, template_id TEXT NOT NULL, status TEXT, label TEXT,
                        confidence DOUBLE PRECISION, reason TEXT, steps INTEGER, created_at TEXT, record JSONB)"""
                )
            )

    def write(self, record: Mapping[str, Any]) -> None:
        import sqlalchemy

        self.ensure_table()
        cols = ", ".join(COLUMNS)
        params = ", ".join(f":{c}" if c != "record" else "CAST(:record AS JSONB)" for c in COLUMNS)
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in COLUMNS if c != "run_id")
        with self.engine().begin() as con:
            con.execute(
                sqlalchemy.text(f"INSERT INTO {self.table} ({cols}) VALUES ({params}) ON CONFLICT (run_id) DO UPDATE SET {updates}"),
                _row(record),
            )

    def dispose(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


class DestinationRouter:
    """Builds destinations from output-stage specs and dispatches a finished run's record to each.

    Spec keys: ``type`` (file | duckdb | postgres), ``path`` (file and duckdb; relative
    paths resolve under ``base_dir``; duckdb defaults to the warehouse), ``url``
    (postgres; ``$ENV_NAME`` reads an environment variable), ``table``.
    """

    def __init__(
        self, specs: Sequence[Mapping[str, Any]], base_dir: str | Path | None = None, warehouse_path: str | Path | None = None,
        outbox: "Outbox | None" = None,
    ) -> None:
        self.base_dir = Path(base_dir) if base_dir is not None else Path.cwd()
        self.warehouse_path = Path(warehouse_path) if warehouse_path is not None else None
        self.specs = [dict(s) for s in specs]
        self.destinations = [self._build(dict(s)) for s in specs]
        self.outbox = outbox

    def _path(self, value: Any) -> Path:
        path = Path(str(value))
        return path if path.is_absolute() else self.base_dir / path

    def _build(self, spec: dict[str, Any]) -> Any:
        kind = spec.get("type")
        if kind == "file":
            return FileDestination(self._path(spec.get("path", "decisions.jsonl")))
        if kind == "duckdb":
            path = self._path(spec["path"]) if spec.get("path") else self.warehouse_path
            if path is None:
                from agenttune_lib.config import PlatformPaths

                path = PlatformPaths.from_env().warehouse
            return DuckDBDestination(path, spec.get("table", DEFAULT_TABLE))
        if kind == "postgres":
            url = str(spec.get("url", "$AGENTTUNE_DECIDE_PG_URL"))
            if url.startswith("$"):
                env = url[1:]
                url = os.environ.get(env, "")
                if not url:
                    raise DecideError(f"postgres destination: environment variable {env} is not set")
            return PostgresDestination(url, spec.get("table", DEFAULT_TABLE))
        if hasattr(spec.get("destination"), "write"):
            return spec["destination"]
        raise DecideError(f"unknown destination type {kind!r}; known: file, duckdb, postgres")

    def dispatch(self, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Write to every destination; one failure is reported, not raised, and does not stop the others. With an
        outbox, a failed write is kept there (durably) for ``Outbox.retry``: the decision is never lost."""
        results = []
        for spec, dest in zip(self.specs, self.destinations):
            try:
                dest.write(record)
                results.append({"type": dest.type, "ok": True, "error": None})
            except Exception as exc:  # a destination outage must not lose the run or its audit line
                error = f"{type(exc).__name__}: {exc}"
                entry = {"type": dest.type, "ok": False, "error": error}
                if self.outbox is not None and "destination" not in spec:
                    self.outbox.add(spec, record, error)
                    entry["outbox"] = str(self.outbox.path)
                results.append(entry)
        return results


class Outbox:
    """Destination writes that failed, as durable JSON lines (fsync'd, under a file lock), retried later.

    Each entry holds the destination spec and the (already redacted) decision record; ``retry`` re-sends every entry
    and keeps only those that fail again.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _lock(self) -> Any:
        from agenttune_lib.decide.audit import _locked

        return _locked(self.path)

    def add(self, spec: Mapping[str, Any], record: Mapping[str, Any], error: str) -> None:
        import json as _json

        from agenttune_lib.decide.audit import utc_now

        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = _json.dumps({"spec": dict(spec), "record": dict(record), "error": error, "failed_at": utc_now(), "attempts": 1},
                           sort_keys=True, default=str)
        with self._lock(), open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def entries(self) -> list[dict[str, Any]]:
        import json as _json

        if not self.path.exists():
            return []
        return [_json.loads(x) for x in self.path.read_text(encoding="utf-8").split("\n") if x.strip()]

    def retry(self, base_dir: str | Path | None = None, warehouse_path: str | Path | None = None) -> tuple[int, int]:
        """Re-send every entry; returns (delivered, still failing)."""
        import json as _json

        if not self.path.exists():
            return 0, 0
        with self._lock():
            kept, delivered = [], 0
            for entry in self.entries():
                try:
                    DestinationRouter([entry["spec"]], base_dir=base_dir, warehouse_path=warehouse_path).destinations[0].write(entry["record"])
                    delivered += 1
                except Exception as exc:  # still down: keep it for the next retry
                    kept.append({**entry, "error": f"{type(exc).__name__}: {exc}", "attempts": int(entry.get("attempts", 1)) + 1})
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(_json.dumps(e, sort_keys=True, default=str) + "\n" for e in kept), encoding="utf-8")
            os.replace(tmp, self.path)
        return delivered, len(kept)
