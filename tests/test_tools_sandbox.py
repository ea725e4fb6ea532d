"""Ordinary work still runs in the sandbox (multiprocessing, timeouts, per-call cost), and its options are validated.

The hostile side (each escape, as root and unprivileged) is ``tests/test_sandbox_attacks.py``.
"""
from __future__ import annotations

import json
import socket
import time

import pytest

import _sandbox_tools as tools
from agenttune_lib.tools.isolation import IsolatedTool
from agenttune_lib.tools.sandbox import SandboxConfig


def _available() -> bool:
    result = IsolatedTool(tools.echo, timeout=20).invoke({"x": 0})
    if result.error is not None:
        assert result.error["type"] == "sandbox_unavailable", result.error
        return False
    return True


AVAILABLE = _available()


def _ok_or_refused(result, check) -> None:
    """Where the sandbox can be built the call must succeed as ``check`` says; elsewhere it must be refused."""
    if AVAILABLE:
        if not result.ok:  # the whole error (processes left, stderr tail), not pytest's shortened repr
            pytest.fail(json.dumps(result.error, indent=1))
        check(result)
    else:
        assert result.error["type"] == "sandbox_unavailable" and result.metadata["isolation"] == "refused"


def test_sleeping_forever_times_out_and_the_next_call_is_served():
    start = time.monotonic()
    result = IsolatedTool(tools.sleep_forever, timeout=1).invoke({})
    if AVAILABLE:
        assert result.error["type"] == "timeout" and time.monotonic() - start < 5
    _ok_or_refused(IsolatedTool(tools.echo, timeout=10).invoke({"x": 5}), lambda r: r.value == 5 or pytest.fail(r.value))


def test_a_timeout_names_what_the_tool_last_wrote_to_stderr():
    result = IsolatedTool(tools.complain_then_hang, timeout=2).invoke({"text": "worker 3 stuck on its lock"})
    if AVAILABLE:
        assert result.error["type"] == "timeout"
        assert result.error["message"].endswith("its sandbox was killed; its stderr ended: worker 3 stuck on its lock")
        # what was still running when it was killed: the tool's process, sleeping, named by its command line
        assert any(line.startswith("S ") and "python" in line for line in result.error["processes"]), result.error


def test_a_tool_using_multiprocessing_works_isolated():
    def squares(n):
        return lambda r: (r.value == [i * i for i in range(n)]) or pytest.fail(str(r.value))

    _ok_or_refused(IsolatedTool(tools.pool_squares, timeout=60).invoke({"n": 5}), squares(5))
    _ok_or_refused(IsolatedTool(tools.spawn_pool_squares, timeout=120).invoke({"n": 4}), squares(4))


def test_a_caller_that_ignores_sigterm_does_not_hang_a_pool_in_the_sandbox():
    """Ignored signals and the blocked mask survive exec; the sandboxed tool starts with defaults, so a Pool's
    terminate() ends its workers (with SIGTERM ignored by the caller a spawn pool hung until the call's timeout)."""
    import signal

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN), signal.signal(signal.SIGHUP, signal.SIG_IGN)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    try:
        start = time.monotonic()
        _ok_or_refused(IsolatedTool(tools.spawn_pool_squares, timeout=30).invoke({"n": 4}),
                       lambda r: (r.value == [0, 1, 4, 9]) or pytest.fail(str(r.value)))
        assert time.monotonic() - start < 25
        _ok_or_refused(IsolatedTool(tools.signal_state, timeout=20).invoke({}),
                       lambda r: (r.value == {"SIGTERM": int(signal.SIG_DFL), "SIGHUP": int(signal.SIG_DFL), "blocked": []})
                       or pytest.fail(str(r.value)))
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGHUP, previous[1])
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def test_network_is_only_there_when_the_caller_opts_in_and_that_is_recorded():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        blocked = IsolatedTool(tools.connect, timeout=10).invoke({"port": port})
        assert blocked.error is not None and blocked.value is None
        allowed = IsolatedTool(tools.connect, timeout=10, sandbox=SandboxConfig(network=True)).invoke({"port": port})

        def shared(r):
            assert r.value == "connected" and r.metadata["sandbox"]["network"] == "host"
            assert r.metadata["sandbox"]["lowered"] == ["network namespace (host network shared)"]
            assert "net namespace" not in r.metadata["sandbox"]["verified"] and "pid namespace" in r.metadata["sandbox"]["verified"]

        _ok_or_refused(allowed, shared)
    finally:
        server.close()


def test_a_host_directory_is_visible_only_when_bound_read_only(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)  # readable by the sandbox's unprivileged uid
    (data / "note.txt").write_text("hello")
    target = str(data / "note.txt")
    hidden = IsolatedTool(tools.read_text, timeout=10).invoke({"path": target})
    if AVAILABLE:
        assert hidden.error["exception"] == "FileNotFoundError"
    bound = IsolatedTool(tools.read_text, timeout=10, sandbox=SandboxConfig(ro_paths=(str(data),))).invoke({"path": target})
    _ok_or_refused(bound, lambda r: r.value == "hello" or pytest.fail(str(r.value)))
    if AVAILABLE:
        writer = IsolatedTool(tools.write_file, timeout=10, sandbox=SandboxConfig(ro_paths=(str(data),))).invoke({"path": str(data / "x.txt")})
        assert writer.error["exception"] == "OSError" and "Read-only file system" in writer.error["message"]
        assert not (data / "x.txt").exists()


def test_a_call_costs_a_sandbox_start_not_seconds():
    tool = IsolatedTool(tools.echo, timeout=10)
    times = []
    for i in range(5):
        start = time.perf_counter()
        result = tool.invoke({"x": i})
        times.append(time.perf_counter() - start)
        _ok_or_refused(result, lambda r, i=i: r.value == i or pytest.fail(str(r.value)))
    times.sort()
    # A fresh bubblewrap sandbox and interpreter per call: ~0.1-0.3 s on a busy 2-core machine.
    assert times[len(times) // 2] < 1.5, times


def test_sandbox_config_rejects_bad_limits():
    with pytest.raises(ValueError, match="memory_mb must be a positive integer"):
        SandboxConfig(memory_mb=0)
    with pytest.raises(ValueError, match="cpu_seconds must be a positive integer or None"):
        SandboxConfig(cpu_seconds=0)


def test_isolated_tool_rejects_nan_or_nonpositive_timeouts():
    for bad in (float("nan"), float("inf"), 0, -1):
        with pytest.raises(ValueError, match="timeout must be a positive finite number"):
            IsolatedTool(tools.echo, timeout=bad)
