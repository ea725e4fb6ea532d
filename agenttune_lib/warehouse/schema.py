"""Arrow schemas and DuckDB DDL of the EventLog warehouse, declared once."""
from __future__ import annotations

import pyarrow as pa

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("tier", pa.string(), nullable=False),
        pa.field("source", pa.string()),
        pa.field("task", pa.string()),
        pa.field("created_at", pa.timestamp("us", tz="UTC")),
        pa.field("n_events", pa.int32()),
        pa.field("reward_total", pa.float64()),
        pa.field("reward_episode", pa.float64()),
        pa.field("run_id", pa.string()),
        pa.field("asset_key", pa.string()),
        pa.field("partition", pa.string()),
        pa.field("model_version", pa.string()),
        pa.field("adapter_version", pa.string()),
        pa.field("qa_item_ids", pa.list_(pa.string())),
        pa.field("chunk_ids", pa.list_(pa.string())),
        pa.field("token_ids", pa.list_(pa.int32())),
        pa.field("metadata", pa.string()),
        pa.field("provenance_extra", pa.string()),
        # which teacher produced a training row (issue 12); last, so existing files migrate by ADD COLUMN
        pa.field("teacher_kind", pa.string()),
        pa.field("teacher_version", pa.string()),
    ]
)

EVENT_SCHEMA = pa.schema(
    [
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("seq", pa.int32(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("payload", pa.string()),
        pa.field("span_start", pa.int32()),
        pa.field("span_end", pa.int32()),
        pa.field("logprobs", pa.list_(pa.float64())),
        pa.field("scope", pa.string()),
        pa.field("author", pa.string()),
    ]
)

#: The trajectories table as stored: TRAJECTORY_SCHEMA (what ``logs_to_arrow`` and ``append_arrow`` take) plus
#: ``events``, last: each log's events as one JSON object of columns in seq order, ``{"kind": [...], "payload":
#: [...]}`` with ``span`` ([start, end] or null), ``logprobs``, ``scope`` and ``author`` where any event has one.
#: A read by id then fetches one row per log (DuckDB fetches a VARCHAR row by row, where a nested LIST column
#: is decoded a whole segment at a time); ``events`` the view gives the rows one per event.
STORED_TRAJECTORY_SCHEMA = TRAJECTORY_SCHEMA.append(pa.field("events", pa.string()))

_DUCK_TYPES = {
    pa.string(): "VARCHAR",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
    pa.list_(pa.string()): "VARCHAR[]",
    pa.list_(pa.int32()): "INTEGER[]",
    pa.list_(pa.float64()): "DOUBLE[]",
}


def ddl(table: str, schema: pa.Schema, primary_key: str | None = None) -> str:
    """CREATE TABLE IF NOT EXISTS from an Arrow schema."""
    cols = []
    for field in schema:
        col = f'"{field.name}" {_DUCK_TYPES[field.type]}'
        if not field.nullable:
            col += " NOT NULL"
        cols.append(col)
    if primary_key:
        cols.append(f"PRIMARY KEY ({primary_key})")
    return f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(cols)})"


CORE_DDL = [
    ddl("trajectories", STORED_TRAJECTORY_SCHEMA),
    # warehouses written before the teacher columns existed gain them (appended last, as in the schema)
    "ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS teacher_kind VARCHAR",
    "ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS teacher_version VARCHAR",
    "ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS events VARCHAR",
]

#: A DuckDB file's index on trajectory ids: a read by id looks its row up instead of scanning every id (and
#: decoding the ``token_ids`` list segment), so ``get_log`` stays under a millisecond as the table grows.
#: DuckLake tables have no indexes; a lake reads the ids from its Parquet files' statistics instead.
TRAJECTORY_ID_INDEX = "CREATE INDEX IF NOT EXISTS trajectories_id ON trajectories (id)"

#: One row per event, the columns of EVENT_SCHEMA: what SQL, the GX suites and the Dagster asset read. The
#: lists of a log unnest side by side; a list the log does not store (no event has a span) reads as NULLs.
EVENTS_VIEW = (
    "CREATE VIEW IF NOT EXISTS events AS SELECT trajectory_id, CAST(generate_subscripts(k, 1) - 1 AS INTEGER) AS seq, "
    "unnest(k) AS kind, CAST(unnest(p) AS VARCHAR) AS payload, unnest(s)[1] AS span_start, unnest(s)[2] AS span_end, "
    "unnest(l) AS logprobs, unnest(sc) AS scope, unnest(au) AS author FROM ("
    "SELECT id AS trajectory_id, CAST(events -> '$.kind' AS VARCHAR[]) AS k, CAST(events -> '$.payload' AS JSON[]) AS p, "
    "CAST(events -> '$.span' AS INTEGER[][]) AS s, CAST(events -> '$.logprobs' AS DOUBLE[][]) AS l, "
    "CAST(events -> '$.scope' AS VARCHAR[]) AS sc, CAST(events -> '$.author' AS VARCHAR[]) AS au FROM trajectories)"
)
