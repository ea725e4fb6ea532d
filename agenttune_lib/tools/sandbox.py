"""One bubblewrap sandbox per tool call, at a stated level, failing closed (the parent side of ``_sandbox_runner``).

Why bubblewrap: it is the Debian-packaged, audited setup code behind Flatpak; it builds user, PID,
IPC, mount, network and UTS namespaces, a fresh root of only what is bound, and loads a seccomp
BPF program, without our own mount code. Levels (``SandboxConfig.level``):

* ``strict`` (default): all namespaces, an unprivileged uid (root callers run bwrap as a fresh uid),
  read-only ``/usr``, ``/etc`` and import paths, private tmpfs work dir, ``/tmp`` and ``/dev/shm``,
  no host ``/run``, ``/var``, ``/home``, ``/proc``, no capabilities, no_new_privs, rlimits, and the
  seccomp filter of ``seccomp_policy`` (no sockets but ``AF_UNIX``, no ``ptrace``...).
* ``no-seccomp``: the same without the seccomp filter (the sandbox's own loopback works; the host's does not).
* ``rlimits-only``: no bubblewrap: a child with a scrubbed environment, its own session and rlimits,
  but the caller's uid, filesystem and network.

A call runs only after the runner inside has verified the level's protections; anything missing
(bwrap absent, namespaces refused, seccomp unbuildable) is a ``SandboxUnavailable`` naming it. The
sandbox's process group is SIGKILLed at the end of every call, and its PID namespace dies with it.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pickle
import select
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agenttune_lib.tools.seccomp_policy import SeccompUnavailable, compile_filter

__all__ = ["LEVELS", "SandboxConfig", "SandboxError", "SandboxUnavailable", "run_in_sandbox", "bwrap_path", "WORKDIR"]

LEVELS = ("strict", "no-seccomp", "rlimits-only")
#: What each level promises (recorded per call); a lower level lacks the ones of ``strict`` it does not list.
LEVEL_PROTECTIONS: dict[str, tuple[str, ...]] = {
    "strict": ("user namespace", "pid namespace", "ipc namespace", "mount namespace", "network namespace", "uts namespace",
               "unprivileged uid", "no capabilities", "no_new_privs", "read-only filesystem", "private tmpfs work dir and /tmp",
               "no host sockets", "seccomp filter", "rlimits", "own session", "killed at end of call"),
}
LEVEL_PROTECTIONS["no-seccomp"] = tuple(p for p in LEVEL_PROTECTIONS["strict"] if p != "seccomp filter")
LEVEL_PROTECTIONS["rlimits-only"] = ("rlimits", "own session", "scrubbed environment", "killed at end of call (process group only)")
WORKDIR = "/sandbox"
_RUNNER = Path(__file__).with_name("_sandbox_runner.py")
#: The directory holding the ``agenttune_lib`` package (an editable install reaches it through a finder, not sys.path).
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
#: Isolated mode, and no ``site``: the parent's import path is handed over whole, so .pth processing (most of an
#: interpreter start in this venv) is skipped.
_PY_FLAGS = ("-I", "-S")
_MAX_REPLY = 16 * 1024 * 1024
#: How much of the sandbox's stderr (bubblewrap's, then the tool's) is kept for error messages.
_STDERR_KEEP = 4096
_SETUP_SECONDS = 60.0
_INSIDE_UID = 65534
_UIDS = itertools.count()
#: Directories never bound whole, even when on sys.path: they hold host sockets and other users' files.
_NEVER_BOUND = frozenset({"/", "/tmp", "/var", "/var/tmp", "/run", "/var/run", "/home", "/root", "/mnt", "/media", "/srv", "/opt"})


class SandboxError(RuntimeError):
    """The sandbox started but the call could not complete (it died or answered garbage)."""


class SandboxUnavailable(RuntimeError):
    """The requested level's protections cannot be had here; ``missing`` names them."""

    def __init__(self, level: str, missing: list[str], hint: str = "") -> None:
        self.level = level
        self.missing = list(missing)
        lower = [lv for lv in LEVELS[LEVELS.index(level) + 1 :]] if level in LEVELS else []
        advice = f"; choose a lower level explicitly (SandboxConfig(level={lower[0]!r})) to run anyway" if lower else ""
        super().__init__(f"sandbox level {level!r} unavailable: missing {'; '.join(missing)}{hint}{advice}")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Level and limits of one isolated call; ``cpu_seconds`` defaults to the call's timeout rounded up, plus one."""

    level: str = "strict"
    memory_mb: int = 1024
    cpu_seconds: int | None = None
    file_size_mb: int = 64
    open_files: int = 256
    max_processes: int = 64
    #: Size of each private tmpfs (work dir, /tmp, /dev/shm).
    tmpfs_mb: int = 256
    #: Share the host's network (and allow every socket family): a lowered protection, recorded per call.
    network: bool = False
    env: tuple[tuple[str, str], ...] = ()
    #: Extra host paths bound read-only (beyond /usr, /etc, the interpreter and sys.path).
    ro_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"SandboxConfig.level must be one of {LEVELS}, got {self.level!r}")
        for name in ("memory_mb", "file_size_mb", "open_files", "max_processes", "tmpfs_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SandboxConfig.{name} must be a positive integer, got {value!r}")
        if self.cpu_seconds is not None and (isinstance(self.cpu_seconds, bool) or not isinstance(self.cpu_seconds, int) or self.cpu_seconds < 1):
            raise ValueError(f"SandboxConfig.cpu_seconds must be a positive integer or None, got {self.cpu_seconds!r}")

    def lowered(self) -> list[str]:
        """Protections of ``strict`` this config does without (empty for the default)."""
        gone = [p for p in LEVEL_PROTECTIONS["strict"] if p not in LEVEL_PROTECTIONS[self.level]]
        if self.network and self.level != "rlimits-only":
            gone.append("network namespace (host network shared)")
        return gone


