"""Escapes a hostile tool tries (module level, so the sandbox can import them), and a driver that runs them all.

``run_attacks(ctx)`` runs every attack through ``IsolatedTool`` at one level and returns, per
attack, what the tool saw inside plus what the rollout process sees on the host afterwards.
``tests/test_sandbox_attacks.py`` calls it in process (as root) and through
``python tests/_sandbox_attacks.py CTX_JSON`` under an unprivileged uid, then asserts the same
exact outcomes on both.
"""
from __future__ import annotations

import json
import os
import sys
import time


def _err(exc: BaseException) -> str:
    """The exception class, and the errno's name for an OSError (``OSError:EROFS``)."""
    import errno

    code = getattr(exc, "errno", None)
    return f"{type(exc).__name__}:{errno.errorcode[code]}" if isinstance(code, int) and code in errno.errorcode else type(exc).__name__


def unix_connect(paths: list) -> dict:
    """Connect to each host Unix socket path (PostgreSQL, MySQL, the test's own; ``@name``: an abstract socket)."""
    import socket

    out = {}
    for path in paths:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(2)
                sock.connect("\0" + path[1:] if path.startswith("@") else path)
                out[path] = "connected"
        except OSError as exc:
            out[path] = _err(exc)
    return out


def pg_copy_to_program(socket_dir: str, marker: str) -> str:
    """As postgres over the Unix socket: COPY ... TO PROGRAM, a command run on the host."""
    import psycopg2

    try:
        conn = psycopg2.connect(host=socket_dir, user="postgres", dbname="postgres", connect_timeout=3)
    except Exception as exc:  # noqa: BLE001 - the class is the answer
        return f"{_err(exc)}: {str(exc).strip().splitlines()[0][:200]}"
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'")
    return "ran"


def tcp_connect(targets: list) -> dict:
    """TCP to each (host, port): loopback services and an outside address."""
    import socket

    out = {}
    for host, port in targets:
        try:
            with socket.create_connection((host, port), timeout=2):
                out[f"{host}:{port}"] = "connected"
        except OSError as exc:
            out[f"{host}:{port}"] = _err(exc)
    return out


def proc_view(rollout_pid: int, secret: str) -> dict:
    """What /proc shows: which processes, their command lines, and whether the secret is anywhere."""
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    cmdlines, found = {}, []
    for pid in pids:
        for name in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as fh:
                    data = fh.read().decode("utf-8", "replace")
            except OSError as exc:
                data = _err(exc)
            if name == "cmdline":
                cmdlines[pid] = data.replace("\0", " ").strip()
            if secret in data:
                found.append(f"{pid}/{name}")
    if secret in "".join(f"{k}={v}" for k, v in os.environ.items()):
        found.append("os.environ")
    return {"pids": pids, "self": os.getpid(), "cmdlines": cmdlines, "secret_found": found,
            "rollout_visible": os.path.exists(f"/proc/{rollout_pid}")}


def ptrace_attach(rollout_pid: int) -> dict:
    """PTRACE_ATTACH to the sandbox's init, its parent and the rollout process."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    for label, pid in (("init", 1), ("parent", os.getppid()), ("rollout", rollout_pid)):
        rc = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
        out[label] = "attached" if rc == 0 else errno.errorcode[ctypes.get_errno()]
    return out


def new_namespaces() -> dict:
    """Try a nested user namespace (the way to regain capabilities) and a mount."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    rc = libc.unshare(0x10000000)  # CLONE_NEWUSER
    out["unshare_user"] = "created" if rc == 0 else errno.errorcode[ctypes.get_errno()]
    rc = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
    out["mount"] = "mounted" if rc == 0 else errno.errorcode[ctypes.get_errno()]
    return out


def make_shm(name: str, key: int) -> dict:
    """Leave POSIX (/dev/shm) and System V shared memory behind."""
    import ctypes
    import errno

    with open(f"/dev/shm/{name}", "w") as fh:
        fh.write("left behind")
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(key, 4096, 0o1000 | 0o666)  # IPC_CREAT
    return {"posix": sorted(os.listdir("/dev/shm")), "sysv": shmid if shmid >= 0 else errno.errorcode[ctypes.get_errno()]}


