"""Hostile and ordinary tools for the sandbox tests (module level, so a sandbox worker can import them)."""
from __future__ import annotations


def fork_bomb() -> str:
    """Fork forever."""
    import os

    while True:
        try:
            os.fork()
        except OSError:
            pass


def orphan_then_hang() -> str:
    """Start a detached child in its own session, then hang past the timeout."""
    import subprocess
    import time

    subprocess.Popen(["sleep", "1000"], start_new_session=True)
    time.sleep(1000)
    return "never"


def orphan_and_return() -> int:
    """Leave a detached child behind and return its pid."""
    import subprocess

    return subprocess.Popen(["sleep", "1000"], start_new_session=True).pid


def allocate(gb: float) -> int:
    """Allocate and touch ``gb`` gigabytes."""
    block = bytearray(int(gb * 1024**3))
    return len(block)


def write_file(path: str) -> str:
    """Write a file at ``path`` (relative paths land in the tool's working directory)."""
    import os

    with open(path, "w") as fh:
        fh.write("escaped")
    return os.path.abspath(path)


def read_secrets(name: str, rollout_pid: int) -> dict:
    """Everything a tool could learn of an environment secret."""
    import os

    found = {"env": os.environ.get(name), "cwd": os.getcwd(), "home": os.environ.get("HOME")}
    for label, pid in (("parent", os.getppid()), ("rollout", rollout_pid)):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                found[label] = name in fh.read().decode("utf-8", "replace")
        except OSError as exc:
            found[label] = f"denied: {type(exc).__name__}"
    return found


def kill_parent(rollout_pid: int) -> dict:
    """SIGKILL its parent process and the rollout process."""
    import os
    import signal

    out = {}
    for label, pid in (("parent", os.getppid()), ("rollout", rollout_pid)):
        try:
            os.kill(pid, signal.SIGKILL)
            out[label] = "killed"
        except OSError as exc:
            out[label] = type(exc).__name__
    return out


def connect(port: int) -> str:
    """Open a TCP connection to 127.0.0.1:port."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=3):
        return "connected"


def sleep_forever() -> str:
    """Never return."""
    import time

    while True:
        time.sleep(3600)


def complain_then_hang(text: str) -> str:
    """Write ``text`` to stderr, then never return."""
    import sys
    import time

    print(text, file=sys.stderr, flush=True)
    while True:
        time.sleep(1)


def _square(x: int) -> int:
    return x * x


def pool_squares(n: int) -> list:
    """Square 0..n-1 with a multiprocessing pool."""
    import multiprocessing

    with multiprocessing.Pool(2) as pool:
        return pool.map(_square, range(n))


def echo(x: int) -> int:
    """Return x."""
    return x


def spawn_pool_squares(n: int) -> list:
    """Square 0..n-1 with a spawn-context multiprocessing pool (a fresh interpreter per worker)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(2) as pool:
        return pool.map(_square, range(n))


def signal_state() -> dict:
    """The tool process's SIGTERM and SIGHUP dispositions and its blocked signals."""
    import signal

    return {"SIGTERM": int(signal.getsignal(signal.SIGTERM)), "SIGHUP": int(signal.getsignal(signal.SIGHUP)),
            "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))}


def read_text(path: str) -> str:
    """Read a text file (a host path is visible only when bound through ``SandboxConfig.ro_paths``)."""
    with open(path) as fh:
        return fh.read()
