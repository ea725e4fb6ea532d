"""A seeded chat-generate callable over a transformers causal LM (optionally with a LoRA adapter)."""
from __future__ import annotations

from typing import Any

__all__ = ["HFChatGenerator", "load_chat_model"]


class HFChatGenerator:
    """``generate(messages, seed=, temperature=, max_new_tokens=) -> text`` with the tokenizer's chat template.

    Temperature 0 decodes greedily; otherwise sampling is seeded per call, so a seed names a
    reproducible run.
    """

    def __init__(self, model: Any, tokenizer: Any, max_input_tokens: int = 4096) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_input_tokens = max_input_tokens

    def __call__(self, messages: list[dict[str, Any]], seed: int = 0, temperature: float = 0.0, max_new_tokens: int = 128) -> str:
        import torch

        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        enc = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        ids = enc["input_ids"][:, -self.max_input_tokens:]
        mask = enc["attention_mask"][:, -self.max_input_tokens:]
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
        else:
            kwargs.update(do_sample=False)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        return self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def load_chat_model(path: str, adapter_path: str | None = None) -> HFChatGenerator:
    """A generator over the checkpoint at ``path``, with the PEFT adapter at ``adapter_path`` applied when given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if adapter_path:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path)
    return HFChatGenerator(model, tokenizer)
