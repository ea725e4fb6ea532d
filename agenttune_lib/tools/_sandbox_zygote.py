"""The pooled sandbox worker (standard library only): confines itself once, then forks one confined child per tool call.

Run as ``python _sandbox_zygote.py``; it speaks length-prefixed frames on stdin/stdout. The
first frame (a pickle from the trusted parent) configures it; it then enters, where the OS
allows, a private network namespace (no interfaces up: no network) and a private mount
namespace in which every filesystem is read-only except its working directory and a private
``/dev/shm``. Each call is forked into a new session (its own process group) that sets
rlimits, drops to the sandbox uid, runs the tool and answers in JSON — never pickle, so a
tool's output cannot execute code in the caller. On return or timeout the whole group and
every process of the sandbox uid are killed.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import pickle
import resource
import select
import signal
import struct
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_CHILD_SUBREAPER = 36
MAX_REPLY = 16 * 1024 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _read_frame(fd: int) -> bytes | None:
    head = _read_exact(fd, 4)
    if head is None:
        return None
    return _read_exact(fd, struct.unpack(">I", head)[0])


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf.extend(chunk)
    return bytes(buf)


def _write_frame(fd: int, data: bytes) -> None:
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _confine(cfg: dict) -> dict:
    """Namespaces and mounts, once, as root; returns which protections are active."""
    active = {"network_isolated": False, "filesystem_readonly": False, "uid_dropped": False, "reasons": {}}
    flags = CLONE_NEWNS | (0 if cfg["network"] else CLONE_NEWNET)
    try:
        _check(_libc.unshare(flags), "unshare")
        active["network_isolated"] = not cfg["network"]
    except OSError as exc:
        active["reasons"]["namespaces"] = str(exc)
        return active
    work = cfg["workdir"]
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _mount(work, work, None, MS_BIND)
        try:
            active["exposed"] = _expose(cfg["needed"])
        except OSError as exc:
            active["reasons"]["expose"] = str(exc)
        try:
            _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['shm_mb']}m,mode=1777")
        except OSError as exc:  # multiprocessing in the tool then lacks semaphores
            active["reasons"]["dev_shm"] = str(exc)
        points = []
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields = line.split()
                # mountinfo escapes spaces and the like as octal (\040)
                point = fields[4].encode().decode("unicode_escape").encode("latin-1").decode()
                points.append((point, fields[5].split(",")))
        for point, opts in points:
            if point in (work, "/dev/shm") or point.startswith(("/proc", "/sys", "/dev/")):
                continue
            bits = MS_REMOUNT | MS_BIND | MS_RDONLY
            for name, bit in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC)):
                if name in opts:
                    bits |= bit
            try:
                _mount(None, point, None, bits)
            except OSError as exc:
                active["reasons"].setdefault("readonly_skipped", []).append(f"{point}: {exc}")
        # Read-only only if every filesystem could be remounted so; the skipped ones are listed.
        active["filesystem_readonly"] = not active["reasons"].get("readonly_skipped")
    except OSError as exc:
        active["reasons"]["mounts"] = str(exc)
    return active


def _closed_ancestor(path: str) -> str | None:
    """The topmost directory above ``path`` that others cannot enter (e.g. ``/root``), or None."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        ancestor = "/" + "/".join(parts[:i])
        try:
            if not os.stat(ancestor).st_mode & 0o001:
                return ancestor
        except OSError:
            return None
    return None


def _expose(needed: list[str]) -> list[str]:
    """Make the interpreter and import paths under closed directories visible to the sandbox uid, and nothing else there.

    A closed directory (say ``/root``, holding the interpreter) is covered by an empty tmpfs
    into which only the needed paths are bind-mounted, so its other contents stay hidden.
    """
    plan: dict[str, list[str]] = {}
    for path in needed:
        real = os.path.realpath(path)
        if not os.path.exists(real):
            continue
        closed = _closed_ancestor(real)
        if closed is not None:
            plan.setdefault(closed, []).append(real)
    exposed = []
    for closed, paths in plan.items():
        paths = sorted(set(paths))
        keep = [p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths)]
        fds = {p: os.open(p, os.O_PATH) for p in keep}
        _mount("tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for path, fd in fds.items():
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                open(path, "a").close()
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            os.close(fd)
            exposed.append(path)
    return exposed


def _sweep(uid: int | None, pid: int, thorough: bool) -> None:
    """Kill the call's process group and every process of the sandbox uid (setsid escapers too), then reap.

    ``thorough`` (after a timeout or crash) waits until every killed process is reaped; after a
    normal return the call process is awaited and stragglers are reaped on the next call.
    """
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        reaper = os.fork()
        if reaper == 0:
            try:
                os.setgid(uid)
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)  # every process this uid may signal: exactly the sandbox's
            except Exception:
                pass
            os._exit(0)
        os.waitpid(reaper, 0)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # already reaped
    deadline = time.monotonic() + (2.0 if thorough else 0.0)
    while True:  # everything reparented to us (we are the subreaper)
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if done == 0:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.001)