def see_shm(name: str, key: int) -> dict:
    """Whether an earlier call's shared memory is visible."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(key, 0, 0)
    return {"posix": os.path.exists(f"/dev/shm/{name}"), "sysv": shmid if shmid >= 0 else errno.errorcode[ctypes.get_errno()]}


def write_paths(paths: list) -> dict:
    """Write a file at each path."""
    out = {}
    for path in paths:
        try:
            with open(path, "w") as fh:
                fh.write("escaped")
            out[path] = "written"
        except OSError as exc:
            out[path] = _err(exc)
    return out


def read_paths(paths: list) -> dict:
    """Read each host file (root-only /etc/shadow, root's home)."""
    out = {}
    for path in paths:
        try:
            with open(path, "rb") as fh:
                fh.read(1)
            out[path] = "read"
        except OSError as exc:
            out[path] = _err(exc)
    return out


def fork_count(limit: int) -> dict:
    """Fork sleeping children until the kernel says no (or ``limit`` is reached)."""
    import time as _time

    children, error = [], None
    for _ in range(limit):
        try:
            pid = os.fork()
        except OSError as exc:
            error = _err(exc)
            break
        if pid == 0:
            _time.sleep(1000)
            os._exit(0)
        children.append(pid)
    return {"forked": len(children), "error": error}


def fork_bomb() -> str:
    """Fork forever (each child too)."""
    while True:
        try:
            os.fork()
        except OSError:
            pass


def daemon(seconds: str) -> str:
    """Leave a double-forked setsid daemon behind (``sleep SECONDS``) and return."""
    import subprocess

    subprocess.Popen(["setsid", "sleep", seconds], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.Popen(["sleep", seconds], start_new_session=True)
    time.sleep(0.3)
    return "left"


def kill_parent(rollout_pid: int) -> dict:
    """SIGKILL its parent, the sandbox init, the rollout process and everything it may signal."""
    import signal

    out = {}
    for label, pid in (("parent", os.getppid()), ("init", 1), ("rollout", rollout_pid), ("all", -1)):
        try:
            os.kill(pid, signal.SIGKILL)
            out[label] = "sent"
        except OSError as exc:
            out[label] = _err(exc)
    return out


def allocate(gb: float) -> int:
    """Allocate and touch ``gb`` gigabytes."""
    return len(bytearray(int(gb * 1024**3)))


def big_file(mb: int) -> str:
    """Write ``mb`` megabytes into the work directory."""
    try:
        with open("big.bin", "wb") as fh:
            fh.write(b"\0" * (mb * 1024 * 1024))
        return "written"
    except OSError as exc:
        return _err(exc)


def spin() -> str:
    """Burn CPU forever."""
    while True:
        pass


def whoami() -> dict:
    """The sandbox's identity and working directory."""
    return {"uid": os.getuid(), "cwd": os.getcwd(), "home": os.environ.get("HOME"), "hostname": os.uname().nodename}


# -- the driver ------------------------------------------------------------------------------------

def _host_processes_with(text: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if text in fh.read().replace(b"\0", b" ").decode("utf-8", "replace"):
                        out.append(int(entry))
            except OSError:
                continue
    return out


def _sysv_keys() -> set[int]:
    with open("/proc/sysvipc/shm") as fh:
        return {int(line.split()[0]) for line in fh.readlines()[1:] if line.strip()}


def ctx_processes(ctx: dict) -> list[int]:
    """Host processes of any sandbox this rollout process started (their command line carries its pid)."""
    return _host_processes_with(f"agenttune-call-{os.getpid()}-")


def run_attacks(ctx: dict) -> dict:
    """Every attack at ``ctx['level']``: per attack, the tool result (value or error type) and host-side facts after it."""
    from agenttune_lib.tools.isolation import IsolatedTool
    from agenttune_lib.tools.sandbox import SandboxConfig

    level, marker = ctx["level"], ctx["marker"]
    me = sys.modules[__name__]

    def call(fn, timeout=20.0, **kwargs) -> dict:
        sandbox = SandboxConfig(level=level, **ctx.get("limits", {}), **kwargs.pop("_cfg", {}))
        result = IsolatedTool(getattr(me, fn), timeout=timeout, sandbox=sandbox).invoke(kwargs)
        return {"value": result.value, "error": (result.error or {}).get("type"), "message": (result.error or {}).get("message"),
                "exception": (result.error or {}).get("exception"),
                "sandbox": result.metadata.get("sandbox"), "isolation": result.metadata.get("isolation")}

    out: dict = {"rollout_pid": os.getpid(), "uid": os.getuid()}
    out["whoami"] = call("whoami")
    out["unix"] = call("unix_connect", paths=ctx["unix_paths"])
    pg_marker = f"/tmp/agenttune-pg-escape-{marker}"
    out["pg_copy"] = call("pg_copy_to_program", socket_dir=ctx["pg_dir"], marker=pg_marker)
    out["pg_copy"]["host_marker"] = os.path.exists(pg_marker)
    out["tcp"] = call("tcp_connect", targets=ctx["tcp_targets"])
    out["proc"] = call("proc_view", rollout_pid=os.getpid(), secret=ctx["secret"])
    out["ptrace"] = call("ptrace_attach", rollout_pid=os.getpid())
    out["namespaces"] = call("new_namespaces")
    keys_before = _sysv_keys()
    out["shm"] = call("make_shm", name=f"agenttune-shm-{marker}", key=ctx["shm_key"])
    out["shm"]["host_posix"] = os.path.exists(f"/dev/shm/agenttune-shm-{marker}")
    out["shm"]["host_sysv_new"] = sorted(_sysv_keys() - keys_before)
    out["shm_next_call"] = call("see_shm", name=f"agenttune-shm-{marker}", key=ctx["shm_key"])
    out["write"] = call("write_paths", paths=ctx["write_paths"])
    out["write"]["host_exists"] = {p: os.path.exists(p) for p in ctx["write_paths"]}
    out["read"] = call("read_paths", paths=["/etc/shadow", "/root/.bashrc", "/home"])
    out["fork_count"] = call("fork_count", limit=200, _cfg={"max_processes": 16})
    out["fork_count"]["host_left"] = ctx_processes(ctx)
    start = time.monotonic()
    out["fork_bomb"] = call("fork_bomb", timeout=2.0, _cfg={"max_processes": 32})
    out["fork_bomb"]["seconds"] = round(time.monotonic() - start, 2)
    out["fork_bomb"]["host_left"] = ctx_processes(ctx)
    out["daemon"] = call("daemon", seconds=ctx["daemon_seconds"])
    time.sleep(0.3)
    out["daemon"]["host_left"] = _host_processes_with(f"sleep {ctx['daemon_seconds']}")
    out["kill"] = call("kill_parent", rollout_pid=os.getpid())
    out["kill"]["rollout_alive"] = True  # this line runs: the rollout process survived
    out["after_kill"] = call("whoami")
    out["memory"] = call("allocate", gb=2)
    out["file_size"] = call("big_file", mb=3, _cfg={"file_size_mb": 2})
    return out


if __name__ == "__main__":
    context = json.loads(sys.argv[1])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _sandbox_attacks  # the attacks must be importable by module name inside the sandbox

    print(json.dumps(_sandbox_attacks.run_attacks(context)))
