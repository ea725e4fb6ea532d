"""Model backends a DECIDE stage calls: a local transformers model, an OpenAI-compatible endpoint, a function.

Every backend answers ``generate(request) -> str`` for a ModelRequest; the runner
never knows which one it holds.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ModelRequest",
    "DecideModel",
    "ScriptedModel",
    "TransformersModel",
    "OpenAICompatibleModel",
    "request_schema",
    "as_model",
    "build_model",
]


class ModelRequest(str):
    """One model call. It *is* the prompt string, so a plain ``fn(prompt) -> str`` works as a model;
    the stage's expectations ride along as attributes (system, stage_id, output_schema, choices, …)."""

    prompt: str
    system: str | None
    stage_id: str
    stage_type: str
    template_id: str
    attempt: int
    max_new_tokens: int
    temperature: float
    output_schema: dict[str, Any] | None
    choices: tuple[str, ...] | None

    def __new__(
        cls,
        prompt: str,
        system: str | None = None,
        stage_id: str = "",
        stage_type: str = "",
        template_id: str = "",
        attempt: int = 1,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        output_schema: dict[str, Any] | None = None,
        choices: tuple[str, ...] | None = None,
    ) -> "ModelRequest":
        obj = super().__new__(cls, prompt)
        obj.prompt = str(prompt)
        obj.system = system
        obj.stage_id = stage_id
        obj.stage_type = stage_type
        obj.template_id = template_id
        obj.attempt = attempt
        obj.max_new_tokens = max_new_tokens
        obj.temperature = temperature
        obj.output_schema = output_schema
        obj.choices = choices
        return obj

    def __repr__(self) -> str:
        return f"ModelRequest(stage_id={self.stage_id!r}, attempt={self.attempt}, prompt={self.prompt[:60]!r})"

    def messages(self) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": self.prompt}]


@runtime_checkable
class DecideModel(Protocol):
    def generate(self, request: ModelRequest) -> str: ...


class ScriptedModel:
    """Replies from a function of the request, or per stage id from a string, a list (in turn) or a function."""

    def __init__(self, script: Callable[[ModelRequest], str] | Mapping[str, Any]) -> None:
        self.script = script
        self.calls: list[ModelRequest] = []
        self._cursor: dict[str, int] = {}
        self._lock = threading.Lock()

    def generate(self, request: ModelRequest) -> str:
        with self._lock:
            self.calls.append(request)
        if callable(self.script):
            return str(self.script(request))
        if request.stage_id not in self.script:
            raise KeyError(f"scripted model has no reply for stage {request.stage_id!r}; scripted: {sorted(self.script)}")
        entry = self.script[request.stage_id]
        if callable(entry):
            return str(entry(request))
        if isinstance(entry, str):
            return entry
        if isinstance(entry, Sequence):
            with self._lock:
                i = self._cursor.get(request.stage_id, 0)
                self._cursor[request.stage_id] = i + 1
            reply = entry[min(i, len(entry) - 1)]
            return reply if isinstance(reply, str) else json.dumps(reply)
        return json.dumps(entry)


