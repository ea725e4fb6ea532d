"""[collect] eventlog_tables: the DuckDB EventLog warehouse as an asset, with its row counts and schema."""

import dagster as dg

from agenttune_assets.defs.resources import WarehouseResource
from agenttune_lib.warehouse.report import warehouse_summary


@dg.asset(
    group_name="collect",
    deps=["teacher_trajectories"],
    kinds={"duckdb"},
)
def eventlog_tables(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Every EventLog collected so far, with per-table row counts, per-source counts and the declared schema."""
    summary = warehouse_summary(warehouse.get())
    counts = [dg.TableRecord({"table": t, "rows": n}) for t, n in summary.table_rows.items()]
    sources = [dg.TableRecord({"source": s or "-", "tier": tier, "trajectories": n}) for (s, tier), n in summary.by_source.items()]
    schema = dg.TableSchema(columns=[dg.TableColumn(name, typ) for name, typ in summary.events_columns])
    return dg.MaterializeResult(
        metadata={
            "trajectories": dg.MetadataValue.int(summary.table_rows.get("trajectories", 0)),
            "events": dg.MetadataValue.int(summary.table_rows.get("events", 0)),
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
        },
        data_version=dg.DataVersion(summary.version),
    )
