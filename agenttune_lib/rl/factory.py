"""create_agentic_trainer: one entry point for GRPO, PPO, DPO, RLOO and BCO over the installed TRL.

Keyword arguments are split between the TRL *Config dataclass and the *Trainer constructor
by ``inspect.signature``/dataclass fields, so the accepted surface follows the installed
TRL. A keyword neither accepts is an error naming it and the algorithm.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agenttune_lib.rl.lora import lora_config

__all__ = ["Algorithm", "create_agentic_trainer", "split_trl_kwargs", "lora_config", "build_value_model", "TRAINER_CLASSES"]


class Algorithm(str, enum.Enum):
    """The five dispatchable algorithms (paper Table 4)."""

    GRPO = "grpo"
    PPO = "ppo"
    DPO = "dpo"
    RLOO = "rloo"
    BCO = "bco"

    @classmethod
    def parse(cls, name: "str | Algorithm") -> "Algorithm":
        if isinstance(name, cls):
            return name
        try:
            return cls(str(name).strip().lower())
        except ValueError:
            raise ValueError(f"unknown algorithm {name!r}; expected one of {[a.value for a in cls]}") from None


#: algorithm -> (trainer class path, TRL config class name)
TRAINER_CLASSES: dict[Algorithm, tuple[str, str]] = {
    Algorithm.GRPO: ("TrlAgenticGRPO", "GRPOConfig"),
    Algorithm.PPO: ("TrlAgenticPPO", "GRPOConfig"),
    Algorithm.DPO: ("TrlAgenticDPO", "DPOConfig"),
    Algorithm.RLOO: ("TrlAgenticRLOO", "RLOOConfig"),
    Algorithm.BCO: ("TrlAgenticBCO", "KTOConfig"),
}


def _classes(algorithm: Algorithm) -> tuple[type, type]:
    import trl

    from agenttune_lib.rl import trl_trainers

    trainer_name, config_name = TRAINER_CLASSES[algorithm]
    return getattr(trl_trainers, trainer_name), getattr(trl, config_name)


def _trainer_params(trainer_cls: type) -> set[str]:
    names: set[str] = set()
    for klass in trainer_cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                names.add(p.name)
        if klass.__module__.startswith("trl."):
            break
    return names


def split_trl_kwargs(algorithm: str | Algorithm, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config kwargs, trainer kwargs) for ``algorithm``; an unknown keyword raises TypeError naming it."""
    algo = Algorithm.parse(algorithm)
    trainer_cls, config_cls = _classes(algo)
    config_fields = {f.name for f in dataclasses.fields(config_cls)}
    trainer_params = _trainer_params(trainer_cls)
    config_kw, trainer_kw, unknown = {}, {}, []
    for key, value in kwargs.items():
        if key in trainer_params and key != "args":
            trainer_kw[key] = value
        elif key in config_fields:
            config_kw[key] = value
        else:
            unknown.append(key)
    if unknown:
        raise TypeError(
            f"create_agentic_trainer({algo.value!r}): unknown keyword argument(s) {unknown}; accepted by neither "
            f"{config_cls.__name__} nor {trainer_cls.__name__} in the installed TRL"
        )
    return config_kw, trainer_kw


def build_value_model(policy: Any) -> Any:
    """A per-token critic with the policy's architecture and weights, for PPO (agenttune_lib.rl.ppo)."""
    from agenttune_lib.rl.ppo import build_value_model as build

    return build(policy)


