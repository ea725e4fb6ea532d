"""Great Expectations checks on the EventLog tables: blocking on ``eventlog_tables`` (training reads it),
and the same suites on ``warehouse/events`` after every writer (reported, not blocking: nothing reads it downstream)."""

import dagster as dg

from agenttune_assets.defs.assets.warehouse import EVENTS
from agenttune_assets.defs.resources import WarehouseResource
from agenttune_lib.warehouse.quality import EVENTLOG_CHECKS, validate_eventlog_tables


def _results(warehouse: WarehouseResource, asset_key: dg.AssetKey):
    for name, outcome in validate_eventlog_tables(warehouse.get()).items():
        yield dg.AssetCheckResult(
            asset_key=asset_key, check_name=name, passed=outcome.passed,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"rows_checked": outcome.rows, "failures": dg.MetadataValue.json(outcome.failures)},
        )


@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(name, asset="eventlog_tables", blocking=True, description=desc) for name, desc in EVENTLOG_CHECKS.items()],
    can_subset=False,
)
def eventlog_tables_checks(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource):
    """Kinds, REWARD scopes, token spans, orphan events and provenance of the tables training is about to read."""
    yield from _results(warehouse, dg.AssetKey("eventlog_tables"))


@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(name, asset=EVENTS, blocking=False, description=desc) for name, desc in EVENTLOG_CHECKS.items()],
    can_subset=False,
)
def warehouse_events_checks(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource):
    """The EventLog suites again once every writer of the run has appended."""
    yield from _results(warehouse, EVENTS)
