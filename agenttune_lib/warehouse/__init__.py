"""DuckDB + Arrow tables for EventLogs, provenance and lineage."""
from agenttune_lib.warehouse.schema import EVENT_SCHEMA, TRAJECTORY_SCHEMA
from agenttune_lib.warehouse.store import Provenance, Warehouse, WarehouseError, logs_to_arrow

__all__ = ["Warehouse", "Provenance", "WarehouseError", "logs_to_arrow", "EVENT_SCHEMA", "TRAJECTORY_SCHEMA"]