def _require_training_engine(algo: Algorithm, engine: Any, model: Any, config_kw: Mapping[str, Any], given_args: Any) -> None:
    """Refuse a training rollout that would be off-policy without saying so (issue 29).

    Allowed: the trainer's own policy (no engine, or a TransformersRolloutEngine over ``model``), or an engine
    that receives the trainer's weights every step (Ray) with GRPO/PPO, whose sampling logprobs feed the
    importance-sampling correction. vLLM is refused for training: this engine never receives weights, and
    TRL's own vLLM path (``use_vllm``) generates without the agentic tool loop.
    """
    use_vllm = config_kw.get("use_vllm", getattr(given_args, "use_vllm", False))
    if use_vllm:
        raise ValueError(
            f"create_agentic_trainer({algo.value!r}): use_vllm=True is refused for agentic training: TRL would sync the "
            "trainer's weights into its own vLLM engine, but the agentic tool loop samples with the rollout engine, so "
            "the vLLM copy would be updated and never used. Train with the trainer's own policy (rollout_engine=None) "
            "or a RayRolloutEngine; use VLLMRolloutEngine for evaluation and teacher rollouts"
        )
    if engine is None:
        return
    name = type(engine).__name__
    if getattr(engine, "receives_weights", False):
        if algo not in (Algorithm.GRPO, Algorithm.PPO):
            raise ValueError(
                f"create_agentic_trainer({algo.value!r}): {name} samples with its own policy copies, and {algo.value}'s TRL "
                "trainer drops the sampling logprobs, so no importance-sampling correction can be applied; use grpo or ppo "
                "with this engine, or rollout_engine=None (the trainer's own policy)"
            )
        if not config_kw.get("vllm_importance_sampling_correction", getattr(given_args, "vllm_importance_sampling_correction", True)):
            raise ValueError(
                f"create_agentic_trainer({algo.value!r}): vllm_importance_sampling_correction=False with {name}: its samples "
                "come from policy copies and would train uncorrected; keep the correction (TRL's vllm_importance_sampling_* "
                "settings apply to every engine that samples outside the trainer)"
            )
        if config_kw.get("loss_type", getattr(given_args, "loss_type", None)) == "vespo":
            raise ValueError(f"create_agentic_trainer({algo.value!r}): loss_type='vespo' cannot take the importance-sampling "
                             f"correction for {name}'s samples; use another loss_type or rollout_engine=None")
        return
    follows = getattr(engine, "follows_policy", None)
    if callable(follows) and follows(model):
        return
    if getattr(engine, "receives_weights", None) is False and "vllm" in name.lower():
        raise ValueError(
            f"create_agentic_trainer({algo.value!r}): {name} is refused for training: it loads its checkpoint once and never "
            "receives the trainer's weights, so every rollout after the first update would come from the initial policy "
            "(off-policy, uncorrected). vLLM is for evaluation and teacher rollouts here; train with rollout_engine=None "
            "(the trainer's own policy) or a RayRolloutEngine (weights pushed every step)"
        )
    raise ValueError(
        f"create_agentic_trainer({algo.value!r}): rollout engine {name} cannot receive the trainer's weights (no push_weights, "
        "and it does not sample with the model being trained), so its rollouts would be off-policy after the first update; "
        "use rollout_engine=None, a TransformersRolloutEngine over the trained model, or a RayRolloutEngine"
    )


def _cpu_defaults() -> dict[str, Any]:
    import torch

    on_gpu = torch.cuda.is_available()
    return {"use_cpu": not on_gpu, "bf16": on_gpu and torch.cuda.is_bf16_supported(), "report_to": "none", "save_strategy": "no", "logging_steps": 1}


