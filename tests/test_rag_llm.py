"""LLM clients behind the synthesis protocol: an OpenAI-compatible endpoint (a local HTTP server) and a local transformers model."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agenttune_lib.rag.synthesis.llm import OpenAICompatLLMClient, TransformersLLMClient


class _Handler(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if body["model"] == "broken":
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"overloaded")
            return
        reply = {"model": body["model"], "choices": [{"message": {"role": "assistant", "content": '{"answer": "x", "question": "y?"}'}}],
                 "usage": {"prompt_tokens": 120, "completion_tokens": 30}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


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
