"""The in-sandbox side of one isolated tool call (standard library only until the tool is unpickled).

Run by ``tools.sandbox`` as ``python -I -S _sandbox_runner.py`` inside bubblewrap (or, at level
``rlimits-only``, as a plain child). It reads one length-prefixed pickle from the trusted parent
on stdin, verifies that every protection the level promises is actually in force (namespaces
differ from the host's, no capabilities, no_new_privs, seccomp mode 2, an unprivileged uid
outside, only the expected mounts, all read-only but the private tmpfs ones), sets and checks
the rlimits, and only then unpickles and runs the tool. It answers in JSON — never pickle, so a
tool's output cannot execute code in the caller — or refuses, naming what is missing.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import struct
import sys

_LIMITS = {
    "memory_mb": (resource.RLIMIT_AS, 1024 * 1024),
    "file_size_mb": (resource.RLIMIT_FSIZE, 1024 * 1024),
    "open_files": (resource.RLIMIT_NOFILE, 1),
    "max_processes": (resource.RLIMIT_NPROC, 1),
    "cpu_seconds": (resource.RLIMIT_CPU, 1),
}


def _read_exact(fd: int, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("request truncated")
        buf.extend(chunk)
    return bytes(buf)


def _status() -> dict[str, str]:
    with open("/proc/self/status") as fh:
        return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)


def _mounts() -> list[tuple[str, list[str], str]]:
    """(mount point, per-mount options, filesystem type) for every mount this process sees."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, right = line.split(" - ", 1)
            fields = left.split()
            point = fields[4].encode().decode("unicode_escape").encode("latin-1").decode()
            out.append((point, fields[5].split(","), right.split()[0]))
    return out


def _check_confinement(expect: dict) -> tuple[list[str], list[str]]:
    """(protections verified, protections missing) for a bubblewrap level."""
    ok: list[str] = []
    missing: list[str] = []
    for name, host in expect["host_ns"].items():
        (ok if os.readlink(f"/proc/self/ns/{name}") != host else missing).append(f"{name} namespace")
    # A /proc of this PID namespace: /proc/self names our own pid (the host's proc would show a host pid).
    (ok if os.readlink("/proc/self") == str(os.getpid()) else missing).append("own /proc")
    status = _status()
    (ok if int(status.get("CapEff", "1"), 16) == 0 and int(status.get("CapPrm", "1"), 16) == 0 else missing).append("no capabilities")
    (ok if status.get("NoNewPrivs", "0").strip() == "1" else missing).append("no_new_privs")
    if expect["seccomp"]:
        (ok if status.get("Seccomp", "0").strip() == "2" else missing).append("seccomp filter")
    (ok if os.getuid() == expect["uid"] and os.getgid() == expect["uid"] else missing).append(f"sandbox uid {expect['uid']}")
    writable = set(expect["writable"])
    allowed = set(expect["mounts"]) | writable
    stray, rw = [], []
    for point, opts, fstype in _mounts():
        if point in ("/proc", "/dev") or point.startswith(("/proc/", "/dev/")) and point not in writable:
            continue  # bubblewrap's own /proc and /dev sub-mounts
        if point not in allowed:
            stray.append(point)
        elif point in writable:
            if fstype != "tmpfs":
                rw.append(f"{point} is {fstype}, not a private tmpfs")
        elif "ro" not in opts:
            rw.append(f"{point} is writable")
    (ok if not stray else missing).append("only the expected mounts" + (f" (also: {', '.join(sorted(stray))})" if stray else ""))
    (ok if not rw else missing).append("read-only filesystem" + (f" ({'; '.join(rw)})" if rw else ""))
    return ok, missing


def _set_limits(limits: dict) -> tuple[list[str], list[str]]:
    ok, missing = [], []
    for key, (which, unit) in _LIMITS.items():
        value = int(limits[key]) * unit
        hard = value + unit if which == resource.RLIMIT_CPU else value  # SIGXCPU first, SIGKILL a second later
        try:
            resource.setrlimit(which, (value, hard))
            applied = resource.getrlimit(which) == (value, hard)
        except (ValueError, OSError):
            applied = False
        (ok if applied else missing).append(f"rlimit {key}={limits[key]}")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return ok, missing


def _default_signals() -> None:
    """Undo what the caller's process left on its signals (exec keeps ignored ones and the blocked mask): a tool and
    its children start as a fresh program does, so ``Pool.terminate``'s SIGTERM ends workers instead of being ignored."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig in signal.valid_signals():
        if sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGKILL, signal.SIGSTOP):  # ignored by CPython itself, or fixed
            continue
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        except (OSError, ValueError):  # real-time signals the platform reserves
            continue


def main() -> None:
    _default_signals()
    inp, out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):  # stderr stays the parent's pipe: its tail names what a tool was doing when it hung or died
        os.dup2(null, fd)
    import pickle  # the request comes from the trusted parent

    request = pickle.loads(_read_exact(inp, struct.unpack(">I", _read_exact(inp, 4))[0]))
    go = inp
    ok, missing = ([], []) if request["expect"] is None else _check_confinement(request["expect"])
    # Under bubblewrap the session is the PID namespace's (its init, pid 1, leads it); else the runner's own.
    if os.getsid(0) == os.getpid() or (request["expect"] is not None and os.getsid(0) == 1):
        ok.append("own session")
    else:
        missing.append("own session")
    lim_ok, lim_missing = _set_limits(request["limits"])
    ok += lim_ok
    missing += lim_missing
    if missing:
        _write(out, {"status": "refused", "missing": missing, "verified": ok})
        os._exit(0)
    _write(out, {"status": "started", "verified": ok})
    if _read_exact(go, 1) != b"1":  # the parent checks the sandbox from the host side first
        os._exit(0)
    os.close(go)
    _write(out, _run(request))
    os._exit(0)


def _write(fd: int, body: dict) -> None:
    data = json.dumps(body, default=str).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _run(request: dict) -> dict:
    try:
        sys.path[:0] = [p for p in request["sys_path"] if p not in sys.path]
        for module in request["modules"]:
            __import__(module)
        import pickle

        tool = pickle.loads(request["blob"])
        result = tool.invoke(request["arguments"], validate=False)
        try:
            value = json.loads(json.dumps(result.value))
        except (TypeError, ValueError):
            value = None
        return {"status": "ok", "content": result.content, "error": result.error, "metadata": result.metadata, "value": value}
    except BaseException as exc:  # noqa: BLE001 - everything becomes an answer
        return {"status": "error", "message": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    main()
