"""The EventLog contract checked in SQL on an Arrow batch before ``append_arrow`` writes it."""
from __future__ import annotations

import duckdb

from agenttune_lib.events import EventKind
from agenttune_lib.warehouse.types import WarehouseError

_KIND_VALUE = {k: k.value for k in EventKind}

_BATCH_RULES = (
    ("events naming trajectories not in this batch",
     "SELECT DISTINCT trajectory_id FROM _new_events WHERE trajectory_id NOT IN (SELECT id FROM _new_traj)"),
    ("unknown event kinds", "SELECT DISTINCT kind FROM _new_events WHERE kind NOT IN ({kinds})"),
    ("REWARD events without a scope in (step, turn, episode), or a scope on another kind",
     "SELECT trajectory_id, seq, kind, scope FROM _new_events WHERE (kind = 'reward') <> coalesce(scope IN ('step', 'turn', 'episode'), false)"),
    ("event seq not 0..n_events-1 per trajectory",
     "SELECT t.id, t.n_events, count(e.seq), min(e.seq), max(e.seq), count(DISTINCT e.seq) FROM _new_traj t "
     "LEFT JOIN _new_events e ON e.trajectory_id = t.id GROUP BY ALL "
     "HAVING count(e.seq) <> coalesce(t.n_events, count(e.seq)) OR count(DISTINCT e.seq) <> count(e.seq) "
     "OR (count(e.seq) > 0 AND (min(e.seq) <> 0 OR max(e.seq) <> count(e.seq) - 1))"),
    ("token spans outside 0 <= start <= end <= len(token_ids)",
     "SELECT e.trajectory_id, e.seq, e.span_start, e.span_end, len(t.token_ids) FROM _new_events e JOIN _new_traj t ON t.id = e.trajectory_id "
     "WHERE (e.span_start IS NULL) <> (e.span_end IS NULL) OR e.span_start < 0 OR e.span_end < e.span_start "
     "OR (t.token_ids IS NOT NULL AND e.span_end > len(t.token_ids))"),
    ("overlapping or out-of-order token spans",
     "SELECT trajectory_id, seq, span_start, prev_end FROM (SELECT trajectory_id, seq, span_start, "
     "max(span_end) OVER (PARTITION BY trajectory_id ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end "
     "FROM _new_events WHERE span_start IS NOT NULL) WHERE span_start < prev_end"),
)


def _check_batch(con: duckdb.DuckDBPyConnection) -> None:
    """The EventLog contract on an Arrow batch (registered as _new_traj/_new_events): a WarehouseError naming the rows."""
    kinds = ", ".join(f"'{v}'" for v in _KIND_VALUE.values())
    for problem, sql in _BATCH_RULES:
        bad = con.execute(sql.format(kinds=kinds) + " LIMIT 5").fetchall()
        if bad:
            raise WarehouseError(f"append_arrow rejected the batch: {problem}: {bad}")
