"""One OpenAI-compatible ``/chat/completions`` call over the standard library (vLLM, llama.cpp, Ollama, hosted APIs).

DECIDE, RAG synthesis and the LLM judge each wrap this one function in the interface they
inject; the HTTP, URL and error handling live here once. Stdlib HTTP rather than the
``openai`` package keeps the default install free of a provider SDK.
"""
from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any


class EndpointError(RuntimeError):
    """The endpoint failed; the message names the URL and what went wrong."""


@dataclasses.dataclass(frozen=True)
class ChatCompletion:
    text: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


def chat_completions_url(base_url: str) -> str:
    """Accept ``http://host``, ``http://host/v1`` or the full ``…/chat/completions`` URL."""
    url = base_url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


def chat_completion(
    base_url: str,
    model: str,
    messages: Sequence[dict[str, Any]],
    *,
    api_key: str | None = None,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    json_mode: bool = False,
    timeout_s: float = 60.0,
) -> ChatCompletion:
    """POST one chat completion and return its first choice's text with token usage and latency."""
    url = chat_completions_url(base_url)
    body: dict[str, Any] = {"model": model, "messages": list(messages), "temperature": temperature}
    if max_tokens is not None:
        body["max_tokens"] = int(max_tokens)
    if json_mode:
        body["response_format"] = {"type": "json_object"}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            data = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:500]
        raise EndpointError(f"endpoint {url} answered HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise EndpointError(f"endpoint {url} is unreachable: {exc}") from None
    except ValueError as exc:
        raise EndpointError(f"endpoint {url} returned a body that is not JSON: {exc}") from None
    latency = time.perf_counter() - t0
    try:
        text = data["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise EndpointError(f"endpoint {url} returned no choices[0].message.content: {str(data)[:300]}") from None
    usage = data.get("usage") or {}
    return ChatCompletion(
        str(text),
        str(data.get("model") or model),
        int(usage.get("prompt_tokens", 0) or 0),
        int(usage.get("completion_tokens", 0) or 0),
        latency,
    )
