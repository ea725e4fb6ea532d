"""The six retraining sensors and the staleness schedule, driven through build_sensor_context / build_schedule_context."""
from __future__ import annotations

import json
import time
import uuid
import warnings

import dagster as dg
import pytest

from _closed_loop_helpers import make_example
from agenttune_assets.defs.resources import ClosedLoopResource, WarehouseResource
from agenttune_assets.defs.schedules import retrain_staleness_schedule
from agenttune_assets.defs.sensors import RETRAIN_SENSORS as SENSORS
from agenttune_lib.closed_loop import TrainingBuffer
from agenttune_lib.warehouse import Warehouse

warnings.simplefilter("ignore")
BY_ID = {s.name.split("_")[1].upper(): s for s in SENSORS}


@pytest.fixture
def env(tmp_path):
    wh_path = str(tmp_path / "wh.duckdb")
    resources = {"warehouse": WarehouseResource(path=wh_path), "closed_loop": ClosedLoopResource(staleness_hours=0.0002, deploy_root=str(tmp_path / "dep"))}
    with dg.instance_for_test() as instance:
        yield instance, resources, TrainingBuffer(Warehouse(wh_path))


def tick(sensor, instance, resources, cursor=None):
    # Closed after the tick: an unclosed context with resources leaks Dagster's defs-state context var.
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources) as ctx:
        return sensor(ctx), ctx


def _setup(trigger_id, buf):
    if trigger_id == "T1":
        buf.add([make_example(i, c) for i, c in zip(range(50), ["wrong_tool", "loop_collapse"] * 25)])
    elif trigger_id == "T2":
        buf.add([make_example(i, "loop_collapse") for i in range(8)] + [make_example(100 + i, "wrong_tool") for i in range(2)])
    elif trigger_id == "T3":
        buf.add([make_example(i, c) for i, c in zip(range(30), ["wrong_tool", "loop_collapse", "wrong_routing"] * 10)])
    elif trigger_id == "T4":
        buf.add([make_example(1, "wrong_tool")], rewards=[0.9, 0.8] * 25)
        buf.add(rewards=[0.3] * 50)
    elif trigger_id == "T5":
        buf.add([make_example(i, "hallucinated_output") for i in range(3)] + [make_example(10 + i, c) for i, c in zip(range(4), ["wrong_tool", "loop_collapse"] * 2)])
    elif trigger_id == "T6":
        buf.add([make_example(i, c) for i, c in zip(range(10), ["wrong_tool", "loop_collapse"] * 5)])
        time.sleep(1.0)


def _result_requests(result):
    return list(result.run_requests or []) if isinstance(result, dg.SensorResult) else []


def test_six_sensors_default_to_running_and_target_the_retrain_job():
    assert sorted(BY_ID) == ["T1", "T2", "T3", "T4", "T5", "T6"]
    for s in SENSORS:
        assert s.default_status == dg.DefaultSensorStatus.RUNNING and s.job_name == "retrain_job"
    assert retrain_staleness_schedule.default_status == dg.DefaultScheduleStatus.RUNNING


@pytest.mark.parametrize("trigger_id", ["T1", "T2", "T3", "T4", "T5", "T6"])
def test_sensor_first_tick_nothing_new_cursor_advance_and_no_double_fire(env, trigger_id):
    instance, resources, buf = env
    sensor = BY_ID[trigger_id]
    # first tick on an empty buffer: a skip with a reason and a cursor
    first, _ = tick(sensor, instance, resources)
    assert not _result_requests(first) and first.skip_reason and json.loads(first.cursor)["version"] == 0
    # nothing new since the cursor
    if trigger_id != "T6":
        again, _ = tick(sensor, instance, resources, first.cursor)
        assert "nothing new" in again.skip_reason.skip_message
    # the condition comes true: one RunRequest keyed by trigger and buffer version, tags with its figures
    _setup(trigger_id, buf)
    version = buf.stats().version
    fired, _ = tick(sensor, instance, resources, first.cursor)
    (req,) = _result_requests(fired)
    # run_key, tags and cursor name one buffer version: the one the drain produced
    assert req.run_key == f"retrain:{trigger_id}:default:v{req.tags['agenttune/buffer_version']}"
    assert int(req.tags["agenttune/buffer_version"]) == json.loads(fired.cursor)["version"] == version + 1
    assert req.tags["agenttune/trigger"] == trigger_id and req.tags["agenttune/retrain_batch"]
    assert any(k.startswith("agenttune/fig.") for k in req.tags)
    assert json.loads(fired.cursor)["version"] > version
    assert buf.stats().size == 0 and buf.stats().retrain_batch == req.tags["agenttune/retrain_batch"]
    # while that retrain runs, the condition holding again does not fire a second run
    instance.add_run(dg.DagsterRun(job_name="retrain_job", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED,
                                   tags={"agenttune/retrain_batch": req.tags["agenttune/retrain_batch"]}))
    buf2_examples = [make_example(1000 + i, c) for i, c in zip(range(60), ["wrong_tool", "loop_collapse"] * 30)]
    buf.add(buf2_examples)
    blocked, _ = tick(sensor, instance, resources, fired.cursor)
    assert not _result_requests(blocked)
    # a cursor reset cannot relaunch either
    reset, _ = tick(sensor, instance, resources, None)
    assert not _result_requests(reset)


def test_orphaned_batch_of_a_failed_run_is_requeued(env):
    instance, resources, buf = env
    _setup("T1", buf)
    fired, _ = tick(BY_ID["T1"], instance, resources)
    (req,) = _result_requests(fired)
    batch = req.tags["agenttune/retrain_batch"]
    instance.add_run(dg.DagsterRun(job_name="retrain_job", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.FAILURE,
                                   tags={"agenttune/retrain_batch": batch}))
    after, _ = tick(BY_ID["T1"], instance, resources, fired.cursor)
    (req2,) = _result_requests(after)  # the batch came back and T1 holds again
    assert req2.tags["agenttune/retrain_batch"] != batch and req2.run_key != req.run_key


def test_staleness_schedule(env):
    instance, resources, buf = env
    with dg.build_schedule_context(instance=instance, resources=resources) as ctx:
        assert isinstance(retrain_staleness_schedule.evaluate_tick(ctx).skip_message, str)
    _setup("T6", buf)
    with dg.build_schedule_context(instance=instance, resources=resources) as ctx:
        result = retrain_staleness_schedule.evaluate_tick(ctx)
    (req,) = result.run_requests
    assert req.tags["agenttune/trigger"] == "T6" and req.tags["agenttune/scheduled"] == "true"