def bwrap_path() -> str | None:
    """The bubblewrap binary, or None."""
    return shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")


def _scrubbed_env(cfg: SandboxConfig, home: str) -> dict[str, str]:
    """No inherited variables (tokens, keys, credentials): only what a Python process needs."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": "/tmp" if cfg.level != "rlimits-only" else home,
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    env.update(dict(cfg.env))
    return env


_CALLS = itertools.count()


def call_tag() -> str:
    """A per-call argument on the runner's command line, so the host can tell whose sandbox a process is (``agenttune-call-PID-N``)."""
    return f"agenttune-call-{os.getpid()}-{next(_CALLS)}"


def _fresh_uid() -> int:
    """An unprivileged host uid no one else uses, one per call: far above any login uid."""
    return 200_000 + ((os.getpid() & 0x3FFFF) << 12) + next(_UIDS) % 4096


def _import_path() -> list[str]:
    """The runner's sys.path: the parent's, then the package root."""
    path = [os.path.abspath(p) for p in sys.path if p]
    return path + ([_PACKAGE_ROOT] if _PACKAGE_ROOT not in path else [])


def _needed_paths(cfg: SandboxConfig) -> list[str]:
    """Host paths the runner and the tool's imports need, outermost only, outside /usr and /etc."""
    wanted = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), str(_RUNNER.parent), *cfg.ro_paths]
    wanted += _import_path()
    real = set()
    for path in wanted:
        path = os.path.realpath(os.path.abspath(path))
        if os.path.exists(path) and path not in _NEVER_BOUND and not path.startswith(("/usr/", "/etc/", "/proc", "/dev", "/sys")):
            real.add(path if os.path.isdir(path) else os.path.dirname(path))
    out = sorted(real)
    return [p for p in out if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in out)]


def _host_namespaces() -> dict[str, str]:
    return {name: os.readlink(f"/proc/self/ns/{name}") for name in ("user", "pid", "ipc", "mnt", "net", "uts")}


def _closed(path: str) -> bool:
    """A directory others cannot enter (no o+x)."""
    return os.path.isdir(path) and not os.stat(path).st_mode & 0o001


