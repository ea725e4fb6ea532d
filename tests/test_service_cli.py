"""`agenttune serve` as a command: it says at start whether auth is on and what it serves, answers on loopback,
and refuses a non-loopback bind without a key (exit 2, naming the fix)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from _service_helpers import free_port


def _cmd(*args):
    return [sys.executable, "-c", "from agenttune_assets.cli import main; main()", "serve", *args]


def test_serve_command_starts_says_auth_is_off_and_answers(tmp_path, platform_home):
    from agenttune_lib.models.tiny import save_tiny_model

    base = save_tiny_model(tmp_path / "tiny")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("AGENTTUNE_API_KEY", None)
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(_cmd("--base-checkpoint", str(base), "--port", str(port)), stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
                break
            except httpx.HTTPError:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.5)
        assert health["served_adapter_id"] == "base:tiny" and health["auth"] is False
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "deployed", "max_tokens": 3,
                                                                             "messages": [{"role": "user", "content": "hi"}]}, timeout=120)
        assert r.status_code == 200 and r.json()["model"] == "base:tiny" and r.headers["x-agenttune-adapter"] == "base:tiny"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    out = (tmp_path / "serve.log").read_text()
    assert f"agenttune serve: http://127.0.0.1:{port}/v1" in out
    assert "auth: NO API key: auth is off because the service is bound to loopback (127.0.0.1) only" in out
    assert "serving base:tiny now" in out


def test_serve_command_refuses_a_public_bind_without_a_key(tmp_path, platform_home):
    from agenttune_lib.models.tiny import save_tiny_model

    base = save_tiny_model(tmp_path / "tiny")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("AGENTTUNE_API_KEY", None)
    done = subprocess.run(_cmd("--base-checkpoint", str(base), "--host", "0.0.0.0", "--port", str(free_port())),
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 2
    assert "error: binding 0.0.0.0 (not loopback) needs an API key: set --api-key or AGENTTUNE_API_KEY" in done.stderr
