"""Generation for the service: one worker thread owns the model; concurrent plain requests for the same weights share
one left-padded ``generate`` call (batching), while streamed or schema-constrained requests run alone through the
spine's ``ChatGenerator`` (a streamer, xgrammar's processor). vLLM serves only where vLLM and a CUDA GPU exist."""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from agenttune_lib.models.serving import ServedModel
from agenttune_lib.service.errors import APIError

__all__ = ["GenJob", "Completion", "TransformersEngine", "build_engine", "vllm_unavailable_reason"]


@dataclasses.dataclass
class GenJob:
    """One request's decoding: which weights, the rendered messages, limits, and optional constraint and stream sink."""

    served: ServedModel
    messages: list[dict[str, str]]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stops: tuple[str, ...] = ()
    keep_stops: tuple[str, ...] = ()
    tool_schemas: tuple[dict[str, Any], ...] | None = None
    json_schema: dict[str, Any] | None = None
    allow_text: bool = True
    on_text: Callable[[str], None] | None = None
    future: Future = dataclasses.field(default_factory=Future)

    @property
    def solo(self) -> bool:
        """Runs alone: streamed (one streamer per generate call) or constrained (one grammar per call)."""
        return self.on_text is not None or self.tool_schemas is not None or self.json_schema is not None

    def batch_key(self) -> tuple:
        return (str(self.served.base_path), self.served.adapter_id, self.temperature, self.top_p, self.stops, self.keep_stops)


@dataclasses.dataclass(frozen=True)
class Completion:
    """What the model produced for one job, with the ids and logprobs the full-tier EventLog keeps."""

    text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    served_adapter_id: str
    batch_size: int
    generate_s: float


