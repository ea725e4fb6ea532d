"""The service's settings: where the model, the deployment pointer and the warehouse are, and the request limits."""
from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

__all__ = ["ServiceConfig", "is_loopback"]


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost`` (the only binds allowed without an API key)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Everything ``agenttune serve`` needs; ``api_key`` None means no auth (allowed on loopback only)."""

    base_path: Path
    deploy_root: Path
    warehouse_path: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    engine: str = "transformers"
    review_dir: Path | None = None
    audit_path: Path | None = None
    #: Request limits: body bytes, messages, tokens asked for, prompt tokens.
    max_body_bytes: int = 1 << 20
    max_messages: int = 256
    max_completion_tokens: int = 512
    default_max_tokens: int = 128
    max_prompt_tokens: int = 4096
    #: Batching: up to ``max_batch`` concurrent requests for one model share a forward pass; the engine waits at most
    #: ``batch_wait_s`` for more to arrive once one is queued.
    max_batch: int = 16
    batch_wait_s: float = 0.01
    num_threads: int | None = None
    #: Redact PII (Presidio) from what is stored; off only for tests that measure the engine itself.
    redact: bool = True
    #: Traffic is written to the warehouse in batches (one DuckDB transaction per flush) by a background thread.
    flush_every_s: float = 0.2

    def __post_init__(self) -> None:
        if self.engine not in ("transformers", "vllm"):
            raise ValueError(f"engine must be 'transformers' or 'vllm', got {self.engine!r}")
        if not (0 < self.port < 65536):
            raise ValueError(f"port must be 1..65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key is empty; pass a key or none (loopback only)")
        if self.api_key is None and not is_loopback(self.host):
            raise ValueError(f"binding {self.host} (not loopback) needs an API key: set --api-key or AGENTTUNE_API_KEY")
        for name in ("max_body_bytes", "max_messages", "max_completion_tokens", "default_max_tokens", "max_prompt_tokens", "max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.default_max_tokens > self.max_completion_tokens:
            raise ValueError(f"default_max_tokens={self.default_max_tokens} exceeds max_completion_tokens={self.max_completion_tokens}")

    @property
    def auth_enabled(self) -> bool:
        return self.api_key is not None
