"""Ray rollout engine: actors each hold a copy of the policy and generate rollouts in parallel.

After each policy update the trainer pushes the new LoRA weights to every actor. Ray starts
a local cluster sized to the machine by default; with ``RAY_ADDRESS`` set it joins that
cluster instead, which is how a run scales past one machine.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agenttune_lib.rl.lora import adapter_shapes, lora_config, lora_signature, require_same_adapter_keys, require_same_lora
from agenttune_lib.rl.rollout import RolloutConfig, RolloutEngine, TransformersRolloutEngine

__all__ = ["ensure_ray", "RayRolloutEngine", "run_on_ray"]


def ensure_ray(num_cpus: int | None = None, **init_kwargs: Any) -> Any:
    """Start (or join, with ``RAY_ADDRESS``) Ray once per process; returns the ray module."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, ignore_reinit_error=True, **init_kwargs)
        else:
            init_kwargs.setdefault("include_dashboard", False)
            ray.init(num_cpus=num_cpus, ignore_reinit_error=True, **init_kwargs)
    return ray


class _RolloutActor:
    """One policy copy: a checkpoint loaded from disk, wrapped in LoRA so pushed adapter weights load."""

    def __init__(self, model_path: str, config: RolloutConfig, lora: Any, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(max(threads, 1))
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        if lora is not None:
            from peft import get_peft_model

            model = get_peft_model(model, lora_config(lora))
        self.engine = TransformersRolloutEngine(model, tokenizer, config)
        self.weights_version = 0

    def rollout(self, prompts: list[Any], tools: Any, reward_fn: Any, reward_kwargs: dict[str, Any]) -> dict[str, Any]:
        out = self.engine.rollout(prompts, tools=tools, reward_fn=reward_fn, **reward_kwargs)
        out["actor_pid"] = [os.getpid()] * len(prompts)
        out["weights_version"] = [self.weights_version] * len(prompts)
        return out

    def generate(self, messages: Any) -> dict[str, Any]:
        return self.engine.generate(messages)

    def lora_signature(self) -> dict[str, Any] | None:
        return lora_signature(self.engine.model)

    def load_adapter_state(self, state: Mapping[str, Any], version: int) -> int:
        # PEFT loads whatever keys overlap and ignores the rest: demand the exact adapter, or this copy drifts off-policy.
        require_same_adapter_keys(adapter_shapes(self.engine.model), state, where=f"Ray rollout actor (pid {os.getpid()})")
        self.engine.load_adapter_state(state)
        self.weights_version = version
        return os.getpid()


class RayRolloutEngine(RolloutEngine):
    """Rollouts split across ``num_actors`` Ray actors; ``push_weights`` syncs LoRA weights to all of them.

    The actors sample on-policy only with the trainer's adapter: ``require_policy_match(model)`` refuses a
    trainer whose LoRA config differs (create_agentic_trainer calls it), and every push must carry exactly
    the actors' adapter parameters.
    """

    receives_weights = True

    def __init__(
        self,
        model_path: str,
        num_actors: int = 2,
        config: RolloutConfig | None = None,
        lora: Any = True,
        cpus_per_actor: float = 1.0,
        gpus_per_actor: float = 0.0,
    ) -> None:
        from transformers import AutoTokenizer

        ray = ensure_ray()
        self.config = config or RolloutConfig()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        actor_cls = ray.remote(num_cpus=cpus_per_actor, num_gpus=gpus_per_actor)(_RolloutActor)
        self.actors = [actor_cls.remote(str(model_path), self.config, lora, int(max(cpus_per_actor, 1))) for _ in range(num_actors)]
        self.version = 0

    def rollout(self, prompts: Sequence[Any], tools: Any = None, reward_fn: Any = None, metadata: Any = None, **reward_kwargs: Any) -> dict[str, Any]:
        import ray

        if not prompts:
            raise ValueError("rollout needs at least one prompt")
        n = len(prompts)
        k = min(len(self.actors), n)
        bounds = [round(i * n / k) for i in range(k + 1)]
        futures = []
        for a, (lo, hi) in zip(self.actors, zip(bounds, bounds[1:])):
            cols = {key: (v[lo:hi] if isinstance(v, (list, tuple)) and len(v) == n else v) for key, v in reward_kwargs.items()}
            futures.append(a.rollout.remote(list(prompts[lo:hi]), tools, reward_fn, cols))
        parts = ray.get(futures)
        merged: dict[str, Any] = {}
        for part in parts:
            for key, value in part.items():
                merged.setdefault(key, []).extend(value)
        return merged

    def generate(self, messages: Any) -> dict[str, Any]:
        """One assistant turn on the next actor in turn (the spine's engine protocol)."""
        import ray

        self._next = (getattr(self, "_next", -1) + 1) % len(self.actors)
        return ray.get(self.actors[self._next].generate.remote(messages))

    def lora_signatures(self) -> list[dict[str, Any] | None]:
        """Each actor's LoRA settings as PEFT resolved them on its policy copy."""
        import ray

        return ray.get([a.lora_signature.remote() for a in self.actors])

    def require_policy_match(self, model: Any) -> None:
        """Raise LoraMismatch naming both configs unless every actor's adapter is the trainer model's."""
        trainer_sig = lora_signature(model)
        for i, sig in enumerate(self.lora_signatures()):
            require_same_lora(trainer_sig, sig, engine_name=f"Ray rollout actor {i}")

    def push_weights(self, state: Mapping[str, Any]) -> list[int]:
        """Send new LoRA weights to every actor; returns the actors' pids once all have loaded them."""
        import ray

        self.version += 1
        ref = ray.put(dict(state))
        return ray.get([a.load_adapter_state.remote(ref, self.version) for a in self.actors])

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []


def node_cpus() -> float:
    """The most CPUs one live node of the connected cluster has: the most a single task can hold."""
    ray = ensure_ray()
    return max((float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")), default=1.0) or 1.0


def _threaded(fn: Callable[..., Any], threads: int) -> Callable[..., Any]:
    """``fn`` run with torch's intra-op threads set to the CPUs the task holds (a reused Ray worker may have fewer)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        import torch

        torch.set_num_threads(threads)
        return fn(*args, **kwargs)

    run.__name__ = getattr(fn, "__name__", "task")
    return run


def run_on_ray(fn: Callable[..., Any], *args: Any, num_gpus: float | None = None, num_cpus: float | None = 1.0,
               reserve_cpus: float = 0.0, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` (e.g. a TRL update) as a Ray task, GPU-placed when a GPU exists.

    ``num_cpus=None`` gives the task every CPU of one node but ``reserve_cpus`` (left for actors the task
    starts), and torch in the task computes on all of them.
    """
    ray = ensure_ray()
    if num_gpus is None:
        import torch

        num_gpus = 1.0 if torch.cuda.is_available() else 0.0
    if num_cpus is None:
        num_cpus = max(1.0, node_cpus() - reserve_cpus)
    task = _threaded(fn, max(1, int(num_cpus)))
    return ray.get(ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(task).remote(*args, **kwargs))
