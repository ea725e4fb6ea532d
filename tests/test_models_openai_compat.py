"""The one OpenAI-compatible client that DECIDE, RAG synthesis and the LLM judge share."""
from __future__ import annotations

import pytest
from _chat_stub import chat_endpoint

from agenttune_lib.models.openai_compat import EndpointError, chat_completion, chat_completions_url
from agenttune_lib.rl.judge import JudgeError, OpenAICompatibleModel


def _reply(body):
    if body["model"] == "broken":
        return 500, b"boom"
    return {"model": "served", "choices": [{"message": {"content": "SCORE: 0.7"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


class _Handler:
    seen: list = []


@pytest.fixture
def endpoint():
    with chat_endpoint(_reply) as (url, seen):
        _Handler.seen = seen
        yield url


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
    path, body = _Handler.seen[-1]["path"], _Handler.seen[-1]["body"]
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