def _closed_ancestor(path: str) -> str | None:
    """The topmost directory above ``path`` that others cannot enter (e.g. ``/root``), or None."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        ancestor = "/" + "/".join(parts[:i])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def _opened_entries(paths: list[str]) -> dict[str, list[str]]:
    """Per needed directory that others cannot enter itself (a clone under ``mktemp -d``, mode 0700), its entries:
    ``_as_uid`` binds them into a tmpfs over it, so each is a mount point of its own inside the sandbox."""
    return {p: [os.path.join(p, e) for e in sorted(os.listdir(p))] for p in paths if _closed(p)}


def _as_uid(uid: int, paths: list[str], argv: list[str]) -> list[str]:
    """Run ``argv`` as ``uid`` (root callers): util-linux ``unshare``/``mount``/``setpriv`` in a private mount namespace.

    The interpreter may sit under a directory the sandbox uid cannot enter (``/root``): there, that
    directory is covered by an empty tmpfs holding only the needed paths, so bwrap (as ``uid``) can
    bind them and nothing else of it is visible. The host's mounts are untouched.
    """
    plan: dict[str, list[str]] = {}
    opened = _opened_entries(paths)
    for path in paths:
        closed = _closed_ancestor(path)
        inner = opened.get(path)  # a closed needed directory is opened the same way, its entries bound back in
        if closed is not None or inner:
            plan.setdefault(closed or path, []).extend(inner or [path])
    lines = ["set -eu"]
    if plan:
        lines += ['stage=$(mktemp -d)', 'mount -t tmpfs -o mode=0700 tmpfs "$stage"']
        n = 0
        for closed, inner in plan.items():
            for path in inner:
                make = "mkdir" if os.path.isdir(path) else "touch"  # a bind mount point is a directory or a file
                lines += [f'{make} "$stage/{n}"', f'mount --rbind {shlex.quote(path)} "$stage/{n}"']
                n += 1
            lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(closed)}")
        n = 0
        for closed, inner in plan.items():
            for path in inner:
                make = (f"mkdir -p {shlex.quote(path)}" if os.path.isdir(path)
                        else f"mkdir -p {shlex.quote(os.path.dirname(path))}; touch {shlex.quote(path)}")
                lines += [make, f'mount --move "$stage/{n}" {shlex.quote(path)}']
                n += 1
        lines += ['umount "$stage"', 'rmdir "$stage"']
    lines.append(f'exec setpriv --reuid={uid} --regid={uid} --clear-groups -- "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", "\n".join(lines), "sh", *argv]


def _bwrap_argv(bwrap: str, cfg: SandboxConfig, paths: list[str], seccomp_fd: int | None) -> tuple[list[str], list[str]]:
    """(argv, mount points the runner must find) for one call."""
    size = str(cfg.tmpfs_mb * 1024 * 1024)
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--uid", str(_INSIDE_UID), "--gid", str(_INSIDE_UID), "--hostname", "sandbox",
            "--disable-userns", "--die-with-parent", "--new-session", "--clearenv"]
    if not cfg.network:
        argv.append("--unshare-net")
    mounts = ["/", "/usr", "/etc"]
    argv += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = f"/{link}"
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            argv += ["--ro-bind", host, host]
            mounts.append(host)
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for point in ("/tmp", "/dev/shm", WORKDIR):
        argv += ["--perms", "1777" if point != WORKDIR else "0700", "--size", size, "--tmpfs", point]
    for path in paths:
        argv += ["--ro-bind", path, path]
        mounts.append(path)
    argv += ["--chdir", WORKDIR, "--remount-ro", "/"]
    for key, value in _scrubbed_env(cfg, WORKDIR).items():
        argv += ["--setenv", key, value]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--", sys.executable, *_PY_FLAGS, str(_RUNNER), call_tag()]
    return argv, mounts


def _privileged_descendants(pid: int) -> list[int]:
    """Host pids under ``pid`` whose real, effective, saved or filesystem uid is 0 (seen from the host)."""
    bad, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/status") as fh:
                uids = next(line for line in fh if line.startswith("Uid:")).split()[1:]
            with open(f"/proc/{current}/task/{current}/children") as fh:
                todo += [int(c) for c in fh.read().split()]
        except (OSError, StopIteration):
            continue
        if "0" in uids:
            bad.append(current)
    return bad


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(c) for c in fh.read().split()]
    except OSError:
        return []


def _process_snapshot(pid: int, limit: int = 12) -> list[str]:
    """``pid``'s descendants as "state wait-channel command" lines (read from /proc before a timeout kills them),
    so a hung tool's error says which of its processes were waiting on what."""
    out, queue = [], _children(pid)
    while queue and len(out) < limit:
        child = queue.pop(0)
        queue += _children(child)
        try:
            with open(f"/proc/{child}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{child}/wchan") as fh:
                wchan = fh.read().strip() or "-"
            with open(f"/proc/{child}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:80]
        except OSError:
            continue
        out.append(f"{state} {wchan} {cmd}")
    return out


def _gone(pid: int) -> bool:
    """Exited (a zombie counts: its PID namespace, if it was the init, is already empty)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _kill(proc: subprocess.Popen, inits: list[int] | None = None, wait_s: float = 5.0) -> None:
    """SIGKILL the whole process group, then wait until each PID namespace init in ``inits`` has exited.

    bubblewrap's init dies with it (``--die-with-parent``), and the kernel kills and reaps every
    process of its PID namespace before that init finishes exiting — so once it is gone, nothing
    the tool started (``setsid`` daemons, fork bombs) is left.
    """
    inits = list(inits or []) + [c for c in _children(proc.pid) if c not in (inits or [])]
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in inits:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()
    deadline = time.monotonic() + wait_s
    while any(not _gone(pid) for pid in inits) and time.monotonic() < deadline:
        time.sleep(0.005)


class _Frames:
    """Length-prefixed frames from the sandbox's stdout, buffered across frames; its stderr is drained alongside
    (so a chatty tool never blocks on a full pipe) and its last ``_STDERR_KEEP`` bytes kept for error messages."""

    def __init__(self, fd: int, err_fd: int | None = None) -> None:
        self.fd, self.err_fd = fd, err_fd
        self.buf, self.err = bytearray(), bytearray()

    def next(self, deadline: float) -> bytes | None:
        """One frame, or None on timeout; raises SandboxError on EOF or an oversized frame."""
        while True:
            if len(self.buf) >= 4:
                need = struct.unpack(">I", bytes(self.buf[:4]))[0]
                if need > _MAX_REPLY:
                    raise SandboxError(f"tool reply of {need} bytes exceeds {_MAX_REPLY}")
                if len(self.buf) >= 4 + need:
                    frame = bytes(self.buf[4 : 4 + need])
                    del self.buf[: 4 + need]
                    return frame
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            watched = [self.fd] + ([self.err_fd] if self.err_fd is not None else [])
            ready, _, _ = select.select(watched, [], [], left)
            if self.err_fd in ready and not self._drain_err():
                self.err_fd = None  # its stderr closed; stdout may still answer
            if self.fd not in ready:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise SandboxError("the sandbox exited without answering")
            self.buf.extend(chunk)

    def _drain_err(self) -> bool:
        """Read what stderr holds now into the kept tail; False at its end."""
        try:
            chunk = os.read(self.err_fd, 65536)
        except BlockingIOError:
            return True
        self.err.extend(chunk)
        del self.err[:-_STDERR_KEEP]
        return bool(chunk)

    def stderr_text(self) -> str:
        """The kept stderr tail, after draining what a dead sandbox left (non-blocking: nothing can still write)."""
        if self.err_fd is not None:
            os.set_blocking(self.err_fd, False)
            while self._drain_err():
                pass
        return self.err.decode("utf-8", "replace").strip()


def run_in_sandbox(cfg: SandboxConfig, blob: bytes, arguments: dict[str, Any], timeout: float, modules: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run one pickled tool call at ``cfg.level``: the runner's JSON reply (``ok``/``error``/``refused``) or
    ``{"status": "timeout", "stderr": <its last lines>}``.

    Raises SandboxUnavailable when the level cannot be had, SandboxError when the sandbox dies.
    """
    bwrap = None
    if cfg.level != "rlimits-only":
        bwrap = bwrap_path()
        if bwrap is None:
            raise SandboxUnavailable(cfg.level, ["bubblewrap (no bwrap on PATH)"], hint=" — install it with `bash .ci/install-sandbox` (Debian package bubblewrap)")
    seccomp_fd = None
    if cfg.level == "strict":
        try:
            seccomp_fd = compile_filter(allow_network=cfg.network)
        except SeccompUnavailable as exc:
            raise SandboxUnavailable(cfg.level, [str(exc)]) from exc
    hostdir = None
    try:
        root = os.geteuid() == 0
        uid = _fresh_uid() if root and bwrap else None
        limits = {"memory_mb": cfg.memory_mb, "file_size_mb": cfg.file_size_mb, "open_files": cfg.open_files,
                  "max_processes": cfg.max_processes, "cpu_seconds": cfg.cpu_seconds or int(timeout) + 2}
        if bwrap:
            paths = _needed_paths(cfg)
            argv, mounts = _bwrap_argv(bwrap, cfg, paths, seccomp_fd)
            if uid is not None:
                argv = _as_uid(uid, paths, argv)
                mounts = mounts + [entry for entries in _opened_entries(paths).values() for entry in entries]
            expect = {"host_ns": _host_namespaces(), "seccomp": seccomp_fd is not None, "mounts": mounts, "uid": _INSIDE_UID,
                      "writable": ["/tmp", "/dev/shm", WORKDIR]}
            if cfg.network:
                del expect["host_ns"]["net"]  # shared by the caller's choice: neither checked nor reported
            env, cwd = {}, "/"
        else:
            hostdir = tempfile.mkdtemp(prefix="agenttune-tool-")
            argv = [sys.executable, *_PY_FLAGS, str(_RUNNER), call_tag()]
            expect = None
            env, cwd = _scrubbed_env(cfg, hostdir), hostdir
        request = {"expect": expect, "limits": limits, "sys_path": _import_path(), "modules": tuple(modules),
                   "blob": blob, "arguments": arguments}
        payload = pickle.dumps(request)
        pass_fds = [seccomp_fd] if seccomp_fd is not None else []
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                                    start_new_session=True, close_fds=True, pass_fds=pass_fds)
        except OSError as exc:
            raise SandboxUnavailable(cfg.level, [f"could not start {argv[0]}: {exc}"]) from exc
        for fd in pass_fds:
            os.close(fd)
        seccomp_fd = None
        started: dict[str, Any] | None = None
        inits: list[int] = []
        frame: bytes | None = None
        assert proc.stdout is not None and proc.stderr is not None
        frames = _Frames(proc.stdout.fileno(), proc.stderr.fileno())
        try:
            try:
                assert proc.stdin is not None
                proc.stdin.write(struct.pack(">I", len(payload)) + payload)
                proc.stdin.flush()
                # The sandbox's setup and checks get their own allowance; the call's timeout starts when the tool does.
                start = frames.next(time.monotonic() + _SETUP_SECONDS)
                if start is None:
                    raise SandboxError(f"the sandbox did not start within {_SETUP_SECONDS}s")
                started = json.loads(start)
                if started.get("status") == "refused":
                    raise SandboxUnavailable(cfg.level, started["missing"])
                if bwrap:
                    inits = _children(proc.pid)
                    bad = _privileged_descendants(proc.pid)
                    if bad:
                        raise SandboxUnavailable(cfg.level, [f"unprivileged uid outside (sandbox processes run as host uid 0: {bad})"])
                    started["verified"].append("unprivileged uid outside")
                proc.stdin.write(b"1")
                proc.stdin.close()
                frame = frames.next(time.monotonic() + timeout)
            except (OSError, SandboxError) as exc:
                _kill(proc)
                stderr = frames.stderr_text()
                if started is None:  # bubblewrap, the uid switch or the runner failed before the runner spoke
                    last = stderr.splitlines()[-1] if stderr else f"{exc}; exit code {proc.returncode}"
                    what = "namespaces" if "bwrap:" in stderr else "sandbox start"
                    raise SandboxUnavailable(cfg.level, [f"{what} ({last})"]) from exc
                return {"status": "crash", "exitcode": proc.returncode, "message": str(exc), "stderr": stderr}
        finally:
            processes = _process_snapshot(proc.pid) if frame is None else []
            _kill(proc, inits)
            stderr_tail = frames.stderr_text()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        if frame is None:
            return {"status": "timeout", "stderr": stderr_tail, "processes": processes}
        reply = json.loads(frame)
        reply["verified"] = started["verified"] if started else []
        return reply
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
        if hostdir is not None:
            shutil.rmtree(hostdir, ignore_errors=True)
