"""Row-level lineage: a deployed adapter back to its gate decision, training rows, trajectories, QA items, chunks and documents.

Every hop is a join over the warehouse's own tables and provenance columns; the
``runs`` section lists each (asset key, Dagster run id) pair met on the way so the
asset-level lineage Dagster records can be joined to it by run id.
"""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

__all__ = ["adapter_lineage", "LineageError"]


class LineageError(LookupError):
    """The adapter is not in the warehouse, or a table the chain needs is missing."""


def _jsonable(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _columns(con: Any, table: str) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? AND table_schema = 'main' AND table_catalog = current_database() ORDER BY ordinal_position", [table]
    ).fetchall()]


def _rows(con: Any, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, params)
    cols = [d[0] for d in cur.description]
    return [_jsonable(dict(zip(cols, r))) for r in cur.fetchall()]


def _select(con: Any, table: str, wanted: list[str], where: str, params: list[Any], order: str = "", at: str = "") -> list[dict[str, Any]]:
    """``wanted`` columns the table has, of rows matching ``where``; ``at`` reads a DuckLake snapshot (`` AT (VERSION => n)``)."""
    have = _columns(con, table)
    if not have:
        return []
    cols = ", ".join(f'"{c}"' for c in wanted if c in have) or "*"
    return _rows(con, f"SELECT {cols} FROM {table}{at} WHERE {where} {order}", params)


def _examples(con: Any, batch_id: str) -> list[dict[str, Any]]:
    """The corrected examples a retrain batch held: the failing run, the stage, the correction and where it came from."""
    rows = _select(con, "training_buffer_batch_rows", ["example"], "batch_id = ?", [batch_id], "ORDER BY seq")
    out = []
    for r in rows:
        e = json.loads(r["example"]) if isinstance(r.get("example"), str) else {}
        meta = e.get("metadata") or {}
        out.append({"example_id": e.get("example_id"), "trajectory_id": e.get("trajectory_id"), "root_cause": e.get("root_cause"),
                    "accepted": e.get("accepted"), "stage": meta.get("stage"), "chosen": e.get("chosen"), "rejected": e.get("rejected"),
                    "origin": meta.get("origin"), "validation": e.get("validation"), "source": e.get("source"), "trusted": e.get("trusted"),
                    "served_adapter_id": meta.get("served_adapter_id"), "template": meta.get("template")})
    return out


def audit_lines(audit_files: list[str | Path], run_ids: set[str]) -> list[dict[str, Any]]:
    """The DECIDE audit lines (stage and completion lines) of the given runs, with the file and the adapter that served each run."""
    out = []
    for path in audit_files:
        path = Path(path)
        if not path.exists() or not run_ids:
            continue
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if not any(rid in line for rid in run_ids):
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if str(rec.get("run_id")) in run_ids:
                    out.append({"file": str(path), "seq": rec.get("seq"), "record_type": rec.get("record_type"), "run_id": rec.get("run_id"),
                                "stage_id": rec.get("stage_id"), "status": rec.get("status"), "label": rec.get("label"),
                                "error": str(rec.get("error"))[:200] if rec.get("error") else None,
                                "served_adapter_id": rec.get("served_adapter_id"), "source": rec.get("source"), "trusted": rec.get("trusted")})
    return out


