"""Tiny random-init causal LMs with a locally trained byte-level BPE tokenizer and a ChatML template.

They exercise every training and rollout path in well under a second, with no download.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]

_CORPUS = [
    "You are a helpful assistant that calls tools.",
    '<tool_call>{"name": "search", "arguments": {"query": "termination clause"}}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 2"}}</tool_call>',
    "The answer is 4. The contract may be terminated with thirty days notice.",
    "user assistant system tool observation reasoning final answer yes no",
    "0 1 2 3 4 5 6 7 8 9 { } [ ] ( ) : , . ? ! \" ' - _ = + * /",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]


@functools.lru_cache(maxsize=4)
def _trained_tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    return tok.to_str()


def build_tiny_tokenizer(vocab_size: int = 512) -> Any:
    """A PreTrainedTokenizerFast with ChatML specials and chat template, trained in-process."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_tokenizer_json(vocab_size)),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(
    arch: str = "qwen2", hidden_size: int = 64, num_layers: int = 2, seed: int = 0, vocab_size: int = 512
) -> tuple[Any, Any]:
    """(model, tokenizer): a random-init Qwen2 or Llama of ~250k parameters."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tokenizer = build_tiny_tokenizer(vocab_size)
    config_cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch]
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


def save_tiny_model(path: str | Path, **kwargs: Any) -> Path:
    """Write a tiny model and its tokenizer as a checkpoint directory (for path-based loaders)."""
    model, tokenizer = build_tiny_model(**kwargs)
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
