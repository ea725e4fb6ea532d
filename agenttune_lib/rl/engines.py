"""create_rollout_engine: one name for each rollout engine (above rollout.py and ray_engine.py, so neither imports the other)."""
from __future__ import annotations

from typing import Any

from agenttune_lib.rl.rollout import RolloutEngine, TransformersRolloutEngine, VLLMRolloutEngine

__all__ = ["create_rollout_engine"]


def create_rollout_engine(kind: str, **kwargs: Any) -> RolloutEngine:
    """``transformers`` (model, tokenizer), ``vllm`` (model_path) or ``ray`` (model_path, num_actors)."""
    kind = kind.lower()
    if kind == "transformers":
        return TransformersRolloutEngine(**kwargs)
    if kind == "vllm":
        return VLLMRolloutEngine(**kwargs)
    if kind == "ray":
        from agenttune_lib.rl.ray_engine import RayRolloutEngine

        return RayRolloutEngine(**kwargs)
    raise ValueError(f"unknown rollout engine {kind!r}; expected 'transformers', 'vllm' or 'ray'")