class TransformersModel:
    """A local causal LM (checkpoint directory or a loaded model + tokenizer), greedy by default.

    Loads lazily on the first call; generation is serialized with a lock so parallel
    branches can share one model. With ``constrained`` (the default) a request that carries an
    ``output_schema`` (or router ``choices``) is decoded under that schema (xgrammar, see
    ``models.constrained``) with a token budget sized from the schema, so the reply is always
    schema-valid JSON; ``max_new_tokens`` then only caps free-text calls. ``num_threads`` (default 1) is the
    torch intra-op thread count for each call, restored afterwards: DECIDE's calls are short single-sequence
    generations, which on a shared CPU stall on a descheduled sibling thread (``bench/decide_threads.py``).
    """

    def __init__(
        self,
        checkpoint: str | Path | None = None,
        model: Any = None,
        tokenizer: Any = None,
        max_new_tokens: int | None = None,
        device: str = "cpu",
        gguf_file: str | None = None,
        constrained: bool = True,
        num_threads: int | None = 1,
    ) -> None:
        if checkpoint is None and (model is None or tokenizer is None):
            raise ValueError("TransformersModel needs a checkpoint path or both model and tokenizer")
        self.checkpoint = str(checkpoint) if checkpoint is not None else None
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.device = device
        self.gguf_file = gguf_file
        self.constrained = constrained
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be at least 1 (or None for torch's default), got {num_threads}")
        self.num_threads = num_threads
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        return self.checkpoint or getattr(getattr(self.model, "config", None), "_name_or_path", "") or "in-memory"

    def _load(self) -> None:
        if self.model is not None and self.tokenizer is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(self.checkpoint or "")
        if not path.exists():
            raise FileNotFoundError(f"model checkpoint {str(path)!r} does not exist")
        kwargs = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), **kwargs)
        self.model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs).to(self.device)
        self.model.eval()

    def generate(self, request: ModelRequest) -> str:
        import torch

        with self._lock:
            self._load()
            tok = self.tokenizer
            if getattr(tok, "chat_template", None):
                text = tok.apply_chat_template(request.messages(), tokenize=False, add_generation_prompt=True)
            else:
                text = "\n\n".join(m["content"] for m in request.messages()) + "\n"
            enc = tok(text, return_tensors="pt", add_special_tokens=False).to(self.device)
            max_new = self.max_new_tokens or request.max_new_tokens
            kwargs: dict[str, Any] = {"max_new_tokens": int(max_new), "pad_token_id": tok.pad_token_id or tok.eos_token_id}
            schema = request_schema(request) if self.constrained else None
            if schema is not None:
                from agenttune_lib.models.constrained import json_schema_logits_processor, schema_token_budget

                vocab = getattr(self.model.config, "vocab_size", None)
                kwargs["logits_processor"] = [json_schema_logits_processor(tok, schema, vocab_size=vocab)]
                kwargs["max_new_tokens"] = schema_token_budget(schema)
            if request.temperature > 0:
                kwargs.update(do_sample=True, temperature=request.temperature)
            else:
                kwargs.update(do_sample=False)
            previous = torch.get_num_threads()
            torch.set_num_threads(self.num_threads or previous)
            try:
                with torch.no_grad():
                    out = self.model.generate(**enc, **kwargs)
            finally:
                torch.set_num_threads(previous)
            return tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def request_schema(request: Any) -> dict[str, Any] | None:
    """The JSON schema a reply to ``request`` must satisfy: its ``output_schema``, or an enum of router ``choices``."""
    schema = getattr(request, "output_schema", None)
    if schema:
        return dict(schema)
    choices = getattr(request, "choices", None)
    if choices:
        return {"type": "string", "enum": [str(c) for c in choices]}
    return None


class OpenAICompatibleModel:
    """Any ``/v1/chat/completions`` endpoint over plain HTTP (vLLM, llama.cpp server, hosted APIs)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_new_tokens: int | None = None,
        json_mode: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_new_tokens = max_new_tokens
        self.json_mode = json_mode

    @property
    def version(self) -> str:
        return f"{self.base_url}#{self.model}"

    def generate(self, request: ModelRequest) -> str:
        from agenttune_lib.models.openai_compat import chat_completion

        return chat_completion(
            self.base_url,
            self.model,
            request.messages(),
            api_key=self.api_key,
            max_tokens=int(self.max_new_tokens or request.max_new_tokens),
            temperature=request.temperature,
            json_mode=self.json_mode and request.output_schema is not None,
            timeout_s=self.timeout,
        ).text


class _CallableModel:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def generate(self, request: ModelRequest) -> str:
        return str(self.fn(request))


def as_model(obj: Any) -> DecideModel:
    """A backend from a DecideModel, a mapping script, or a callable taking a ModelRequest."""
    if hasattr(obj, "generate") and callable(obj.generate):
        return obj
    if isinstance(obj, Mapping):
        return ScriptedModel(obj)
    if callable(obj):
        return _CallableModel(obj)
    raise TypeError(f"cannot use {type(obj).__name__} as a DECIDE model: need .generate(request), a mapping or a callable")


def build_model(
    backend: str = "transformers",
    checkpoint: str | Path | None = None,
    endpoint: str | None = None,
    model_name: str | None = None,
    api_key: str | None = None,
    max_new_tokens: int | None = None,
    num_threads: int | None = 1,
) -> DecideModel:
    """A backend from plain settings (CLI flags, Dagster resource config); ``num_threads`` applies to transformers only."""
    if backend == "transformers":
        if not checkpoint:
            raise ValueError("the transformers backend needs a checkpoint directory")
        return TransformersModel(checkpoint, max_new_tokens=max_new_tokens, num_threads=num_threads)
    if backend in ("openai", "openai_compatible", "endpoint"):
        if not endpoint or not model_name:
            raise ValueError("the OpenAI-compatible backend needs an endpoint URL and a model name")
        return OpenAICompatibleModel(endpoint, model_name, api_key=api_key, max_new_tokens=max_new_tokens)
    raise ValueError(f"unknown model backend {backend!r}; expected 'transformers' or 'openai'")
