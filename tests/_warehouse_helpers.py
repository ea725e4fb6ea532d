"""Shared test helpers for the warehouse: the table layout written before events moved into their trajectory's row."""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from agenttune_lib.warehouse import EVENT_SCHEMA, TRAJECTORY_SCHEMA
from agenttune_lib.warehouse.schema import ddl


def write_old_tables(con: Any, traj: pa.Table, events: pa.Table) -> None:
    """Create ``trajectories`` without an events column and a separate ``events`` table on ``con``, filled from
    ``logs_to_arrow``'s two tables: a warehouse as written before the row-per-log storage."""
    con.execute(ddl("trajectories", TRAJECTORY_SCHEMA))
    con.execute(ddl("events", EVENT_SCHEMA))
    con.register("_old_t", traj)
    con.register("_old_e", events)
    con.execute("INSERT INTO trajectories SELECT * FROM _old_t")
    con.execute("INSERT INTO events SELECT * FROM _old_e")
    con.unregister("_old_t")
    con.unregister("_old_e")
