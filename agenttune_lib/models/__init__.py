"""Model access: the packaged small model, tiny test models, and the generate callable the spine injects."""
from agenttune_lib.models.tiny import build_tiny_model, build_tiny_tokenizer

__all__ = ["build_tiny_model", "build_tiny_tokenizer"]
