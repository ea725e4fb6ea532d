"""[collect] eventlog_tables and [warehouse] the EventLog tables themselves, as assets with row counts and schemas.

``eventlog_tables`` is the EventLog warehouse as training reads it (upstream of the trainers; its blocking
Great Expectations checks stop training on a malformed table). ``warehouse/trajectories`` and
``warehouse/events`` are the same tables after every writer of the main job (teacher collection, DECIDE,
GRPO rollouts, multi-agent rollouts), so the graph shows which assets write them and the UI shows their
row counts as they stand at the end of a run. The warehouse API is kept instead of an IO manager
(``dagster-duckdb``): the writers append many small Arrow batches with provenance, not one DataFrame per asset.
"""

import dagster as dg

from agenttune_assets.defs.resources import WarehouseResource
from agenttune_lib.warehouse.queries import column_types, rows_by_writer
from agenttune_lib.warehouse.report import warehouse_summary

#: Assets that append EventLogs to ``trajectories``/``events`` (the table assets' lineage).
EVENTLOG_WRITERS = ("teacher_trajectories", "decide_runs", "trained_adapter", "multi_agent_adapter")
TRAJECTORIES = dg.AssetKey(["warehouse", "trajectories"])
EVENTS = dg.AssetKey(["warehouse", "events"])


def _table_meta(summary, table: str, columns) -> dict:
    return {
        "dagster/row_count": dg.MetadataValue.int(summary.table_rows.get(table, 0)),
        "dagster/table_name": dg.MetadataValue.text(f"{summary.path}::{table}"),
        "dagster/column_schema": dg.TableSchema(columns=[dg.TableColumn(name, typ) for name, typ in columns]),
    }


@dg.asset(
    group_name="collect",
    deps=["teacher_trajectories"],
    pool="warehouse",
    kinds={"duckdb"},
)
def eventlog_tables(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Every EventLog collected so far, with per-table row counts, per-source counts and the declared schema.

    On a DuckLake warehouse it also records ``warehouse_snapshot``: the snapshot training read from, so
    ``Warehouse.read_logs(snapshot=...)`` shows those rows exactly as they were.
    """
    wh = warehouse.get()
    summary = warehouse_summary(wh)
    snapshot = wh.snapshot_id()
    counts = [dg.TableRecord({"table": t, "rows": n}) for t, n in summary.table_rows.items()]
    sources = [dg.TableRecord({"source": s or "-", "tier": tier, "trajectories": n}) for (s, tier), n in summary.by_source.items()]
    schema = dg.TableSchema(columns=[dg.TableColumn(name, typ) for name, typ in summary.events_columns])
    return dg.MaterializeResult(
        metadata={
            "trajectories": dg.MetadataValue.int(summary.table_rows.get("trajectories", 0)),
            "events": dg.MetadataValue.int(summary.table_rows.get("events", 0)),
            "dagster/row_count": dg.MetadataValue.int(summary.table_rows.get("events", 0)),
            "table_rows": dg.MetadataValue.table(
                counts, schema=dg.TableSchema(columns=[dg.TableColumn("table", "string"), dg.TableColumn("rows", "int")])
            ),
            "by_source": dg.MetadataValue.table(
                sources,
                schema=dg.TableSchema(
                    columns=[dg.TableColumn("source", "string"), dg.TableColumn("tier", "string"), dg.TableColumn("trajectories", "int")]
                ),
            ),
            "dagster/column_schema": schema,
            "events_by_kind": dg.MetadataValue.md("\n".join(f"- {k}: {n}" for k, n in summary.events_by_kind.items()) or "none"),
            "path": dg.MetadataValue.path(summary.path),
            **({"warehouse_snapshot": dg.MetadataValue.int(snapshot)} if snapshot is not None else {}),
        },
        data_version=dg.DataVersion(f"{summary.version}@{snapshot}" if snapshot is not None else summary.version),
    )


@dg.multi_asset(
    specs=[
        dg.AssetSpec(TRAJECTORIES, deps=list(EVENTLOG_WRITERS), group_name="warehouse", kinds={"duckdb", "table"},
                     description="The trajectories table (one row per EventLog, with provenance) after every writer."),
        dg.AssetSpec(EVENTS, deps=list(EVENTLOG_WRITERS), group_name="warehouse", kinds={"duckdb", "table"},
                     description="The events table (one row per EventLog event) after every writer."),
    ],
    can_subset=True,
    pool="warehouse",
)
def warehouse_eventlog_tables(context: dg.AssetExecutionContext, warehouse: WarehouseResource):
    """Row counts (total and per writing asset) and schemas of ``trajectories`` and ``events`` as they stand now."""
    wh = warehouse.get()
    summary = warehouse_summary(wh)
    traj_cols, per_writer = column_types(wh, "trajectories"), rows_by_writer(wh)
    writers_schema = dg.TableSchema(columns=[dg.TableColumn("asset", "string"), dg.TableColumn("rows", "int")])
    for key, table, columns, idx in ((TRAJECTORIES, "trajectories", traj_cols, 1), (EVENTS, "events", summary.events_columns, 2)):
        if key not in context.selected_asset_keys:
            continue
        yield dg.MaterializeResult(
            asset_key=key,
            metadata={
                **_table_meta(summary, table, columns),
                "rows_by_writer": dg.MetadataValue.table(
                    [dg.TableRecord({"asset": r[0], "rows": int(r[idx])}) for r in per_writer], schema=writers_schema
                ),
            },
            data_version=dg.DataVersion(summary.version),
        )
