"""Row-level lineage queries over a warehouse: where a trajectory came from and what a Dagster run wrote."""
from __future__ import annotations

from typing import Any

from agenttune_lib.warehouse.connection import _lake_retrying
from agenttune_lib.warehouse.types import _ident


class LineageQueries:
    """Mixed into Warehouse: needs its ``connect()``, ``path`` and ``is_lake``."""

    @_lake_retrying
    def trajectory_lineage(self, trajectory_id: str) -> dict[str, Any]:
        """The rows a trajectory came from: its provenance, QA items, chunks and documents."""
        with self.connect() as con:
            row = con.execute(
                "SELECT id, source, task, run_id, asset_key, partition, model_version, adapter_version, qa_item_ids, chunk_ids, created_at "
                "FROM trajectories WHERE id = ?",
                [trajectory_id],
            ).fetchone()
            if row is None:
                raise KeyError(f"no trajectory {trajectory_id!r} in warehouse {self.path}")
            cols = ["id", "source", "task", "run_id", "asset_key", "partition", "model_version", "adapter_version", "qa_item_ids", "chunk_ids", "created_at"]
            out: dict[str, Any] = {"trajectory": dict(zip(cols, row))}
            out["trajectory"]["created_at"] = str(out["trajectory"]["created_at"])
            tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database()").fetchall()}
            qa_ids = list(row[8] or [])
            chunk_ids = set(row[9] or [])
            out["qa_items"] = []
            if qa_ids and "qa_items" in tables:
                qa = con.sql("SELECT * FROM qa_items WHERE qa_id IN (SELECT unnest(?))", params=[qa_ids]).to_arrow_table().to_pylist()
                out["qa_items"] = qa
                for item in qa:
                    chunk_ids.update(item.get("gold_chunk_ids") or [])
            out["chunks"] = []
            doc_ids: set[str] = set()
            if chunk_ids and "chunks" in tables:
                chunks = con.execute(
                    "SELECT chunk_id, doc_id FROM chunks WHERE chunk_id IN (SELECT unnest(?))", [sorted(chunk_ids)]
                ).fetchall()
                out["chunks"] = [{"chunk_id": c, "doc_id": d} for c, d in chunks]
                doc_ids = {d for _, d in chunks}
            out["documents"] = []
            if doc_ids and "documents" in tables:
                out["documents"] = [
                    {"doc_id": d, "source": s, "path": p, "title": t}
                    for d, s, p, t in con.execute(
                        "SELECT doc_id, source, path, title FROM documents WHERE doc_id IN (SELECT unnest(?))", [sorted(doc_ids)]
                    ).fetchall()
                ]
        return out

    @_lake_retrying
    def written_by_run(self, run_id: str) -> dict[str, list[Any]]:
        """Every row a Dagster run wrote, per table with a ``run_id`` column (keyed by the table's first column)."""
        out: dict[str, list[Any]] = {}
        with self.connect() as con:
            tables = con.execute(
                "SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id' AND table_schema = 'main' AND table_catalog = current_database() ORDER BY 1"
            ).fetchall()
            for (table,) in tables:
                first = con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = ? AND table_catalog = current_database() ORDER BY ordinal_position LIMIT 1", [table]
                ).fetchone()[0]
                keys = [r[0] for r in con.execute(f'SELECT "{first}" FROM {_ident(table)} WHERE run_id = ? ORDER BY 1', [run_id]).fetchall()]
                if keys:
                    out[table] = keys
        return out