def adapter_lineage(
    warehouse: Any, adapter_id: str, deploy_root: str | Path | None = None, audit_files: list[str | Path] | None = None
) -> dict[str, Any]:
    """The whole chain for one adapter as plain JSON-able data; KeyError-style LineageError if it is unknown.

    For a closed-loop retrain it also lists the batch's corrected examples and, given the DECIDE
    audit logs, the failing runs' audit lines (each naming the adapter that served that run).
    """
    with warehouse.connect(read_only=True) as con:
        adapters = _select(con, "adapters", ["adapter_id", "path", "base_model", "algorithm", "run_id", "created_at", "data_version", "n_training_rows",
                                             "warehouse_snapshot", "parent_adapter_id"], "adapter_id = ?", [adapter_id])
        if not adapters:
            raise LineageError(f"no adapter {adapter_id!r} in the warehouse {warehouse.path} (table adapters)")
        out: dict[str, Any] = {"adapter": adapters[0]}
        deployments = _select(con, "deployments", ["deployment_id", "adapter_id", "previous_adapter_id", "decision_id", "action", "path", "run_id", "created_at"],
                              "adapter_id = ?", [adapter_id], "ORDER BY created_at DESC")
        out["deployments"] = deployments
        pointer = None
        if deploy_root is not None and (Path(deploy_root) / "DEPLOYED.json").exists():
            pointer = json.loads((Path(deploy_root) / "DEPLOYED.json").read_text(encoding="utf-8"))
        out["serving"] = pointer
        out["deployment"] = (pointer if pointer and pointer.get("adapter_id") == adapter_id else None) or (deployments[0] if deployments else None)
        decision_id = (out["deployment"] or {}).get("decision_id")
        decisions = _select(con, "gate_decisions", ["decision_id", "candidate", "baseline", "batch_id", "approved", "accuracy_old", "accuracy_new",
                                                    "n_cases", "reasons", "arms", "run_id", "created_at"],
                            "decision_id = ?" if decision_id else "candidate = ?", [decision_id or adapter_id], "ORDER BY created_at DESC")
        for d in decisions:
            for key in ("reasons", "arms"):
                if isinstance(d.get(key), str):
                    d[key] = json.loads(d[key])
        out["gate_decision"] = decisions[0] if decisions else None
        batch_id = (out["gate_decision"] or {}).get("batch_id")
        out["retrain_batch"] = None
        if batch_id:
            batch = _select(con, "training_buffer_batches", ["batch_id", "buffer", "status", "trigger", "run_id", "n_examples", "n_accepted", "causes", "created_at"],
                            "batch_id = ?", [batch_id])
            out["retrain_batch"] = batch[0] if batch else None
        out["corrected_examples"] = _examples(con, batch_id) if batch_id else []
        training = _select(con, "training_rows", ["row_index", "trajectory_id", "weight"], "adapter_id = ?", [adapter_id], "ORDER BY row_index")
        out["training_rows"] = training
        traj_ids = sorted({r["trajectory_id"] for r in training if r.get("trajectory_id")})
        traj_cols = ["id", "source", "task", "run_id", "asset_key", "partition", "model_version", "adapter_version", "qa_item_ids", "chunk_ids", "created_at"]
        snapshot = adapters[0].get("warehouse_snapshot")
        out["as_of_snapshot"] = snapshot
        # On a lake the rows come back as they were when the adapter read them (its snapshot), not as they are now.
        at = f" AT (VERSION => {int(snapshot)})" if snapshot is not None else ""
        trajectories = _select(con, "trajectories", traj_cols, "id IN (SELECT unnest(?))", [traj_ids], "ORDER BY id", at=at) if traj_ids else []
        out["trajectories"] = trajectories
        out["changed_since_training"] = []
        if snapshot is not None and traj_ids:
            now = {r["id"]: r for r in _select(con, "trajectories", traj_cols, "id IN (SELECT unnest(?))", [traj_ids], "ORDER BY id")}
            out["changed_since_training"] = [t["id"] for t in trajectories if now.get(t["id"]) != t]
        qa_ids = sorted({q for t in trajectories for q in (t.get("qa_item_ids") or [])})
        qa_items = _select(con, "qa_items", ["qa_id", "split", "question", "gold_chunk_ids", "doc_ids", "hops", "dataset_version", "run_id"],
                           "qa_id IN (SELECT unnest(?))", [qa_ids], "ORDER BY qa_id") if qa_ids else []
        out["qa_items"] = qa_items
        chunk_ids = sorted({c for t in trajectories for c in (t.get("chunk_ids") or [])} | {c for q in qa_items for c in (q.get("gold_chunk_ids") or [])})
        chunks = _select(con, "chunks", ["chunk_id", "doc_id", "ord", "title", "run_id"], "chunk_id IN (SELECT unnest(?))", [chunk_ids], "ORDER BY chunk_id") if chunk_ids else []
        out["chunks"] = chunks
        doc_ids = sorted({c["doc_id"] for c in chunks if c.get("doc_id")} | {d for q in qa_items for d in (q.get("doc_ids") or [])})
        out["documents"] = _select(con, "documents", ["doc_id", "source", "path", "title", "category", "run_id"],
                                   "doc_id IN (SELECT unnest(?))", [doc_ids], "ORDER BY doc_id") if doc_ids else []
    failing = {str(e["trajectory_id"]) for e in out["corrected_examples"] if e.get("trajectory_id")}
    out["failing_audit_lines"] = audit_lines(list(audit_files or []), failing)
    out["runs"] = _runs(out)
    missing = [name for name in ("gate_decision", "deployment") if not out.get(name)]
    out["gaps"] = [f"no {name} recorded for {adapter_id}" for name in missing]
    if traj_ids and len(trajectories) < len(traj_ids):
        out["gaps"].append(f"{len(traj_ids) - len(trajectories)} training trajectories are not in the trajectories table")
    if out["changed_since_training"]:
        out["gaps"].append(f"{len(out['changed_since_training'])} training trajectories were rewritten or deleted after snapshot {snapshot}; "
                           "shown as they were at that snapshot")
    return out


def _runs(chain: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (asset, run id) the chain passes through, in lineage order, without duplicates."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}

    def add(asset: str, run_id: Any, rows: int = 1) -> None:
        if run_id:
            key = (asset, str(run_id))
            if key in seen:
                seen[key]["rows"] += rows
            else:
                seen[key] = {"asset": asset, "run_id": str(run_id), "rows": rows}

    for d in chain.get("deployments", []):
        add("deployed_adapter", d.get("run_id"))
    if chain.get("gate_decision"):
        add("gate_decision", chain["gate_decision"].get("run_id"))
    if chain.get("retrain_batch"):
        add("failure_buffer", chain["retrain_batch"].get("run_id"))
    add("trained_adapter", chain["adapter"].get("run_id"))
    for t in chain.get("trajectories", []):
        add(t.get("asset_key") or "trajectories", t.get("run_id"))
    for q in chain.get("qa_items", []):
        add("qa_splits", q.get("run_id"))
    for c in chain.get("chunks", []):
        add("corpus_chunks", c.get("run_id"))
    for d in chain.get("documents", []):
        add("corpus_documents", d.get("run_id"))
    return list(seen.values())
