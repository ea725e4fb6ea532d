"""Row-level lineage for the RL core: rollouts into the warehouse, adapters and their training rows."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agenttune_lib.events import EventLog

__all__ = ["warehouse_sink", "record_adapter", "data_version", "adapter_lineage", "latest_teacher_logs"]


def warehouse_sink(warehouse: Any, provenance: Any = None, source: str = "rollout") -> Callable[[list[EventLog]], None]:
    """A rollout sink that appends every rollout's full-tier EventLogs to the warehouse with provenance."""
    written: list[str] = []

    def sink(logs: list[EventLog]) -> None:
        warehouse.append_logs(list(logs), provenance=provenance, source=source)
        written.extend(log.id for log in logs)

    sink.written = written  # type: ignore[attr-defined]
    return sink


def data_version(trajectory_ids: Sequence[str]) -> str:
    """A content version for a set of training trajectories: sha256 of their sorted ids (16 hex)."""
    digest = hashlib.sha256("\n".join(sorted(trajectory_ids)).encode()).hexdigest()
    return digest[:16]


def record_adapter(
    warehouse: Any,
    adapter_id: str,
    path: str,
    base_model: str,
    algorithm: str,
    trajectory_ids: Sequence[str],
    run_id: str | None = None,
    metrics: Mapping[str, Any] | None = None,
    row_weights: Sequence[float] | None = None,
    warehouse_snapshot: int | None = None,
    parent_adapter_id: str | None = None,
) -> str:
    """Write ``adapters`` and ``training_rows`` rows so lineage walks adapter -> training rows -> trajectories.

    ``warehouse_snapshot``: the DuckLake snapshot the training rows were read at (None on a DuckDB file),
    so lineage can show those rows as they were then. ``parent_adapter_id``: the adapter this one was
    warm-started from (a closed-loop retrain continues the serving adapter). Returns the data version.
    """
    import pyarrow as pa

    version = data_version(trajectory_ids)
    now = _dt.datetime.now(_dt.timezone.utc)
    adapters = pa.table(
        {
            "adapter_id": [adapter_id],
            "path": [str(path)],
            "base_model": [str(base_model)],
            "algorithm": [algorithm],
            "run_id": [run_id],
            "created_at": pa.array([now], type=pa.timestamp("us", tz="UTC")),
            "data_version": [version],
            "n_training_rows": [len(trajectory_ids)],
            "metrics": [json.dumps(dict(metrics or {}), sort_keys=True, default=float)],
            "warehouse_snapshot": pa.array([warehouse_snapshot], type=pa.int64()),
            "parent_adapter_id": pa.array([parent_adapter_id], type=pa.string()),
        }
    )
    # both columns are newer than some stored adapters tables
    warehouse.upsert_arrow("adapters", adapters, key="adapter_id", add_columns=("warehouse_snapshot", "parent_adapter_id"))
    rows = pa.table(
        {
            "adapter_id": [adapter_id] * len(trajectory_ids),
            "trajectory_id": list(trajectory_ids),
            "row_index": list(range(len(trajectory_ids))),
            "weight": [float(w) for w in (row_weights or [1.0] * len(trajectory_ids))],
        },
        schema=pa.schema([("adapter_id", pa.string()), ("trajectory_id", pa.string()), ("row_index", pa.int64()), ("weight", pa.float64())]),
    )
    warehouse.upsert_arrow("training_rows", rows, key=["adapter_id", "row_index"])
    return version


def adapter_lineage(warehouse: Any, adapter_id: str) -> dict[str, Any]:
    """The adapter row and the trajectories its training rows name."""
    found = warehouse.query_arrow("SELECT * FROM adapters WHERE adapter_id = ?", [adapter_id]).to_pylist()  # * : older tables lack newer columns
    if not found:
        raise KeyError(f"no adapter {adapter_id!r} in the warehouse")
    a = found[0]
    traj = warehouse.execute(
        "SELECT r.row_index, r.trajectory_id, t.source, t.run_id FROM training_rows r LEFT JOIN trajectories t ON t.id = r.trajectory_id "
        "WHERE r.adapter_id = ? ORDER BY r.row_index",
        [adapter_id],
    )
    return {
        **{k: a.get(k) for k in ("adapter_id", "path", "base_model", "algorithm", "run_id", "data_version")},
        "metrics": json.loads(a["metrics"]) if a.get("metrics") else {},
        "parent_adapter_id": a.get("parent_adapter_id"),  # the adapter this one was warm-started from, if any
        "training_rows": [{"row_index": r[0], "trajectory_id": r[1], "source": r[2], "run_id": r[3]} for r in traj],
    }


def latest_teacher_logs(warehouse: Any, snapshot: int | None = None, asset_key: str = "teacher_trajectories") -> list[EventLog]:
    """The newest teacher run's logs (older runs stay in the warehouse for lineage, not for a new adapter).

    On a DuckLake warehouse they are read at ``snapshot``, the one the adapter records.
    """
    if not warehouse.has_table("trajectories"):
        return []
    at = f" AT (VERSION => {int(snapshot)})" if snapshot is not None else ""  # an int, never caller text
    latest = warehouse.execute(f"SELECT run_id FROM trajectories{at} WHERE asset_key = ? ORDER BY created_at DESC LIMIT 1", [asset_key])
    if not latest:
        return []
    if latest[0][0] is None:
        return warehouse.read_logs(where="t.asset_key = ?", params=[asset_key], snapshot=snapshot)
    return warehouse.read_logs(where="t.asset_key = ? AND t.run_id = ?", params=[asset_key, latest[0][0]], snapshot=snapshot)
