"""Pooled, confined worker processes for tool calls (the parent side of ``_sandbox_zygote``).

A ``SandboxWorker`` is one long-lived zygote process started with a scrubbed environment in a
private working directory. As root on Linux it confines itself once (no network: a fresh
network namespace; a read-only view of every filesystem but its working directory) and forks
each call into its own process group, under rlimits (address space, CPU time, file size, open
files, processes) and an unprivileged uid of its own — so a tool cannot signal the rollout
process, and everything it started is killed when the call returns or times out. Without root
(or where the kernel refuses namespaces) the worker still isolates the process, rlimits and
environment, and ``protections`` says what is missing. A call costs a fork, not an interpreter start.
"""
from __future__ import annotations

import atexit
import dataclasses
import itertools
import json
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["SandboxConfig", "SandboxWorker", "SandboxError", "acquire_worker", "release_worker", "shutdown_workers"]

_ZYGOTE = Path(__file__).with_name("_sandbox_zygote.py")
_UIDS = itertools.count()


class SandboxError(RuntimeError):
    """The sandbox worker could not start or stopped answering."""


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Limits of one isolated call; ``cpu_seconds`` defaults to the call's timeout rounded up, plus one."""

    memory_mb: int = 1024
    cpu_seconds: int | None = None
    file_size_mb: int = 64
    open_files: int = 256
    max_processes: int = 64
    shm_mb: int = 64
    network: bool = False
    #: Enter network and mount namespaces where the OS allows (False: process, rlimit and env isolation only).
    namespaces: bool = True
    env: tuple[tuple[str, str], ...] = ()
    preload: tuple[str, ...] = ("agenttune_lib.tools.base",)

    def __post_init__(self) -> None:
        for name in ("memory_mb", "file_size_mb", "open_files", "max_processes", "shm_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SandboxConfig.{name} must be a positive integer, got {value!r}")
        if self.cpu_seconds is not None and (not isinstance(self.cpu_seconds, int) or self.cpu_seconds < 1):
            raise ValueError(f"SandboxConfig.cpu_seconds must be a positive integer or None, got {self.cpu_seconds!r}")


def _scrubbed_env(workdir: str, extra: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """No inherited variables (tokens, keys, credentials): only what a Python process needs."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    env.update(dict(extra))
    return env


def _sandbox_uid() -> int:
    """An unprivileged uid no one else uses: one per worker, so 'every process of this uid' is exactly its own.

    Unique per (process id, worker number below 256), far above any login uid.
    """
    return 100_000 + ((os.getpid() & 0x3FFFFF) << 8) + next(_UIDS) % 256


class SandboxWorker:
    """One pooled zygote; ``call`` runs a pickled tool in a fresh confined process of it."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.owner = os.getpid()  # a forked child must neither use nor close its parent's workers
        self.uid = _sandbox_uid() if os.geteuid() == 0 else None
        self.workdir = tempfile.mkdtemp(prefix="agenttune-tool-")
        if self.uid is not None:
            os.chown(self.workdir, self.uid, self.uid)
        os.chmod(self.workdir, 0o700)
        self.protections: dict[str, Any] = {}
        self._proc: subprocess.Popen | None = None
        self._start()

    def _start(self) -> None:
        cfg = dataclasses.asdict(self.config)
        paths = [os.path.abspath(p) for p in sys.path if p]
        needed = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)), *paths]
        cfg.update(workdir=self.workdir, uid=self.uid, sys_path=paths, needed=needed)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, str(_ZYGOTE)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=_scrubbed_env(self.workdir, self.config.env),
                cwd=self.workdir,
                start_new_session=True,
                close_fds=True,
            )
            self._send(pickle.dumps(cfg))
            ready = self._recv(deadline=time.monotonic() + 60)
        except (OSError, SandboxError) as exc:
            self.close()
            raise SandboxError(f"could not start a sandbox worker: {exc}") from exc
        if ready.get("status") != "ready":
            self.close()
            raise SandboxError(f"sandbox worker answered {ready!r} instead of ready")
        self.protections = ready["protections"]

    @property
    def alive(self) -> bool:
        return self.owner == os.getpid() and self._proc is not None and self._proc.poll() is None

    def _send(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(struct.pack(">I", len(data)) + data)
        self._proc.stdin.flush()

    def _recv(self, deadline: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        head = self._read(fd, 4, deadline)
        return json.loads(self._read(fd, struct.unpack(">I", head)[0], deadline))

    @staticmethod
    def _read(fd: int, n: int, deadline: float) -> bytes:
        import select

        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError("sandbox worker stopped answering")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise SandboxError("sandbox worker exited")
            buf.extend(chunk)
        return bytes(buf)

    def call(self, blob: bytes, arguments: dict[str, Any], timeout: float, modules: tuple[str, ...] = ()) -> dict[str, Any]:
        """One tool call: ``{"status": "reply", "body": json}`` or a ``timeout`` / ``crash`` / ``error`` status.

        ``modules`` (the tool's own, which the caller has imported) are imported once by the
        worker, so a call does not re-import them.
        """
        if not self.alive:
            raise SandboxError("sandbox worker is not running")
        try:
            self._send(pickle.dumps((blob, arguments, float(timeout), tuple(modules))))
            return self._recv(deadline=time.monotonic() + timeout + 10.0)
        except (OSError, SandboxError):
            self.close()
            raise

    def close(self) -> None:
        """Stop the zygote and everything it started; remove the working directory."""
        if self.owner != os.getpid():
            return
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()  # type: ignore[union-attr]
                except Exception:
                    pass
            proc.wait(timeout=10)
        if self.uid is not None:
            _kill_uid(self.uid)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _kill_uid(uid: int) -> None:
    """Kill every process running as ``uid`` (the worker's own; used when the zygote itself is gone)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            os.kill(int(entry), signal.SIGKILL)
                        break
        except (OSError, ValueError):
            continue


_POOL: dict[SandboxConfig, list[SandboxWorker]] = {}
_POOL_LOCK = threading.Lock()


def acquire_worker(config: SandboxConfig) -> SandboxWorker:
    """A free pooled worker for ``config`` (started on first use)."""
    with _POOL_LOCK:
        idle = _POOL.setdefault(config, [])
        while idle:
            worker = idle.pop()
            if worker.alive:
                return worker
            worker.close()
    return SandboxWorker(config)


def release_worker(worker: SandboxWorker) -> None:
    """Return a worker to the pool (a dead one is closed instead)."""
    if not worker.alive:
        worker.close()
        return
    with _POOL_LOCK:
        _POOL.setdefault(worker.config, []).append(worker)


def shutdown_workers() -> None:
    """Close every pooled worker (also runs at interpreter exit)."""
    with _POOL_LOCK:
        workers = [w for ws in _POOL.values() for w in ws]
        _POOL.clear()
    for worker in workers:
        worker.close()


atexit.register(shutdown_workers)
