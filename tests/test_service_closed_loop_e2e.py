"""The loop closed on served traffic, through the product path on the tiny model: requests through `agenttune serve` ->
negative feedback with corrections -> failure_buffer_sensor -> failure_buffer -> T5 sensor -> retrain_job (DPO, evaluation,
gate, deploy) -> the same running service answers with the new adapter, no restart; `agenttune lineage` walks from the
new adapter back to the served requests. No trainer or gate policy comes from the test."""
from __future__ import annotations

import json
import warnings

import dagster as dg
import httpx
import openai
import pytest

from _service_helpers import free_port, running_service

warnings.simplefilter("ignore")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
                                                            "required": ["city"]}}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_served_traffic_retrains_gates_and_redeploys(tmp_path, platform_home):
    from agenttune_assets.defs.assets.deploy import deployed_adapter, failure_buffer, gate_decision
    from agenttune_assets.defs.assets.evaluate import evaluation_report
    from agenttune_assets.defs.assets.train import trained_adapter
    from agenttune_assets.defs.jobs import failure_buffer_job, retrain_job
    from agenttune_assets.defs.resources import (
        ArtifactsResource, ClosedLoopResource, DecideModelResource, ModelsResource, RayResource, ServingResource, WarehouseResource,
    )
    from agenttune_assets.defs.sensors import failure_buffer_sensor, retrain_t5_sensor
    from agenttune_lib.cli import app as cli
    from agenttune_lib.models.base import select_base_model
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.service import ServiceConfig
    from agenttune_lib.warehouse import Warehouse
    from typer.testing import CliRunner

    models = platform_home / "models"
    base = save_tiny_model(models / "tiny")
    select_base_model(models, checkpoint=base)
    wh = Warehouse(platform_home / "warehouse.duckdb")
    deploy_root = models / "deployed"
    config = ServiceConfig(base_path=base, deploy_root=deploy_root, warehouse_path=str(wh.path), port=free_port(), redact=False,
                           max_completion_tokens=64, default_max_tokens=24)
    resources = {
        "warehouse": WarehouseResource(path=wh.path), "models": ModelsResource(path=str(models)),
        "artifacts": ArtifactsResource(path=str(platform_home / "artifacts")), "ray": RayResource(enabled=False),
        "decide_model": DecideModelResource(max_new_tokens=16),
        "serving": ServingResource(deploy_root=str(deploy_root), base_checkpoint=str(base)),
        # No DECIDE audit log and no held-out DECIDE sample: the gate judges the served failures' replay; the guard suites
        # need 20 paired items each (minutes of evaluation on a CPU), so this test configures none.
        "closed_loop": ClosedLoopResource(audit_paths=[str(tmp_path / "none.jsonl")], gate_holdout_size=0, gate_guards=[],
                                          gate_require_trajectory_arm=False),
    }
    run_config = {"ops": {
        "trained_adapter": {"config": {"batch_size": 6, "retrain": {"algorithm": "dpo", "max_steps": 20, "learning_rate": 0.01, "max_length": 512}}},
        "evaluation_report": {"config": {"qa_limit": 0, "tau2_n_tasks": 1, "max_new_tokens": 8}},
    }}
    defs = dg.Definitions(assets=[failure_buffer, trained_adapter, evaluation_report, gate_decision, deployed_adapter],
                          jobs=[failure_buffer_job, retrain_job], resources=resources)

    with running_service(config) as (url, app), dg.instance_for_test() as instance:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)

        def ask(i):
            return client.chat.completions.create(model="deployed", messages=[{"role": "user", "content": f"What is the weather in Paris? ({i})"}],
                                                  tools=[WEATHER], tool_choice="required", user=f"customer-{i}",
                                                  extra_body={"structured_tool_calls": True})

        # Served under structured decoding, every reply is a well-formed call, but the base model asks for the wrong city.
        served = [ask(i) for i in range(6)]
        assert {r.model for r in served} == {"base:tiny"}
        assert [json.loads(r.choices[0].message.tool_calls[0].function.arguments) for r in served] == [{"city": "Oslo"}] * 6
        for r in served:  # the call the agent should have made
            fb = httpx.post(url + "/v1/feedback", json={"request_id": r.id, "thumbs": "down", "correction": CALL}).json()
            assert fb["failure"] and fb["signals"] == ["judge_below_threshold"]

        def tick(sensor):
            with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
                return sensor(ctx)

        # The failure_buffer sensor sees the feedback and requests a run; T5 then fires on the never-trained root cause.
        (fb_request,) = tick(failure_buffer_sensor).run_requests
        res = defs.resolve_job_def("failure_buffer_job").execute_in_process(instance=instance, tags=fb_request.tags)
        assert res.success
        meta = res.asset_materializations_for_node("failure_buffer")[0].metadata
        assert meta["per_root_cause"].value == {"hallucinated_output": 6} and meta["accepted"].value == 6
        (request,) = tick(retrain_t5_sensor).run_requests
        assert request.tags["agenttune/trigger_name"] == "novel_failure:hallucinated_output"
        result = defs.resolve_job_def("retrain_job").execute_in_process(instance=instance, tags=request.tags, run_config=run_config)
        assert result.success
        gate = result.asset_materializations_for_node("gate_decision")[0].metadata
        assert gate["failures_replayed"].value == 6
        assert gate["failures_passing_old"].value == 0.0  # the base model never asks for Paris
        assert gate["approved"].value, gate["reasons"].value
        assert gate["failures_passing_new"].value == 1.0
        candidate = gate["candidate"].value
        deployed = result.asset_materializations_for_node("deployed_adapter")[0].metadata
        assert deployed["serving"].value == candidate and deployed["deployed_now"].value is True

        # The same service process, no restart: the next request is answered by the new adapter, which asks for Paris.
        after = ask(100)
        assert after.model == candidate and after.system_fingerprint == f"agenttune:{candidate}"
        (call,) = after.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        app.state.service.recorder.flush()

    # The warehouse holds every served EventLog, each naming the adapter that served it.
    logs = {log.id: log.metadata["served_adapter_id"] for log in wh.read_logs(source="serve")}
    assert logs == {**{r.id: "base:tiny" for r in served}, after.id: candidate}
    # Lineage: the new adapter back to the corrected examples and the served requests behind them.
    out = CliRunner().invoke(cli, ["lineage", candidate, "--json", "--no-dagster", "--warehouse", str(wh.path), "--deploy-root", str(deploy_root)])
    assert out.exit_code == 0, out.output
    chain = json.loads(out.output)
    assert {e["trajectory_id"] for e in chain["corrected_examples"]} == {r.id for r in served}
    assert all(e["origin"] == f"feedback:{e['trajectory_id']}" for e in chain["corrected_examples"])
    assert chain["gate_decision"]["approved"] and chain["deployment"]["adapter_id"] == candidate
