"""LoRA settings shared by the trainer and its rollout engines, and the check that both adapt the same weights.

A rollout engine that holds its own policy copy (Ray actors) samples on-policy only when its adapter is
the trainer's: same targets, rank, alpha and layers. PEFT loads a pushed state dict without complaint when
the keys differ, so the check compares the configs and the adapter's parameter names and shapes.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["lora_config", "lora_signature", "adapter_shapes", "require_same_lora", "require_same_adapter_keys", "LoraMismatch"]

#: LoraConfig fields that change what the adapted model computes at sampling time (dropout is off in eval);
#: which modules and layers carry LoRA is read from the model itself, where PEFT resolved the targets.
SIGNATURE_FIELDS = ("r", "lora_alpha", "rank_pattern", "alpha_pattern", "use_rslora", "use_dora", "bias", "modules_to_save")
_LAYER = re.compile(r"\.(?:layers|h|blocks|layer)\.(\d+)\.")


class LoraMismatch(ValueError):
    """The rollout engine's adapter differs from the trainer's: its samples would come from another policy."""


def lora_config(lora: Any = True) -> Any:
    """A PEFT LoraConfig from True (defaults), a dict of LoraConfig fields, or a LoraConfig; None for False."""
    if lora is None or lora is False:
        return None
    from peft import LoraConfig, PeftConfig

    if isinstance(lora, PeftConfig):
        return lora
    fields = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear", "task_type": "CAUSAL_LM"}
    if isinstance(lora, Mapping):
        fields.update(lora)
    elif lora is not True:
        raise TypeError(f"lora must be True/False, a dict of LoraConfig fields or a LoraConfig, got {type(lora).__name__}")
    return LoraConfig(**fields)


def _plain(value: Any) -> Any:
    if isinstance(value, (set, frozenset, list, tuple)):
        items = [_plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return value


def lora_signature(model: Any) -> dict[str, Any] | None:
    """The active adapter's forward-relevant LoRA settings of a PEFT model (targets resolved by PEFT); None without LoRA."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    name = getattr(model, "active_adapter", None) or "default"
    name = name[0] if isinstance(name, (list, tuple)) else name
    cfg = configs.get(name) or next(iter(configs.values()))
    from peft.tuners.lora import LoraLayer

    adapted = [n for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    out = {f: _plain(getattr(cfg, f, None)) for f in SIGNATURE_FIELDS}
    out["target_modules"] = sorted({n.rsplit(".", 1)[-1] for n in adapted})
    out["layers"] = sorted({int(m.group(1)) for n in adapted if (m := _LAYER.search(n + "."))})
    out["adapted_modules"] = len(adapted)
    return out


def adapter_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """{adapter parameter name: shape} as ``get_peft_model_state_dict`` names them (the keys a weight push carries)."""
    if not getattr(model, "peft_config", None):
        return {}
    from peft import get_peft_model_state_dict

    return {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}


def require_same_lora(trainer: dict[str, Any] | None, engine: dict[str, Any] | None, engine_name: str = "rollout engine") -> None:
    """Raise LoraMismatch naming both configs when the engine's adapter settings differ from the trainer's."""
    if trainer == engine:
        return
    if trainer is None or engine is None:
        which = "the trainer has no LoRA adapter" if trainer is None else f"the {engine_name} has no LoRA adapter"
        raise LoraMismatch(
            f"{engine_name} LoRA config differs from the trainer's ({which}): trainer lora={trainer}, {engine_name} lora={engine}. "
            "Weight pushes carry LoRA weights only, so both sides need the same adapter; build the engine with the trainer's lora="
        )
    diff = sorted(k for k in set(trainer) | set(engine) if trainer.get(k) != engine.get(k))
    raise LoraMismatch(
        f"{engine_name} LoRA config differs from the trainer's in {diff}: trainer lora={trainer}, {engine_name} lora={engine}. "
        "Its rollouts would be sampled by a different policy than the one trained (off-policy without correction); "
        "build the engine with the same lora= as the trainer"
    )


def require_same_adapter_keys(expected: Mapping[str, tuple[int, ...]], pushed: Mapping[str, Any], where: str = "rollout engine") -> None:
    """Raise LoraMismatch when a pushed adapter state does not cover exactly the engine's adapter parameters and shapes."""
    got = {k: tuple(getattr(v, "shape", ())) for k, v in pushed.items()}
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    shapes = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    if missing or extra or shapes:
        raise LoraMismatch(
            f"{where}: the pushed LoRA weights do not match its adapter ({len(missing)} of its {len(expected)} parameters missing, "
            f"{len(extra)} unknown, {len(shapes)} of another shape; e.g. missing {missing[:2]}, unknown {extra[:2]}, shape {shapes[:2]}); "
            "PEFT would load the overlap silently and sample from a policy the trainer is not training"
        )