def vllm_unavailable_reason() -> str | None:
    """Why the vLLM engine cannot run here (None when it can): vLLM must be installed and a CUDA GPU visible."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install '.[gpu]' on a CUDA machine); serve with --engine transformers"
    import torch

    if not torch.cuda.is_available():
        return "vLLM is installed but no CUDA GPU is visible; serve with --engine transformers"
    return None


def _cut(text: str, stops: tuple[str, ...], keep: tuple[str, ...]) -> tuple[str, bool]:
    """Text up to the first stop string (a kept stop, like ``</tool_call>``, stays in); whether one was hit."""
    best = None
    for s in stops + keep:
        i = text.find(s)
        if i >= 0:
            end = i + len(s) if s in keep else i
            best = end if best is None else min(best, end)
    return (text, False) if best is None else (text[:best], True)


class _TextStreamer:
    """A transformers streamer pushing decoded text deltas (the first ``put`` is the prompt, skipped)."""

    def __init__(self, tokenizer: Any, sink: Callable[[str], None], stops: tuple[str, ...], keep: tuple[str, ...]) -> None:
        self.tokenizer, self.sink, self.stops, self.keep = tokenizer, sink, stops, keep
        self.ids: list[int] = []
        self.sent = 0
        self.prompt_seen = False
        self.done = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.ids.extend(int(x) for x in value.reshape(-1).tolist())
        self._emit(final=False)

    def _emit(self, final: bool) -> None:
        if self.done:
            return
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        text, hit = _cut(text, self.stops, self.keep)
        if not final and not hit and text.endswith("\ufffd"):
            return  # a multi-byte character still arriving
        if len(text) > self.sent:
            self.sink(text[self.sent:])
            self.sent = len(text)
        self.done = hit

    def end(self) -> None:
        self._emit(final=True)


class TransformersEngine:
    """The CPU/transformers engine: a queue, one worker thread, batches of compatible jobs."""

    def __init__(self, max_batch: int = 16, batch_wait_s: float = 0.01, num_threads: int | None = None) -> None:
        self.max_batch, self.batch_wait_s, self.num_threads = max_batch, batch_wait_s, num_threads
        self._queue: queue.Queue[GenJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="agenttune-serve-engine", daemon=True)
        self._stopped = False
        self.batches: list[int] = []  # sizes of the batches run (the load bench reports them)
        self._thread.start()

    def prompt_ids(self, served: ServedModel, messages: list[dict[str, str]], limit: int) -> list[int]:
        """Token ids of the rendered prompt (loads the weights on first use); over ``limit`` is a 400."""
        _, tokenizer = served.load()
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(ids) > limit:
            raise APIError(400, f"the prompt has {len(ids)} tokens, over this service's limit of {limit}", "context_length_exceeded", "messages")
        return ids

    def submit(self, job: GenJob) -> Future:
        if self._stopped:
            raise APIError(503, "the engine is shutting down", "engine_stopped", type="server_error")
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        self._stopped = True
        self._queue.put(None)
        self._thread.join(timeout=30)

    # -- worker ------------------------------------------------------------------
    def _run(self) -> None:
        import torch

        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        pending: list[GenJob] = []
        while True:
            if not pending:
                job = self._queue.get()
                if job is None:
                    return
                pending.append(job)
            deadline = time.perf_counter() + self.batch_wait_s
            while len(pending) < self.max_batch * 4:
                try:
                    job = self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if job is None:
                    self._stopped = True
                    break
                pending.append(job)
            first = pending[0]
            if first.solo:
                group = [first]
            else:
                key = first.batch_key()
                group = [j for j in pending if not j.solo and j.batch_key() == key][: self.max_batch]
            pending = [j for j in pending if all(j is not g for g in group)]
            try:
                results = self._solo(first) if first.solo else self._batch(group)
                for job, res in zip(group, results):
                    job.future.set_result(res)
            except Exception as exc:  # noqa: BLE001 - the failure goes back to each waiting request
                for job in group:
                    if not job.future.done():
                        job.future.set_exception(exc)
            if self._stopped and not pending:
                return

    def _solo(self, job: GenJob) -> list[Completion]:
        from agenttune_lib.models.generate import ChatGenerator, GenerationConfig

        model, tokenizer = job.served.load()
        cfg = GenerationConfig(
            max_new_tokens=job.max_new_tokens, temperature=job.temperature, top_p=job.top_p, seed=job.seed,
            stop_strings=job.stops + job.keep_stops, constrained=job.tool_schemas is not None or job.json_schema is not None,
            tool_schemas=job.tool_schemas, json_schema=job.json_schema, allow_text=job.allow_text,
        )
        streamer = _TextStreamer(tokenizer, job.on_text, job.stops, job.keep_stops) if job.on_text else None
        t0 = time.perf_counter()
        gen = ChatGenerator(model, tokenizer, cfg)(job.messages, streamer=streamer)
        ids = [i for i in gen.completion_ids if i not in (tokenizer.eos_token_id, tokenizer.pad_token_id)]
        text, hit = _cut(gen.text, job.stops, job.keep_stops)
        ended = hit or len(gen.completion_ids) < job.max_new_tokens or (gen.completion_ids and gen.completion_ids[-1] == tokenizer.eos_token_id)
        self.batches.append(1)
        return [Completion(text, list(gen.prompt_ids), ids, list(gen.logprobs[: len(ids)]), "stop" if ended else "length",
                           job.served.served_adapter_id, 1, time.perf_counter() - t0)]

    def _batch(self, jobs: list[GenJob]) -> list[Completion]:
        import torch

        from agenttune_lib.models.generate import _stop_criteria

        model, tokenizer = jobs[0].served.load()
        prompts = []
        for job in jobs:
            text = tokenizer.apply_chat_template(job.messages, tokenize=False, add_generation_prompt=True)
            prompts.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        first = jobs[0]
        kwargs: dict[str, Any] = {"attention_mask": mask, "max_new_tokens": max(j.max_new_tokens for j in jobs), "pad_token_id": pad,
                                  "return_dict_in_generate": True, "output_scores": True}
        if first.temperature > 0:
            kwargs.update(do_sample=True, temperature=first.temperature, top_p=first.top_p)
            torch.manual_seed(first.seed if first.seed is not None else 0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        stops = first.stops + first.keep_stops
        if stops:
            kwargs["stopping_criteria"] = _stop_criteria(tokenizer, stops, width)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids, **kwargs)
            scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        elapsed = time.perf_counter() - t0
        self.batches.append(len(jobs))
        results = []
        eos = tokenizer.eos_token_id
        for row, (job, prompt) in enumerate(zip(jobs, prompts)):
            gen = [int(t) for t in out.sequences[row, width:].tolist()]
            lps = [float(x) for x in scores[row].tolist()]
            ended = False
            for i, tok in enumerate(gen):
                if tok == eos or (tok == pad and pad != eos):
                    gen, lps, ended = gen[:i], lps[:i], True
                    break
            if len(gen) > job.max_new_tokens:
                gen, lps = gen[: job.max_new_tokens], lps[: job.max_new_tokens]
            text, hit = _cut(tokenizer.decode(gen, skip_special_tokens=True), job.stops, job.keep_stops)
            ended = ended or hit or len(gen) < job.max_new_tokens
            results.append(Completion(text, prompt, gen, lps[: len(gen)], "stop" if ended else "length",
                                      job.served.served_adapter_id, len(jobs), elapsed))
        return results


def build_engine(kind: str, max_batch: int, batch_wait_s: float, num_threads: int | None) -> TransformersEngine:
    """The engine ``--engine`` names; vLLM refuses with the reason where it cannot run."""
    if kind == "vllm":
        reason = vllm_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"--engine vllm: {reason}")
        raise RuntimeError("--engine vllm: vLLM and a CUDA GPU are present, but this build serves on transformers only; "
                           "the vLLM LoRA path has not been verified on a GPU (see README)")
    return TransformersEngine(max_batch=max_batch, batch_wait_s=batch_wait_s, num_threads=num_threads)
