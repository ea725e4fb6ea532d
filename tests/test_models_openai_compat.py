"""The one OpenAI-compatible client that DECIDE, RAG synthesis and the LLM judge share."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from agenttune_lib.models.openai_compat import EndpointError, chat_completion, chat_completions_url
from agenttune_lib.rl.judge import JudgeError, OpenAICompatibleModel


class _Handler(BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, body))
        if body["model"] == "broken":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"boom")
            return
        reply = {"model": "served", "choices": [{"message": {"content": "SCORE: 0.7"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
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
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.parametrize(
    "base, url",
    [("http://h:1", "http://h:1/v1/chat/completions"), ("http://h:1/v1/", "http://h:1/v1/chat/completions"),
     ("http://h:1/v1/chat/completions", "http://h:1/v1/chat/completions")],
)
def test_url_forms(base, url):
    assert chat_completions_url(base) == url


def test_completion_usage_and_request_body(endpoint):
    reply = chat_completion(endpoint, "m", [{"role": "user", "content": "hi"}], api_key="k", max_tokens=5, json_mode=True)
    assert (reply.text, reply.model, reply.prompt_tokens, reply.completion_tokens) == ("SCORE: 0.7", "served", 3, 2)
    path, body = _Handler.seen[-1]
    assert path == "/v1/chat/completions" and body["max_tokens"] == 5 and body["response_format"] == {"type": "json_object"}


def test_errors_name_the_endpoint(endpoint):
    with pytest.raises(EndpointError, match=r"answered HTTP 500: boom"):
        chat_completion(endpoint, "broken", [{"role": "user", "content": "hi"}])
    with pytest.raises(EndpointError, match=r"http://127.0.0.1:9/v1/chat/completions is unreachable"):
        chat_completion("http://127.0.0.1:9", "m", [], timeout_s=2)


def test_judge_model_speaks_through_it(endpoint):
    assert OpenAICompatibleModel(endpoint, "m")("rate this") == "SCORE: 0.7"
    with pytest.raises(JudgeError, match="judge model broken"):
        OpenAICompatibleModel(endpoint, "broken")("rate this")
