"""The service on loopback for tests: a real uvicorn server in a thread over a tiny model, and tiny LoRA adapters."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_adapter(base: Path, out: Path, seed: int = 1) -> Path:
    """A LoRA adapter with random (non-zero) weights on the tiny base: its replies differ from the base's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(out)
    return out


def approve(candidate: str):
    from agenttune_lib.closed_loop.gate import GateDecision

    return GateDecision("d-" + candidate, True, candidate, None, None, {}, [], "2026-01-01T00:00:00+00:00")


@contextlib.contextmanager
def running_service(config, **app_kwargs):
    """(base URL, app) of ``agenttune serve``'s app under uvicorn on ``config.port``; stopped (and flushed) on exit."""
    from agenttune_lib.service.app import create_app
    from agenttune_lib.service.server import build_server

    app = create_app(config, **app_kwargs)
    server = build_server(config, app)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://{config.host}:{config.port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=60)
