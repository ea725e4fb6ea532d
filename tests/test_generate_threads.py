"""ChatGenerator's per-call thread count is the call's own: the process's torch thread count is restored after it."""
from __future__ import annotations

import pytest
import torch

from agenttune_lib.models.generate import ChatGenerator, GenerationConfig
from agenttune_lib.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(seed=3)


def test_num_threads_applies_to_the_call_and_is_restored(tiny, monkeypatch):
    model, tok = tiny
    seen = []
    original = model.generate

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ChatGenerator(model, tok, GenerationConfig(max_new_tokens=3, num_threads=1, stop_strings=()))("hi")
        assert seen == [1] and torch.get_num_threads() == 2
        ChatGenerator(model, tok, GenerationConfig(max_new_tokens=3, stop_strings=()))("hi")  # None: the process's own
        assert seen == [1, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_thread_count_is_restored_when_generation_fails(tiny, monkeypatch):
    model, tok = tiny

    def boom(*args, **kwargs):
        raise RuntimeError("generation failed")

    monkeypatch.setattr(model, "generate", boom)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="generation failed"):
            ChatGenerator(model, tok, GenerationConfig(max_new_tokens=3, num_threads=1, stop_strings=()))("hi")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
