"""LLM clients behind the synthesis protocol: an OpenAI-compatible endpoint (a local HTTP server) and a local transformers model."""
from __future__ import annotations

import pytest
from _chat_stub import chat_endpoint

from agenttune_lib.rag.synthesis.llm import OpenAICompatLLMClient, TransformersLLMClient


def _reply(body):
    if body["model"] == "broken":
        return 503, b"overloaded"
    return {"model": body["model"], "choices": [{"message": {"role": "assistant", "content": '{"answer": "x", "question": "y?"}'}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30}}


class _Handler:
    requests: list[dict] = []


@pytest.fixture
def endpoint():
    with chat_endpoint(_reply, suffix="/v1") as (url, seen):
        _Handler.requests = seen
        yield url


def test_openai_compatible_client_reports_tokens_cost_and_latency(endpoint, monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test")
    client = OpenAICompatLLMClient(endpoint, "m1", api_key_env="TEST_LLM_KEY", price_per_1k_prompt=0.5, price_per_1k_completion=1.0)
    resp = client.complete([{"role": "user", "content": "hi"}], json_mode=True, max_tokens=64)
    assert resp.text.startswith("{") and resp.model == "m1"
    assert (resp.prompt_tokens, resp.completion_tokens) == (120, 30)
    assert resp.cost_usd == pytest.approx(0.06 + 0.03) and resp.latency_s > 0
    sent = _Handler.requests[-1]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == "Bearer sk-test"
    assert sent["body"]["response_format"] == {"type": "json_object"} and sent["body"]["max_tokens"] == 64


def test_openai_compatible_client_errors_name_the_endpoint(endpoint):
    with pytest.raises(RuntimeError, match="HTTP 503"):
        OpenAICompatLLMClient(endpoint, "broken").complete([{"role": "user", "content": "hi"}])
    with pytest.raises(RuntimeError, match="unreachable"):
        OpenAICompatLLMClient("http://127.0.0.1:9/v1", "m", timeout_s=2).complete([{"role": "user", "content": "hi"}])


def test_transformers_client_generates_with_accounting(tiny_model):
    model, tokenizer = tiny_model
    client = TransformersLLMClient(model=model, tokenizer=tokenizer)
    resp = client.complete([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}], json_mode=True, max_tokens=5)
    assert isinstance(resp.text, str) and 0 < resp.completion_tokens <= 5 and resp.prompt_tokens > 0
