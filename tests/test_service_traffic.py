"""Served traffic is what the loop learns from: each request a full-tier EventLog with PII redacted before storage,
feedback on it judged by the failure detector, and the failure_buffer sensor moving those failures into the buffer, where
the T5 sensor fires on them, with no materialization by hand."""
from __future__ import annotations

import json
import warnings

import dagster as dg
import httpx
import openai
import pytest

from _service_helpers import free_port, running_service

warnings.simplefilter("ignore")

EMAIL = "jane.doe@example.com"


def _config(tmp_path, **kw):
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.service import ServiceConfig

    base = save_tiny_model(tmp_path / "tiny")
    return ServiceConfig(base_path=base, deploy_root=tmp_path / "deployed", warehouse_path=str(tmp_path / "wh.duckdb"), port=free_port(),
                         max_completion_tokens=64, default_max_tokens=8, **kw)


def test_served_request_is_stored_redacted_and_feedback_is_judged(tmp_path):
    from agenttune_lib.events import EventKind
    from agenttune_lib.warehouse import Warehouse

    config = _config(tmp_path)
    assert config.redact  # the privacy layer's Presidio detector, as in production
    with running_service(config) as (url, app):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        resp = client.chat.completions.create(model="deployed", messages=[{"role": "user", "content": f"Mail me at {EMAIL} about my order"}])
        app.state.service.recorder.flush()
        wh = Warehouse(config.warehouse_path)
        (log,) = wh.read_logs(ids=[resp.id])
        stored = json.dumps(log.to_dict())
        assert EMAIL not in stored and "[PII:EMAIL_ADDRESS]" in log.metadata["messages"][-1]["content"]
        assert log.tier == "full" and log.metadata["redacted"] is True and log.metadata["served_adapter_id"] == "base:tiny"
        tokenizer = app.state.service.registry.deployed().load()[1]
        assert EMAIL not in tokenizer.decode(log.token_ids)  # the ids were re-tokenized from the redacted text

        down = httpx.post(url + "/v1/feedback", json={"request_id": resp.id, "thumbs": "down", "correction": f"Sure, I will write to {EMAIL}."})
        assert down.status_code == 200, down.text
        assert down.json() == {"object": "feedback", "request_id": resp.id, "seq": 1, "reward": 0.0, "served_adapter_id": "base:tiny",
                                    "failure": True, "signals": ["judge_below_threshold"]}
        up = httpx.post(url + "/v1/feedback", json={"request_id": resp.id, "reward": 0.9}).json()
        assert up["seq"] == 2 and up["failure"] is False and up["signals"] == []
        (log,) = wh.read_logs(ids=[resp.id])
        assert [e.payload["value"] for e in log.events if e.kind is EventKind.REWARD] == [0.9]
        rows = wh.execute("SELECT seq, reward, thumbs, correction FROM served_feedback ORDER BY seq")
        assert rows[0][:3] == (1, 0.0, "down") and EMAIL not in rows[0][3] and "[PII:EMAIL_ADDRESS]" in rows[0][3]
        assert rows[1][:3] == (2, 0.9, None)


