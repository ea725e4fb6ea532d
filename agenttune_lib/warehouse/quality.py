"""Great Expectations suites over the EventLog tables as stored (not as the writer meant them).

The contract is enforced when a log is built; these suites re-check what actually sits in the
warehouse, since rows also arrive through ``append_arrow`` and through other writers: event kinds in
the enum, REWARD scopes valid, token spans inside their trajectory's sequence, no orphan events and
no trajectory whose event count disagrees, and provenance on teacher and training rows.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from agenttune_lib.events import REWARD_SCOPES, EventKind
from agenttune_lib.warehouse.store import Warehouse

#: Assets whose rows training reads or writes: they must say which run, asset and model produced them.
PROVENANCE_ASSETS: tuple[str, ...] = ("teacher_trajectories", "trained_adapter", "multi_agent_adapter")

EVENTLOG_CHECKS: dict[str, str] = {
    "eventlog_kinds_in_enum": "Every stored event kind is one of the eight EventKinds.",
    "eventlog_reward_scope_valid": f"Every REWARD event has a scope in {REWARD_SCOPES}; no other event has one.",
    "eventlog_token_spans_inside_sequence": "Every token span satisfies 0 <= start <= end <= len(token_ids) of its trajectory.",
    "eventlog_no_orphan_events": "Every event belongs to a stored trajectory, and each trajectory's n_events matches its events.",
    "eventlog_provenance_present": f"Rows written by {', '.join(PROVENANCE_ASSETS)} carry run_id, asset_key and model_version; a teacher_kind has a teacher_version.",
}


@dataclasses.dataclass(frozen=True)
class CheckOutcome:
    """One suite's verdict, with the number of rows it looked at and the failing expectations."""

    name: str
    passed: bool
    rows: int
    failures: list[str]


def _frames(warehouse: Warehouse) -> dict[str, Any]:
    with warehouse.connect() as con:
        cols = {r[0] for r in con.execute("DESCRIBE trajectories").fetchall()}
        teacher = "teacher_kind, teacher_version" if "teacher_kind" in cols else "NULL AS teacher_kind, NULL AS teacher_version"
        q = lambda sql: con.sql(sql).df()  # noqa: E731
        return {
            "kinds": q("SELECT kind FROM events"),
            "scopes": q("SELECT kind = 'reward' AS is_reward, coalesce(scope, '<none>') AS scope FROM events"),
            "spans": q(
                "SELECT e.span_start, e.span_end, coalesce(len(t.token_ids), 0) AS seq_len FROM events e "
                "JOIN trajectories t ON t.id = e.trajectory_id WHERE e.span_start IS NOT NULL OR e.span_end IS NOT NULL"
            ),
            "orphans": q(
                "SELECT e.trajectory_id, t.id AS parent FROM events e LEFT JOIN trajectories t ON t.id = e.trajectory_id "
                "WHERE t.id IS NULL"
            ),
            "counts": q(
                "SELECT t.id, t.n_events, count(e.seq) AS stored FROM trajectories t LEFT JOIN events e ON e.trajectory_id = t.id GROUP BY ALL"
            ),
            "provenance": q(
                f"SELECT id, asset_key, run_id, model_version, {teacher} FROM trajectories "
                f"WHERE asset_key IN ({', '.join(repr(a) for a in PROVENANCE_ASSETS)}) OR teacher_kind IS NOT NULL"
                if "teacher_kind" in cols else
                f"SELECT id, asset_key, run_id, model_version, {teacher} FROM trajectories "
                f"WHERE asset_key IN ({', '.join(repr(a) for a in PROVENANCE_ASSETS)})"
            ),
        }


def validate_eventlog_tables(warehouse: Warehouse) -> dict[str, CheckOutcome]:
    """Run the five GX suites over the warehouse's trajectories and events; one outcome per check name."""
    import great_expectations as gx
    import great_expectations.expectations as gxe
    import pandas as pd

    frames = _frames(warehouse)
    frames["counts"]["mismatch"] = (frames["counts"]["n_events"].fillna(-1) != frames["counts"]["stored"]).astype(int)
    prov = frames["provenance"]
    prov["teacher_ok"] = (prov["teacher_kind"].isna() | prov["teacher_version"].notna()).astype(int)
    reward_scopes = frames["scopes"][frames["scopes"]["is_reward"]].reset_index(drop=True)
    other_scopes = frames["scopes"][~frames["scopes"]["is_reward"]].reset_index(drop=True)
    frames.update(reward_scopes=reward_scopes, other_scopes=other_scopes)

    suites: dict[str, list[tuple[str, Any]]] = {
        "eventlog_kinds_in_enum": [("kinds", gxe.ExpectColumnValuesToBeInSet(column="kind", value_set=[k.value for k in EventKind]))],
        "eventlog_reward_scope_valid": [
            ("reward_scopes", gxe.ExpectColumnValuesToBeInSet(column="scope", value_set=list(REWARD_SCOPES))),
            ("other_scopes", gxe.ExpectColumnValuesToBeInSet(column="scope", value_set=["<none>"])),
        ],
        "eventlog_token_spans_inside_sequence": [
            ("spans", gxe.ExpectColumnValuesToNotBeNull(column="span_start")),
            ("spans", gxe.ExpectColumnValuesToNotBeNull(column="span_end")),
            ("spans", gxe.ExpectColumnValuesToBeBetween(column="span_start", min_value=0)),
            ("spans", gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="span_end", column_B="span_start", or_equal=True)),
            ("spans", gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="seq_len", column_B="span_end", or_equal=True)),
        ],
        "eventlog_no_orphan_events": [
            ("orphans", gxe.ExpectTableRowCountToEqual(value=0)),
            ("counts", gxe.ExpectColumnValuesToBeInSet(column="mismatch", value_set=[0])),
        ],
        "eventlog_provenance_present": [
            ("provenance", gxe.ExpectColumnValuesToNotBeNull(column="run_id")),
            ("provenance", gxe.ExpectColumnValuesToNotBeNull(column="asset_key")),
            ("provenance", gxe.ExpectColumnValuesToNotBeNull(column="model_version")),
            ("provenance", gxe.ExpectColumnValuesToBeInSet(column="teacher_ok", value_set=[1])),
        ],
    }
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("eventlog")
    batches: dict[str, Any] = {}

    def batch(name: str):
        if name not in batches:
            df = frames[name]
            if not isinstance(df, pd.DataFrame):
                df = pd.DataFrame(df)
            batches[name] = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": df})
        return batches[name]

    out: dict[str, CheckOutcome] = {}
    for check, expectations in suites.items():
        failures, rows = [], 0
        for frame, expectation in expectations:
            rows = max(rows, len(frames[frame]))
            if len(frames[frame]) == 0 and not isinstance(expectation, gxe.ExpectTableRowCountToEqual):
                continue  # nothing to check (GX reports an empty batch as unsuccessful for some expectations)
            result = batch(frame).validate(expectation)
            if not result.success:
                res = result.result or {}
                sample = res.get("partial_unexpected_list") or res.get("observed_value")
                failures.append(f"{expectation.expectation_type} on {frame}: {res.get('unexpected_count', '')} unexpected {sample!r}"[:400])
        out[check] = CheckOutcome(check, not failures, rows, failures)
    return out
