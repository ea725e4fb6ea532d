"""The served model: the base checkpoint plus whatever adapter the deployment pointer names, resolved per run.

Every consumer that means "the deployed model" (DECIDE model stages, the spine/teacher,
evaluation's deployed arm, the multi-agent graph) resolves it here, so a deploy or a
rollback switches what the next run serves without a restart, and each run can record
``served_adapter_id`` (the adapter id, or ``base:<name>`` when nothing is deployed).
"""
from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

__all__ = ["ServedModel", "resolve_served_model", "resolve_deployed_model", "deployed_pointer", "load_served", "POINTER", "base_adapter_id"]

#: The deployment pointer file ``AdapterDeployer`` replaces atomically under its root.
POINTER = "DEPLOYED.json"

_CACHE: dict[tuple[str, str | None], tuple[Any, Any]] = {}
_CACHE_LOCK = threading.Lock()


def base_adapter_id(base_path: str | Path) -> str:
    """The served id of a bare base checkpoint: ``base:<directory name>``."""
    return f"base:{Path(base_path).name}"


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """What serves now: the base checkpoint, the active PEFT adapter (None = bare base) and its id."""

    base_path: Path
    adapter_id: str | None
    adapter_path: Path | None
    decision_id: str | None = None
    deployed_at: str | None = None

    @property
    def served_adapter_id(self) -> str:
        """The id every run records: the adapter id, or ``base:<name>`` when no adapter is deployed."""
        return self.adapter_id or base_adapter_id(self.base_path)

    def load(self, cache: bool = True) -> tuple[Any, Any]:
        """(model, tokenizer): the base with the adapter applied, cached per (base, adapter) in this process."""
        key = (str(self.base_path.resolve()), str(self.adapter_path.resolve()) if self.adapter_path else None)
        with _CACHE_LOCK:
            if cache and key in _CACHE:
                return _CACHE[key]
            model, tokenizer = load_served(self.base_path, self.adapter_path)
            if cache:
                _CACHE[key] = (model, tokenizer)
            return model, tokenizer

    def decide_model(self, max_new_tokens: int | None = None, num_threads: int | None = 1) -> Any:
        """A DECIDE model backend (``TransformersModel``) over the served weights."""
        from agenttune_lib.decide.models import TransformersModel

        model, tokenizer = self.load()
        backend = TransformersModel(model=model, tokenizer=tokenizer, max_new_tokens=max_new_tokens, num_threads=num_threads)
        backend.served_adapter_id = self.served_adapter_id
        return backend

    def chat_generator(self, config: Any = None, **overrides: Any) -> Any:
        """A spine ``ChatGenerator`` (messages -> Generation) over the served weights."""
        from agenttune_lib.models.generate import ChatGenerator

        model, tokenizer = self.load()
        gen = ChatGenerator(model, tokenizer, config, **overrides)
        gen.served_adapter_id = self.served_adapter_id
        return gen

    def to_dict(self) -> dict[str, Any]:
        return {"base_path": str(self.base_path), "adapter_id": self.adapter_id, "adapter_path": str(self.adapter_path) if self.adapter_path else None,
                "served_adapter_id": self.served_adapter_id, "decision_id": self.decision_id, "deployed_at": self.deployed_at}


def load_served(base_path: str | Path, adapter_path: str | Path | None) -> tuple[Any, Any]:
    """Load a base checkpoint (fp32, as ``load_base_model``) and, when given, a PEFT adapter on it (eval mode)."""
    from agenttune_lib.models.base import load_base_model

    base = Path(base_path)
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"served base checkpoint {str(base)!r} is not a checkpoint directory (no config.json)")
    model, tokenizer = load_base_model(base)
    if adapter_path is not None:
        if not (Path(adapter_path) / "adapter_config.json").exists():
            raise FileNotFoundError(f"served adapter {str(adapter_path)!r} is not a PEFT adapter directory (no adapter_config.json)")
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_path))
    model.eval()
    return model, tokenizer


def resolve_served_model(deploy_root: str | Path | None, base_path: str | Path) -> ServedModel:
    """Read the deployment pointer under ``deploy_root`` now: base + active adapter, or the bare base when none.

    A pointer naming an adapter directory that is gone is an error (serving silently the
    base model would misattribute every decision).
    """
    data = deployed_pointer(deploy_root)
    if data is None:
        return ServedModel(Path(base_path), None, None)
    return ServedModel(Path(base_path), str(data["adapter_id"]), Path(data["path"]), data.get("decision_id"), data.get("deployed_at"))


def deployed_pointer(deploy_root: str | Path | None) -> dict[str, Any] | None:
    """The checked contents of ``DEPLOYED.json`` under ``deploy_root``; None when nothing is deployed.

    Unreadable JSON, a pointer without ``adapter_id``/``path``, or one naming a directory that is not a PEFT
    adapter are errors naming the pointer file and the adapter.
    """
    pointer = Path(deploy_root) / POINTER if deploy_root else None
    if pointer is None or not pointer.exists():
        return None
    try:
        data = json.loads(pointer.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"deployment pointer {pointer} is not JSON ({exc})") from None
    if not isinstance(data, dict) or not data.get("adapter_id") or not data.get("path"):
        raise ValueError(f"deployment pointer {pointer} names no adapter_id/path: {data}")
    if not (Path(data["path"]) / "adapter_config.json").exists():
        raise FileNotFoundError(f"deployment pointer {pointer} names adapter {data['adapter_id']!r} at {data['path']}, "
                                "which is not a PEFT adapter directory (deleted or moved?)")
    return data


def resolve_deployed_model(deploy_root: str | Path | None = None, base_path: str | Path | None = None, models_dir: str | Path | None = None) -> ServedModel:
    """The platform's deployed model now: ``base_path`` (default: the packaged base model under ``models_dir``) plus the
    adapter the pointer under ``deploy_root`` (default ``$AGENTTUNE_HOME/models/deployed``) names."""
    from agenttune_lib.config import PlatformPaths

    models = Path(models_dir) if models_dir else PlatformPaths.from_env().models
    if base_path is None:
        from agenttune_lib.models.base import ensure_base_model

        base_path = ensure_base_model(models).path
    return resolve_served_model(deploy_root if deploy_root is not None else models / "deployed", base_path)
