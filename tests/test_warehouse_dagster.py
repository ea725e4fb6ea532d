"""The EventLog tables in Dagster: table assets with row counts and lineage, and blocking GX checks on what training reads."""
from __future__ import annotations

import dagster as dg
import pytest

from agenttune_assets.defs.asset_checks.warehouse import eventlog_tables_checks, warehouse_events_checks
from agenttune_assets.defs.assets.warehouse import EVENTLOG_WRITERS, EVENTS, TRAJECTORIES, eventlog_tables, warehouse_eventlog_tables
from agenttune_assets.defs.resources import WarehouseResource
from agenttune_lib.events import Event, EventKind, EventLog
from agenttune_lib.warehouse import Provenance, Warehouse
from agenttune_lib.warehouse.quality import EVENTLOG_CHECKS, validate_eventlog_tables


def _good_logs():
    full = EventLog(
        [
            Event(EventKind.OBSERVATION, {"content": "q"}, token_span=(0, 3)),
            Event(EventKind.TOOL_CALL, {"name": "search", "arguments": {"query": "x"}}, token_span=(3, 6), logprobs=[-0.1, -0.2, -0.3]),
            Event(EventKind.TEXT, {"content": "a"}, token_span=(6, 8)),
            Event(EventKind.REWARD, {"value": 1.0}, scope="episode"),
        ],
        tier="full", id="full-1", token_ids=list(range(8)),
    )
    light = EventLog([Event(EventKind.TEXT, {"content": "b"}), Event(EventKind.REWARD, {"value": 0.0}, scope="step")], id="light-1")
    return full, light


def _filled(tmp_path) -> Warehouse:
    wh = Warehouse(tmp_path / "w.duckdb")
    full, light = _good_logs()
    wh.append_logs([full], provenance=Provenance(run_id="r1", asset_key="teacher_trajectories", model_version="smollm2@1"))
    wh.append_logs([light], provenance=Provenance(run_id="r2", asset_key="trained_adapter", model_version="smollm2@1"), source="grpo")
    return wh


def test_well_formed_tables_pass_every_suite(tmp_path):
    out = validate_eventlog_tables(_filled(tmp_path))
    assert set(out) == set(EVENTLOG_CHECKS)
    assert all(o.passed for o in out.values()), {k: o.failures for k, o in out.items()}
    assert out["eventlog_kinds_in_enum"].rows == 6 and out["eventlog_token_spans_inside_sequence"].rows == 3


def _edit_events(wh: Warehouse, trajectory_id: str, edit) -> None:
    """Tamper with one trajectory's stored events (its ``events`` text, a JSON object of columns) by hand."""
    import json

    stored = json.loads(wh.execute("SELECT events FROM trajectories WHERE id = ?", [trajectory_id])[0][0])
    edit(stored)
    wh.execute("UPDATE trajectories SET events = ? WHERE id = ?", [json.dumps(stored), trajectory_id])


def _drop_event(stored, seq):
    for column in stored.values():
        if isinstance(column, list):
            del column[seq]


_GHOST = "INSERT INTO trajectories (id, tier, events) VALUES ('ghost', 'light', '{\"kind\":[\"text\"],\"payload\":[{}]}')"


@pytest.mark.parametrize(
    "tamper, failing",
    [
        (("light-1", lambda d: d["kind"].__setitem__(0, "shout")), "eventlog_kinds_in_enum"),
        (("full-1", lambda d: d["scope"].__setitem__(3, "week")), "eventlog_reward_scope_valid"),
        (("light-1", lambda d: d.__setitem__("scope", ["turn", "step"])), "eventlog_reward_scope_valid"),
        (("full-1", lambda d: d["span"].__setitem__(2, [6, 9])), "eventlog_token_spans_inside_sequence"),
        (("full-1", lambda d: d["span"].__setitem__(0, [5, 3])), "eventlog_token_spans_inside_sequence"),
        (_GHOST, "eventlog_no_orphan_events"),  # a row whose n_events does not match its events
        (("light-1", lambda d: _drop_event(d, 1)), "eventlog_no_orphan_events"),
        ("UPDATE trajectories SET model_version = NULL WHERE id = 'light-1'", "eventlog_provenance_present"),
        ("UPDATE trajectories SET run_id = NULL WHERE id = 'full-1'", "eventlog_provenance_present"),
    ],
)
def test_each_violation_fails_its_own_suite(tmp_path, tamper, failing):
    wh = _filled(tmp_path)
    if isinstance(tamper, str):
        wh.execute(tamper)
    else:
        _edit_events(wh, *tamper)
    out = validate_eventlog_tables(wh)
    assert [k for k, o in out.items() if not o.passed] == [failing], {k: o.failures for k, o in out.items()}
    assert out[failing].failures


