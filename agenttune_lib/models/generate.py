"""A chat-generate callable over a transformers causal LM: messages in, a Generation (text, token ids, logprobs) out.

This is the model the spine injects into strategies; its ``rollout`` method makes it an
engine for ``Project.collect_rollout``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agenttune_lib.spine.state import Generation

__all__ = ["GenerationConfig", "ChatGenerator", "load_chat_generator"]


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Decoding settings: greedy when ``temperature`` is 0."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0
    stop_strings: tuple[str, ...] = ("</tool_call>",)
    max_prompt_tokens: int | None = None
    num_threads: int | None = None
    #: Structured decoding (``models.constrained``, xgrammar), applied only when ``constrained`` is true:
    #: a reply valid against ``json_schema``, or ``<tool_call>{call}</tool_call>`` / plain text for ``tool_schemas``.
    json_schema: dict | None = None
    tool_schemas: tuple | None = None
    constrained: bool = False
    allow_text: bool = True


def _stop_criteria(tokenizer: Any, stops: Sequence[str], prompt_len: int) -> Any:
    """Stop once the completion's decoded tail contains a stop string.

    transformers' own ``stop_strings`` precomputes over the whole vocabulary on every call
    (over a second for a 49k vocabulary); decoding a short tail per step costs microseconds.
    """
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    window = max(len(s) for s in stops) + 8

    class _StopOnText(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            done = []
            for row in input_ids:
                tail = tokenizer.decode(row[prompt_len:][-window:], skip_special_tokens=True)
                done.append(any(stop in tail for stop in stops))
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_StopOnText()])


class ChatGenerator:
    """Renders messages with the tokenizer's chat template and generates one assistant reply."""

    def __init__(self, model: Any, tokenizer: Any, config: GenerationConfig | None = None, **overrides: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = dataclasses.replace(config or GenerationConfig(), **overrides)
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("ChatGenerator needs a tokenizer with a chat template")
        self.calls = 0
        self.generated_tokens = 0

    def _prompt_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        limit = self.config.max_prompt_tokens
        if limit is not None and len(ids) > limit:
            raise ValueError(f"prompt has {len(ids)} tokens, over max_prompt_tokens={limit}")
        return ids

    def _logits_processors(self, cfg: GenerationConfig) -> list[Any]:
        """The structured-decoding processor the config asks for (a fresh one per generate call), or none."""
        if not cfg.constrained:
            return []
        if cfg.json_schema is not None and cfg.tool_schemas:
            raise ValueError("GenerationConfig: set json_schema or tool_schemas for constrained decoding, not both")
        from agenttune_lib.models import constrained

        vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
        if cfg.json_schema is not None:
            return [constrained.json_schema_logits_processor(self.tokenizer, cfg.json_schema, vocab_size=vocab)]
        if cfg.tool_schemas:
            return [constrained.tool_call_logits_processor(self.tokenizer, list(cfg.tool_schemas), allow_text=cfg.allow_text, vocab_size=vocab)]
        raise ValueError("GenerationConfig(constrained=True) needs json_schema or tool_schemas")

    def __call__(self, messages: Any, streamer: Any = None, **overrides: Any) -> Generation:
        """One reply; ``overrides`` replace config fields for this call (e.g. ``json_schema=..., constrained=True``);
        ``streamer`` (a transformers streamer) receives the tokens as they are generated (the service's SSE path)."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        import torch

        cfg = dataclasses.replace(self.config, **overrides) if overrides else self.config
        prompt_ids = self._prompt_ids(messages)
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        kwargs: dict[str, Any] = {
            "max_new_tokens": cfg.max_new_tokens,
            "attention_mask": torch.ones_like(input_ids),
            "return_dict_in_generate": True,
            "output_scores": True,
            "pad_token_id": self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id,
        }
        if cfg.temperature > 0:
            kwargs.update(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        processors = self._logits_processors(cfg)
        if processors:
            kwargs["logits_processor"] = processors
        if cfg.stop_strings:
            kwargs["stopping_criteria"] = _stop_criteria(self.tokenizer, cfg.stop_strings, len(prompt_ids))
        if streamer is not None:
            kwargs["streamer"] = streamer
        previous_threads = torch.get_num_threads()
        if cfg.num_threads is not None:
            # Oversubscribed shared CPUs run a small model many times faster on one thread; restored after the call so
            # later work in the same process (the next asset of an in-process run) keeps its own thread count.
            torch.set_num_threads(cfg.num_threads)
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed + self.calls)
        try:
            with torch.no_grad():
                out = self.model.generate(input_ids, **kwargs)
        finally:
            if torch.get_num_threads() != previous_threads:
                torch.set_num_threads(previous_threads)
        completion = out.sequences[0, len(prompt_ids):]
        scores = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)[0]
        completion_ids = [int(t) for t in completion.tolist()]
        logprobs = [float(x) for x in scores.tolist()][: len(completion_ids)]
        # Drop padding after an early stop so ids and logprobs stay aligned.
        pad = kwargs["pad_token_id"]
        eos = self.tokenizer.eos_token_id
        keep = len(completion_ids)
        while keep > 0 and completion_ids[keep - 1] == pad and pad != eos:
            keep -= 1
        completion_ids, logprobs = completion_ids[:keep], logprobs[:keep]
        text = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
        self.calls += 1
        self.generated_tokens += len(completion_ids)
        return Generation(text=text, prompt_ids=prompt_ids, completion_ids=completion_ids, logprobs=logprobs)

    def rollout(self, prompts: Sequence[Any]) -> list[Generation]:
        """One generation per prompt (messages or text): the engine method ``Project.collect_rollout`` calls."""
        return [self(p) for p in prompts]


def load_chat_generator(path: Any, config: GenerationConfig | None = None, **overrides: Any) -> ChatGenerator:
    """A ChatGenerator over a converted checkpoint directory (see ``models.base``)."""
    from agenttune_lib.models.base import load_base_model

    model, tokenizer = load_base_model(path)
    return ChatGenerator(model, tokenizer, config, **overrides)
