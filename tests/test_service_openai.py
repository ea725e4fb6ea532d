"""`agenttune serve` driven by the official openai client on loopback (a real uvicorn server, the tiny model): a tool
call comes back well-formed under structured decoding, streaming yields the same text token by token, a deploy and a
rollback switch the next reply's adapter with no restart, bad requests get OpenAI-shaped 4xx errors, and every request
is a full-tier EventLog in the warehouse."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from _service_helpers import approve, free_port, running_service, tiny_adapter

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                                                            "required": ["city"], "additionalProperties": False}}}


@pytest.fixture
def service_setup(tmp_path):
    from agenttune_lib.models.tiny import save_tiny_model
    from agenttune_lib.service import ServiceConfig
    from agenttune_lib.warehouse import Warehouse

    base = save_tiny_model(tmp_path / "tiny")
    wh = Warehouse(tmp_path / "warehouse.duckdb")
    config = ServiceConfig(base_path=base, deploy_root=tmp_path / "deployed", warehouse_path=str(wh.path), port=free_port(),
                           redact=False, max_completion_tokens=128, default_max_tokens=16)
    return base, wh, config


def test_openai_client_tool_call_stream_and_deploy_switch(tmp_path, service_setup):
    from agenttune_lib.closed_loop import AdapterDeployer

    base, wh, config = service_setup
    with running_service(config) as (url, app):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused-on-loopback", max_retries=0)
        ids = [m.id for m in client.models.list().data]
        assert ids == ["deployed", "base:tiny"]

        # A tool call under structured decoding: well-formed, naming the offered tool with schema-valid arguments.
        resp = client.chat.completions.create(model="deployed", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                              tools=[WEATHER], tool_choice="required", max_tokens=96,
                                              extra_body={"structured_tool_calls": True})
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls" and resp.model == "base:tiny" and resp.system_fingerprint == "agenttune:base:tiny"
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")

        # A streamed tool call arrives as one tool_calls delta, then finish_reason "tool_calls".
        streamed = list(client.chat.completions.create(model="deployed", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                                       tools=[WEATHER], tool_choice="required", stream=True,
                                                       extra_body={"structured_tool_calls": True}))
        deltas = [c.choices[0].delta.tool_calls for c in streamed if c.choices and c.choices[0].delta.tool_calls]
        assert len(deltas) == 1 and deltas[0][0].function.name == "get_weather"
        assert json.loads(deltas[0][0].function.arguments) == json.loads(call.function.arguments)  # greedy: the same call
        assert streamed[-1].choices[0].finish_reason == "tool_calls"

        # Streaming: the same greedy reply, delivered in several chunks.
        ask = {"model": "deployed", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 12}
        whole = client.chat.completions.create(**ask)
        chunks = list(client.chat.completions.create(**ask, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert len(texts) >= 2 and "".join(texts) == whole.choices[0].message.content
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
        assert {c.model for c in chunks} == {"base:tiny"}

        # A deploy through the library's deployer: the very next request is answered by the new adapter, no restart.
        deployer = AdapterDeployer(config.deploy_root)
        deployer.apply_decision(approve("a1"), tiny_adapter(base, tmp_path / "a1", seed=1), adapter_id="a1")
        raw = client.chat.completions.with_raw_response.create(**ask)
        after = raw.parse()
        assert after.model == "a1" and after.system_fingerprint == "agenttune:a1" and raw.headers["x-agenttune-adapter"] == "a1"
        assert after.choices[0].message.content != whole.choices[0].message.content  # other weights, other greedy reply
        deployer.apply_decision(approve("a2"), tiny_adapter(base, tmp_path / "a2", seed=2), adapter_id="a2")
        assert client.chat.completions.create(**ask).model == "a2"
        deployer.rollback()
        assert client.chat.completions.create(**ask).model == "a1"
        # A named adapter and the bare base stay addressable; /v1/models names what 'deployed' serves.
        assert client.chat.completions.create(**{**ask, "model": "base:tiny"}).model == "base:tiny"
        assert client.chat.completions.create(**{**ask, "model": "a2"}).model == "a2"
        listed = {m.id: m for m in client.models.list().data}
        assert set(listed) == {"deployed", "base:tiny", "a1", "a2"} and listed["deployed"].model_extra["served_adapter_id"] == "a1"

        app.state.service.recorder.flush()
        logs = wh.read_logs(source="serve")
        # 1 tool call + 1 streamed call + 1 plain + 1 stream + 5 after the deploys = 9 requests, each a full-tier EventLog naming its adapter.
        assert len(logs) == 9 and all(log.tier == "full" and log.token_ids for log in logs)
        by_id = {log.id: log for log in logs}
        assert by_id[resp.id].metadata["served_adapter_id"] == "base:tiny" and by_id[after.id].metadata["served_adapter_id"] == "a1"
        assert [e.kind.value for e in by_id[resp.id].events] == ["observation", "tool_call", "turn_complete"]
        assert by_id[resp.id].events[1].payload["name"] == "get_weather"
        assert [log.metadata["served_adapter_id"] for log in logs].count("a1") == 2
        for rid in (resp.id, after.id):  # the reply's tokens carry their logprobs over exactly the completion span
            reply = by_id[rid].events[1]
            start, end = reply.token_span
            assert end == len(by_id[rid].token_ids) and len(reply.logprobs) == end - start > 0
            assert by_id[rid].events[0].token_span == (0, start)


def test_bad_requests_get_openai_shaped_errors(service_setup):
    base, wh, config = service_setup
    with running_service(config) as (url, app):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        msg = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model="no-such-adapter", messages=msg)
        assert e.value.body["code"] == "model_not_found" and "no-such-adapter" in e.value.body["message"]
        bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}}
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="deployed", messages=msg, tools=[bad_tool])
        assert e.value.body["code"] == "invalid_tool_schema" and e.value.body["param"] == "tools[0].function.parameters"
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="deployed", messages=msg, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
        assert e.value.body["code"] == "invalid_tool_choice"
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="deployed", messages=msg, max_tokens=10_000)
        assert e.value.body["code"] == "max_tokens_exceeded"
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="deployed", messages=[{"role": "user", "content": "word " * 5000}])
        assert e.value.body["code"] == "context_length_exceeded"
        r = httpx.post(url + "/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error" and "not valid JSON" in r.json()["error"]["message"]
        r = httpx.post(url + "/v1/chat/completions", json={"model": "deployed", "messages": []})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        r = httpx.post(url + "/v1/chat/completions", json={"model": "deployed", "messages": [{"role": "wizard", "content": "x"}]})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages.0.role")
        r = httpx.post(url + "/v1/chat/completions", content=b"x" * (config.max_body_bytes + 1), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        r = httpx.post(url + "/v1/feedback", json={"request_id": "chatcmpl-unknown", "thumbs": "down"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "request_not_found"
        r = httpx.post(url + "/v1/feedback", json={"request_id": "x"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_feedback"
        app.state.service.recorder.flush()
        assert wh.has_table("trajectories") is False or wh.read_logs(source="serve") == []  # refused requests are not traffic


def test_api_key_required_off_loopback_and_checked(tmp_path, service_setup):
    import dataclasses

    from agenttune_lib.service import ServiceConfig
    from agenttune_lib.service.server import startup_lines

    base, wh, config = service_setup
    with pytest.raises(ValueError, match="needs an API key"):
        ServiceConfig(base_path=base, deploy_root=config.deploy_root, warehouse_path=config.warehouse_path, host="0.0.0.0")
    assert "NO API key: auth is off because the service is bound to loopback (127.0.0.1) only" in startup_lines(config, "base:tiny")[1]
    keyed = dataclasses.replace(config, api_key="s3cret", port=free_port())
    assert "API key required" in startup_lines(keyed, "base:tiny")[1]
    with running_service(keyed) as (url, app):
        with pytest.raises(openai.AuthenticationError) as e:
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        assert e.value.body["code"] == "invalid_api_key"
        assert httpx.get(url + "/operator/api/state").status_code == 401
        ok = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert ok.chat.completions.create(model="deployed", messages=[{"role": "user", "content": "hi"}], max_tokens=2).model == "base:tiny"