def test_sensor_moves_served_failures_into_the_buffer_and_t5_fires(tmp_path):
    from agenttune_assets.defs.assets.deploy import failure_buffer
    from agenttune_assets.defs.jobs import failure_buffer_job
    from agenttune_assets.defs.resources import ClosedLoopResource, ServingResource, WarehouseResource
    from agenttune_assets.defs.sensors import failure_buffer_sensor, retrain_t5_sensor
    from agenttune_lib.closed_loop import TrainingBuffer
    from agenttune_lib.warehouse import Warehouse

    config = _config(tmp_path, redact=False)
    resources = {"warehouse": WarehouseResource(path=config.warehouse_path),
                 "closed_loop": ClosedLoopResource(audit_paths=[str(tmp_path / "no-audit.jsonl")], deploy_root=str(config.deploy_root)),
                 "serving": ServingResource(deploy_root=str(config.deploy_root), base_checkpoint=str(config.base_path))}
    defs = dg.Definitions(assets=[failure_buffer], jobs=[failure_buffer_job], resources=resources)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    with running_service(config) as (url, app), dg.instance_for_test() as instance:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        ids = [client.chat.completions.create(model="deployed", messages=[{"role": "user", "content": f"Weather in city {i}?"}], tools=[weather]).id
               for i in range(4)]

        def tick(sensor, cursor=None):
            with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources) as ctx:
                return sensor(ctx)

        assert tick(failure_buffer_sensor).skip_reason.skip_message == "no new served feedback or audit lines"
        for i, rid in enumerate(ids[:3]):  # three thumbs-down with the call that should have been made; one thumbs-up
            correction = f'<tool_call>{{"name": "get_weather", "arguments": {{"city": "city {i}"}}}}</tool_call>'
            assert httpx.post(url + "/v1/feedback", json={"request_id": rid, "thumbs": "down", "correction": correction}).json()["failure"]
        assert not httpx.post(url + "/v1/feedback", json={"request_id": ids[3], "thumbs": "up"}).json()["failure"]

        first = tick(failure_buffer_sensor)
        (request,) = first.run_requests
        assert request.tags["agenttune/served_feedback"] == "4"
        result = defs.resolve_job_def("failure_buffer_job").execute_in_process(instance=instance, tags=request.tags)
        assert result.success
        meta = result.asset_materializations_for_node("failure_buffer")[0].metadata
        served = meta["served_feedback"].value
        assert (served["feedback_rows"], served["failures"], served["buffered"], served["accepted"], served["end_seq"]) == (4, 3, 3, 3, 4)
        assert meta["per_root_cause"].value == {"wrong_tool": 3}
        buf = TrainingBuffer(Warehouse(config.warehouse_path))
        examples = sorted(buf.examples(), key=lambda e: ids.index(e.trajectory_id))
        assert [e.trajectory_id for e in examples] == ids[:3] and all(e.accepted for e in examples)
        assert examples[0].chosen == '<tool_call>{"name": "get_weather", "arguments": {"city": "city 0"}}</tool_call>'
        assert examples[0].prompt[-1] == {"role": "user", "content": "Weather in city 0?"} and examples[0].prompt[0]["role"] == "system"
        assert examples[0].metadata["served_adapter_id"] == "base:tiny" and examples[0].metadata["origin"] == f"feedback:{ids[0]}"
        # Nothing new: the next tick skips; the buffer's T5 (novel failure) sensor fires on the served failures.
        assert tick(failure_buffer_sensor, first.cursor).skip_reason.skip_message == "no new served feedback or audit lines"
        (retrain,) = tick(retrain_t5_sensor).run_requests
        assert retrain.tags["agenttune/trigger_name"] == "novel_failure:wrong_tool"


def test_sensor_requests_failure_buffer_on_new_audit_lines_once_per_state(tmp_path):
    from _decide_helpers import schema_model
    from agenttune_assets.defs.resources import ClosedLoopResource, WarehouseResource
    from agenttune_assets.defs.sensors import failure_buffer_sensor
    from agenttune_lib.decide import GraphRunner

    audit = tmp_path / "audit.jsonl"
    resources = {"warehouse": WarehouseResource(path=str(tmp_path / "wh.duckdb")), "closed_loop": ClosedLoopResource(audit_paths=[str(audit)])}
    with dg.instance_for_test() as instance:
        def tick(cursor=None):
            with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources) as ctx:
                return failure_buffer_sensor(ctx)

        assert tick().skip_reason.skip_message == "no new served feedback or audit lines"  # no log yet
        runner = GraphRunner.from_template("kyc_triage", model=schema_model(), audit=audit, review_dir=tmp_path / "reviews",
                                           human_review_timeout=0.0, destinations=[])
        runner.run(runner.config.examples[1])
        first = tick()
        (request,) = first.run_requests
        assert request.tags == {"agenttune/served_feedback": "0", "agenttune/audit_logs": "1"}
        assert tick(first.cursor).skip_reason.skip_message == "the last failure_buffer run already saw this state"
        runner.run(runner.config.examples[1])  # more lines: a new state, a new run key
        (again,) = tick(first.cursor).run_requests
        assert again.run_key != request.run_key
