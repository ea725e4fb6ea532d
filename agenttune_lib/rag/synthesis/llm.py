"""The injected LLM boundary: a protocol, an OpenAI-compatible HTTP client and a local transformers client.

Every call returns an LLMResponse carrying tokens, cost and latency so each stage can log them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["LLMClient", "LLMResponse", "OpenAICompatLLMClient", "TransformersLLMClient", "CallLog", "call_llm"]


@dataclasses.dataclass
class LLMResponse:
    """One completion with its accounting."""

    text: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0


@runtime_checkable
class LLMClient(Protocol):
    """Chat completion; ``json_mode`` asks for a single JSON object."""

    model: str

    def complete(self, messages: Sequence[dict[str, str]], *, json_mode: bool = False, max_tokens: int = 512) -> LLMResponse: ...


def call_llm(client: Any, messages: Sequence[dict[str, str]], json_mode: bool = False, max_tokens: int = 512) -> LLMResponse:
    """Call an injected client and normalise its reply: an LLMResponse, a plain string, a JSON-able object, or an
    OpenAI-style dict; clients whose ``complete`` takes only messages are called that way."""
    t0 = time.perf_counter()
    try:
        reply = client.complete(list(messages), json_mode=json_mode, max_tokens=max_tokens)
    except TypeError as exc:
        if "unexpected keyword" not in str(exc):
            raise
        reply = client.complete(list(messages))
    latency = time.perf_counter() - t0
    model = str(getattr(client, "model", None) or type(client).__name__)
    if isinstance(reply, LLMResponse):
        return reply
    if isinstance(reply, str):
        return LLMResponse(reply, model, latency_s=latency)
    if isinstance(reply, dict) and "choices" in reply:
        usage = reply.get("usage") or {}
        return LLMResponse(reply["choices"][0]["message"]["content"] or "", reply.get("model", model), int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), latency)
    if hasattr(reply, "text"):
        return LLMResponse(str(reply.text), model, int(getattr(reply, "prompt_tokens", 0) or 0), int(getattr(reply, "completion_tokens", 0) or 0), latency, float(getattr(reply, "cost_usd", 0.0) or 0.0))
    return LLMResponse(json.dumps(reply, default=str), model, latency_s=latency)


class CallLog:
    """Per-call accounting rows (stage, purpose, model, tokens, cost, latency) written with each stage."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def record(self, stage: str, purpose: str, response: LLMResponse, ref: str = "") -> None:
        self.rows.append(
            {
                "stage": stage,
                "purpose": purpose,
                "ref": ref,
                "model": response.model,
                "prompt_tokens": int(response.prompt_tokens),
                "completion_tokens": int(response.completion_tokens),
                "cost_usd": float(response.cost_usd),
                "latency_s": float(response.latency_s),
            }
        )

    def summary(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for row in self.rows:
            s = out.setdefault(row["stage"], {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0, "latency_s": 0.0})
            s["calls"] += 1
            for key in ("prompt_tokens", "completion_tokens", "cost_usd", "latency_s"):
                s[key] += row[key]
        return out


class OpenAICompatLLMClient:
    """Any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, llama.cpp server, Groq, OpenAI) over stdlib HTTP."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        price_per_1k_prompt: float = 0.0,
        price_per_1k_completion: float = 0.0,
        timeout_s: float = 120.0,
        temperature: float = 0.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.price_per_1k_prompt = price_per_1k_prompt
        self.price_per_1k_completion = price_per_1k_completion
        self.timeout_s = timeout_s
        self.temperature = temperature

    def complete(self, messages: Sequence[dict[str, str]], *, json_mode: bool = False, max_tokens: int = 512) -> LLMResponse:
        from agenttune_lib.models.openai_compat import chat_completion

        reply = chat_completion(
            self.base_url, self.model, messages, api_key=os.environ.get(self.api_key_env), max_tokens=max_tokens,
            temperature=self.temperature, json_mode=json_mode, timeout_s=self.timeout_s,
        )
        text, latency, pt, ct = reply.text, reply.latency_s, reply.prompt_tokens, reply.completion_tokens
        cost = pt / 1000 * self.price_per_1k_prompt + ct / 1000 * self.price_per_1k_completion
        return LLMResponse(text, reply.model, pt, ct, latency, cost)


class TransformersLLMClient:
    """A local causal LM through transformers' chat template and greedy decoding; loads lazily from a path."""

    def __init__(self, model_path: str | None = None, model: Any = None, tokenizer: Any = None, gguf_file: str | None = None) -> None:
        if model_path is None and model is None:
            raise ValueError("TransformersLLMClient needs a model_path or a (model, tokenizer) pair")
        self.model_path = model_path
        self.gguf_file = gguf_file
        self._model = model
        self._tokenizer = tokenizer
        self.model = model_path or type(model).__name__

    def _load(self) -> tuple[Any, Any]:
        if self._model is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            kwargs = {"gguf_file": self.gguf_file} if self.gguf_file else {}
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path, **kwargs)
            self._model = AutoModelForCausalLM.from_pretrained(self.model_path, **kwargs)
            self._model.eval()
        return self._model, self._tokenizer

    def complete(self, messages: Sequence[dict[str, str]], *, json_mode: bool = False, max_tokens: int = 512) -> LLMResponse:
        import torch

        model, tokenizer = self._load()
        msgs = [dict(m) for m in messages]
        if json_mode:
            if msgs and msgs[0]["role"] == "system":
                msgs[0]["content"] += "\nReply with one JSON object only."
            else:
                msgs.insert(0, {"role": "system", "content": "Reply with one JSON object only."})
        prompt = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        new = out[0, ids["input_ids"].shape[1] :]
        text = tokenizer.decode(new, skip_special_tokens=True)
        return LLMResponse(text, self.model, int(ids["input_ids"].shape[1]), int(new.shape[0]), time.perf_counter() - t0, 0.0)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.model_path is not None:
            state["_model"] = state["_tokenizer"] = None
        return state