def create_agentic_trainer(
    algorithm: str | Algorithm = "grpo",
    *,
    model: Any,
    tokenizer: Any = None,
    train_dataset: Any = None,
    reward_funcs: Any = None,
    reward_weights: Sequence[float] | None = None,
    tools: Any = None,
    lora: Any = True,
    rollout_engine: Any = None,
    rollout_sink: Callable[[list[Any]], None] | None = None,
    output_dir: str | None = None,
    environments: Mapping[str, Callable[[], Any]] | None = None,
    **kwargs: Any,
) -> Any:
    """A TRL trainer for ``algorithm`` with LoRA and, when ``tools`` is given, agentic tool-calling rollouts.

    ``reward_funcs`` (callables or REWARD_REGISTRY names) go through ``combine_rewards`` for
    GRPO and PPO; RLOO gets them as-is. ``rollout_sink`` receives every rollout's EventLogs.
    Remaining keywords go to the TRL config or trainer, whichever accepts them. ``environments``
    ({name: factory}) runs each dataset row in the environment its ``environment`` column names.
    """
    algo = Algorithm.parse(algorithm)
    trainer_cls, config_cls = _classes(algo)
    if model is None:
        raise ValueError(f"create_agentic_trainer({algo.value!r}) needs model=")
    if tokenizer is not None:
        kwargs.setdefault("processing_class", tokenizer)
    given_args = kwargs.pop("args", None)
    if given_args is not None and not isinstance(given_args, config_cls):
        raise TypeError(f"create_agentic_trainer({algo.value!r}): args must be a {config_cls.__name__}, got {type(given_args).__name__}")
    if kwargs.get("efficiency") is not None and algo is not Algorithm.GRPO and algo is not Algorithm.PPO:
        raise ValueError(
            f"{algo.value} cannot take efficiency= (pre-rollout filtering / max-variance down-sampling are GRPO-group "
            "techniques wired into the GRPO and PPO trainers only)"
        )
    config_kw, trainer_kw = split_trl_kwargs(algo, kwargs)
    config_fields = {f.name for f in dataclasses.fields(config_cls)}
    for key, value in _cpu_defaults().items():
        if key in config_fields:
            config_kw.setdefault(key, value)
    config_kw["output_dir"] = output_dir or config_kw.get("output_dir") or tempfile.mkdtemp(prefix=f"agenttune-{algo.value}-")
    peft = lora_config(lora)
    if peft is not None:
        trainer_kw.setdefault("peft_config", peft)
    if train_dataset is not None:
        trainer_kw["train_dataset"] = train_dataset

    rollout_func = None
    if tools is not None or rollout_engine is not None or environments:
        if algo in (Algorithm.DPO, Algorithm.BCO):
            raise ValueError(
                f"{algo.value} trains on offline rows; derive them from agentic rollouts with "
                f"agenttune_lib.rl.preference_pairs_from_rollouts / bco_rows_from_rollouts and pass train_dataset="
            )
        from agenttune_lib.rl.rollout import create_rollout_fn

        _require_training_engine(algo, rollout_engine, model, config_kw, given_args)
        rollout_func = create_rollout_fn(rollout_engine, tools=tools, sink=rollout_sink, environments=environments)

    if algo in (Algorithm.GRPO, Algorithm.PPO, Algorithm.RLOO):
        if reward_funcs is None:
            raise ValueError(f"{algo.value} needs reward_funcs= (callables or REWARD_REGISTRY names)")
        if algo is Algorithm.RLOO:
            from agenttune_lib.rl.rewards.combine import call_reward, resolve_reward

            funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]

            def checked(fn: Any) -> Any:
                """RLOO calls each reward itself: route it through call_reward so a raise names the reward and item."""
                fn = resolve_reward(fn)

                def reward(completions: Any, **kw: Any) -> list[float]:
                    return call_reward(fn, completions, **kw)

                reward.__name__ = getattr(fn, "__name__", type(fn).__name__)
                return reward

            trainer_kw["reward_funcs"] = [checked(f) for f in funcs]
            if reward_weights is not None:
                config_kw.setdefault("reward_weights", list(reward_weights))
        else:
            from agenttune_lib.rl.rewards.combine import combine_rewards

            trainer_kw["reward_funcs"] = combine_rewards(reward_funcs, reward_weights)
        if rollout_func is not None:
            trainer_kw["rollout_func"] = rollout_func
            if algo is not Algorithm.RLOO:
                os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        if algo is Algorithm.PPO and trainer_kw.get("value_model") is None:
            raise ValueError("ppo needs value_model= (a reward-free critic; build one with build_value_model(policy))")
        if algo is Algorithm.PPO:
            config_kw.setdefault("num_iterations", 4)  # several epochs per batch, so the ratio clip acts
            config_kw.setdefault("beta", 0.0)  # the KL to the reference is in PPO's reward, not TRL's loss
        eff = trainer_kw.get("efficiency")
        if eff is not None and algo is not Algorithm.RLOO:
            config_kw.setdefault("steps_per_generation", 1)
    elif algo is Algorithm.BCO:
        config_kw.setdefault("loss_type", "apo_zero_unpaired")  # no KL dataset; BCO uses its own running delta
    if train_dataset is None:
        raise ValueError(f"create_agentic_trainer({algo.value!r}) needs train_dataset=")
    try:
        if given_args is not None:  # a ready TRL config; explicit keywords override its fields
            explicit = {k: v for k, v in config_kw.items() if k not in _cpu_defaults() or k in kwargs}
            explicit["output_dir"] = output_dir or given_args.output_dir
            args = dataclasses.replace(given_args, **explicit)
        else:
            args = config_cls(**config_kw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"create_agentic_trainer({algo.value!r}): invalid {config_cls.__name__} settings: {exc}") from exc
    trainer = trainer_cls(model=model, args=args, **trainer_kw)
    if rollout_engine is not None and hasattr(rollout_engine, "require_policy_match"):
        rollout_engine.require_policy_match(trainer.accelerator.unwrap_model(trainer.model))  # LoraMismatch names both configs
    trainer.agenttune_algorithm = algo.value
    trainer.agenttune_rollout_func = rollout_func
    return trainer
