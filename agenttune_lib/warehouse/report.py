"""A summary of what the warehouse holds: row counts per table and source, the events schema."""
from __future__ import annotations

import dataclasses
import hashlib

from agenttune_lib.warehouse.store import Warehouse


@dataclasses.dataclass
class WarehouseSummary:
    path: str  # a DuckDB file or a DuckLake URL
    table_rows: dict[str, int]
    by_source: dict[tuple[str | None, str], int]
    events_by_kind: dict[str, int]
    events_columns: list[tuple[str, str]]
    version: str


def warehouse_summary(warehouse: Warehouse) -> WarehouseSummary:
    """Counts and schema in one short connection; ``version`` changes whenever the trajectories do."""
    with warehouse.connect() as con:
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE table_schema='main' AND table_catalog = current_database() ORDER BY 1").fetchall()]
        table_rows = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        by_source = {(s, tier): n for s, tier, n in con.execute("SELECT source, tier, count(*) FROM trajectories GROUP BY ALL ORDER BY ALL").fetchall()}
        by_kind = dict(con.execute("SELECT kind, count(*) FROM events GROUP BY kind ORDER BY kind").fetchall())
        columns = [(r[0], r[1]) for r in con.execute("DESCRIBE events").fetchall()]
        digest = con.execute("SELECT coalesce(string_agg(id, ',' ORDER BY id), '') FROM trajectories").fetchone()[0]
    version = hashlib.sha256(f"{digest}|{table_rows.get('events', 0)}".encode()).hexdigest()[:16]
    return WarehouseSummary(warehouse.path, table_rows, by_source, by_kind, columns, version)