def test_a_failing_check_blocks_training_and_table_assets_show_counts_and_lineage(tmp_path):
    wh = _filled(tmp_path)
    resources = {"warehouse": WarehouseResource(path=wh.path)}

    @dg.asset(deps=["eventlog_tables"])
    def reads_eventlogs() -> None:
        """Stands for trained_adapter: anything downstream of eventlog_tables."""

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        ok = dg.materialize([eventlog_tables, eventlog_tables_checks, reads_eventlogs], instance=instance, resources=resources)
        assert ok.success
        assert instance.get_latest_materialization_event(dg.AssetKey("reads_eventlogs")) is not None
        wh.execute(_GHOST)
        bad = dg.materialize([eventlog_tables, eventlog_tables_checks, reads_eventlogs], instance=instance, resources=resources, raise_on_error=False)
        assert not bad.success
        evals = {e.check_name: e.passed for e in bad.get_asset_check_evaluations()}
        assert evals["eventlog_no_orphan_events"] is False and evals["eventlog_kinds_in_enum"] is True
        assert instance.get_latest_materialization_event(dg.AssetKey("reads_eventlogs")).run_id == ok.run_id  # downstream did not run

        result = dg.materialize([warehouse_eventlog_tables, warehouse_events_checks], instance=instance, resources=resources, raise_on_error=False)
        traj = instance.get_latest_materialization_event(TRAJECTORIES).asset_materialization.metadata
        events = instance.get_latest_materialization_event(EVENTS).asset_materialization.metadata
    assert traj["dagster/row_count"].value == 3 and events["dagster/row_count"].value == 7  # the ghost row and its one event included
    assert {c.name for c in traj["dagster/column_schema"].schema.columns} >= {"id", "run_id", "asset_key", "teacher_kind"}
    assert {r.data["asset"]: r.data["rows"] for r in events["rows_by_writer"].records} == {"teacher_trajectories": 4, "trained_adapter": 2, "-": 1}
    # Non-blocking on the final tables: the orphan is reported there too.
    evals = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evals["eventlog_no_orphan_events"] is False


def test_table_assets_are_downstream_of_every_eventlog_writer():
    from agenttune_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    keys = graph.get_all_asset_keys()
    for table in (TRAJECTORIES, EVENTS):
        parents = {k.to_user_string() for k in graph.get(table).parent_keys}
        assert parents == set(EVENTLOG_WRITERS)
        assert all(dg.AssetKey(w) in keys for w in EVENTLOG_WRITERS)
    checks = {k.name for k in graph.asset_check_keys if k.asset_key == dg.AssetKey("eventlog_tables")}
    assert checks == set(EVENTLOG_CHECKS)
    main = defs.resolve_job_def("main_job").asset_layer.asset_graph.get_all_asset_keys()
    assert TRAJECTORIES in main and EVENTS in main


def test_every_asset_that_touches_the_warehouse_takes_the_warehouse_pool():
    """One write path for the DuckDB file: every step that gets the warehouse resource queues in the `warehouse` pool."""
    from agenttune_assets.definitions import defs

    missing = []
    for ad in defs.resolve_asset_graph().assets_defs:
        if ad.keys and ad.is_executable and "warehouse" in ad.required_resource_keys and ad.node_def.pool != "warehouse":
            missing.append(sorted(k.to_user_string() for k in ad.keys))
    assert missing == []
