"""The named, parameterised queries Dagster's assets and checks run: SQL stays in the warehouse package."""
from __future__ import annotations

from typing import Any

from agenttune_lib.warehouse.store import Warehouse
from agenttune_lib.warehouse.types import _ident

__all__ = ["trajectory_versions", "newest_adapter_of", "chunk_ids", "adapter_paths", "column_types", "rows_by_writer", "logs_written_by"]


def trajectory_versions(warehouse: Warehouse, run_id: str, source: str) -> list[tuple[str, str | None]]:
    """(trajectory id, model version) of every trajectory a Dagster run wrote from ``source``."""
    return warehouse.execute("SELECT id, model_version FROM trajectories WHERE run_id = ? AND source = ?", [run_id, source])


def newest_adapter_of(warehouse: Warehouse, table: str, model_label: str) -> str | None:
    """The adapter id of ``table``'s newest row scored as ``model_label`` (an evaluation table); None when there is none."""
    if not warehouse.has_table(_ident(table)):
        return None
    rows = warehouse.execute(f"SELECT adapter_id FROM {table} WHERE model_label = ? ORDER BY created_at DESC LIMIT 1", [model_label])
    return rows[0][0] if rows else None


def chunk_ids(warehouse: Warehouse) -> set[str]:
    """Every chunk id in the ``chunks`` table (empty when there is no such table)."""
    if not warehouse.has_table("chunks"):
        return set()
    return {r[0] for r in warehouse.execute("SELECT chunk_id FROM chunks")}


def adapter_paths(warehouse: Warehouse) -> dict[str, str] | None:
    """Adapter id -> path, newest first; None when the warehouse has no ``adapters`` table."""
    if not warehouse.has_table("adapters"):
        return None
    return {a: p for a, p in warehouse.execute("SELECT adapter_id, path FROM adapters ORDER BY created_at DESC")}


def column_types(warehouse: Warehouse, table: str) -> list[tuple[str, str]]:
    """(column, SQL type) of ``table`` in order."""
    with warehouse.connect() as con:
        return [(r[0], r[1]) for r in con.execute(f"DESCRIBE {_ident(table)}").fetchall()]


def rows_by_writer(warehouse: Warehouse) -> list[tuple[str, int, int]]:
    """(writing asset or '-', trajectories, events) per asset that appended EventLogs, by asset name."""
    rows: list[Any] = warehouse.execute(
        "SELECT coalesce(t.asset_key, '-') AS asset, count(DISTINCT t.id), count(e.seq) FROM trajectories t "
        "LEFT JOIN events e ON e.trajectory_id = t.id GROUP BY ALL ORDER BY 1")
    return [(a, int(n), int(m)) for a, n, m in rows]


def logs_written_by(warehouse: Warehouse, asset_key: str, tier: str | None = None) -> list:
    """The EventLogs an asset appended (of ``tier`` when given), in insertion order; [] before any trajectory exists."""
    if not warehouse.has_table("trajectories"):
        return []
    where, params = ("t.asset_key = ? AND t.tier = ?", [asset_key, tier]) if tier is not None else ("t.asset_key = ?", [asset_key])
    return warehouse.read_logs(where=where, params=params)