def _child(cfg: dict, uid: int | None, blob: bytes, arguments: dict, timeout: float, wfd: int, closefds: list[int]) -> None:
    """Runs in the forked call process; never returns."""
    code = 0
    try:
        os.setsid()
        for fd in closefds:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        mb = 1024 * 1024
        limits = [
            (resource.RLIMIT_AS, cfg["memory_mb"] * mb),
            (resource.RLIMIT_FSIZE, cfg["file_size_mb"] * mb),
            (resource.RLIMIT_NOFILE, cfg["open_files"]),
            (resource.RLIMIT_CORE, 0),
        ]
        cpu = cfg["cpu_seconds"] or int(math.ceil(timeout)) + 1
        limits.append((resource.RLIMIT_CPU, (cpu, cpu + 1)))
        if uid is not None:
            limits.append((resource.RLIMIT_NPROC, cfg["max_processes"]))
        for which, value in limits:
            soft, hard = value if isinstance(value, tuple) else (value, value)
            resource.setrlimit(which, (soft, hard))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.chdir(cfg["workdir"])
        tool = pickle.loads(blob)
        result = tool.invoke(arguments, validate=False)
        try:
            value = json.loads(json.dumps(result.value))
        except (TypeError, ValueError):
            value = None
        body = {"status": "ok", "content": result.content, "error": result.error, "metadata": result.metadata, "value": value}
        data = json.dumps(body, default=str).encode()
    except BaseException as exc:  # noqa: BLE001 - everything becomes an answer
        data = json.dumps({"status": "error", "message": f"{type(exc).__name__}: {exc}"}).encode()
        code = 1
    try:
        _write_frame(wfd, data)
    finally:
        os._exit(code)


def _run_call(cfg: dict, uid: int | None, blob: bytes, arguments: dict, timeout: float, proto: list[int]) -> dict:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        _child(cfg, uid, blob, arguments, timeout, wfd, proto)
    os.close(wfd)
    deadline = time.monotonic() + timeout
    buf = bytearray()
    need: int | None = None
    reply: dict | None = None
    exit_status: int | None = None
    eof = False
    try:
        while reply is None:
            left = deadline - time.monotonic()
            if left <= 0:
                reply = {"status": "timeout"}
                break
            ready: list = []
            if not eof:
                ready, _, _ = select.select([rfd], [], [], min(left, 0.05))
            else:
                time.sleep(min(left, 0.005))
            if ready:
                chunk = os.read(rfd, 65536)
                if not chunk:
                    eof = True
                else:
                    buf.extend(chunk)
                    if need is None and len(buf) >= 4:
                        need = struct.unpack(">I", bytes(buf[:4]))[0]
                        if need > MAX_REPLY:
                            reply = {"status": "error", "message": f"tool reply of {need} bytes exceeds {MAX_REPLY}"}
                    if need is not None and len(buf) >= 4 + need:
                        reply = {"status": "raw", "body": bytes(buf[4 : 4 + need])}
                    continue
            if exit_status is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    exit_status = status
                    continue  # drain what it wrote before deciding it crashed
            if exit_status is not None and (eof or not ready):
                reply = {"status": "crash", "exitcode": _exitcode(exit_status)}
    finally:
        os.close(rfd)
        if reply is None or reply.get("status") != "raw":
            _sweep(uid, pid, thorough=True)  # a timeout or crash is answered only once everything is dead
    if reply.get("status") == "raw":
        return {"status": "reply", "body": reply["body"].decode("utf-8", "replace"), "_cleanup": pid}
    return reply


def _exitcode(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main() -> None:
    inp, out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    init = _read_frame(inp)
    if init is None:
        return
    cfg = pickle.loads(init)  # the first frame comes from the trusted parent
    sys.path[:0] = [p for p in cfg["sys_path"] if p not in sys.path]
    uid = cfg["uid"] if os.geteuid() == 0 else None
    if os.geteuid() != 0:
        active = {"network_isolated": False, "filesystem_readonly": False, "reasons": {"root": "not root: no namespaces, no uid drop"}}
    elif not cfg.get("namespaces", True):
        active = {"network_isolated": False, "filesystem_readonly": False, "reasons": {"namespaces": "disabled by SandboxConfig(namespaces=False)"}}
    else:
        active = _confine(cfg)
    if uid is not None and "exposed" not in active:
        hidden = [p for p in cfg["needed"] if os.path.exists(p) and _closed_ancestor(os.path.realpath(p))]
        if hidden:
            # Without a mount namespace to expose them, a dropped uid could not even import Python.
            uid = None
            active["reasons"]["uid"] = f"interpreter or import paths under closed directories ({hidden[0]}) and no mount namespace"
    active["uid_dropped"] = uid is not None
    try:
        _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl")
        active["subreaper"] = True
    except OSError:
        active["subreaper"] = False
    for module in cfg.get("preload", ()):
        try:
            __import__(module)
        except Exception:
            pass
    _write_frame(out, json.dumps({"status": "ready", "protections": active}).encode())
    while True:
        frame = _read_frame(inp)
        if frame is None:
            return
        blob, arguments, timeout, modules = pickle.loads(frame)
        for module in modules:  # the tool's own modules, already imported by the trusted parent
            if module not in sys.modules:
                try:
                    __import__(module)
                except Exception:
                    pass
        reply = _run_call(cfg, uid, blob, arguments, timeout, [inp, out])
        pending = reply.pop("_cleanup", None)
        _write_frame(out, json.dumps(reply).encode())
        if pending is not None:
            # After a normal return, the sweep runs off the caller's critical path (before the next call is read).
            _sweep(uid, pending, thorough=False)


if __name__ == "__main__":
    main()
