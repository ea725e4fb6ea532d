"""Every escape of issue 29, tried by a hostile tool as root and as an unprivileged user, with the exact containment asserted.

Nothing here skips: where this machine cannot build the sandbox (no bubblewrap, no user
namespaces), each attack must come back as the ``sandbox_unavailable`` refusal instead, and that
is asserted. The attack targets are real and checked from the host first: the test's own Unix
sockets (one in /run, one in /tmp) and TCP listener, and — where they run, as on CI — PostgreSQL's
socket (``COPY ... TO PROGRAM`` as postgres), MySQL's socket, ports 5432/3306/6379.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import _sandbox_attacks as attacks
from agenttune_lib.events import EventKind
from agenttune_lib.spine import DictToolHarness, ReActStrategy, run_episode
from agenttune_lib.tools import sandbox as sb
from agenttune_lib.tools.isolation import IsolatedTool
from _spine_helpers import Scripted, call

PG_DIR = "/var/run/postgresql"
PG_SOCKET = f"{PG_DIR}/.s.PGSQL.5432"
MYSQL_SOCKET = "/run/mysqld/mysqld.sock"
SECRET = "agenttune-attack-secret-7f3c"
TESTS = Path(__file__).resolve().parent
UNPRIVILEGED = 65534


def _address(path: str) -> str:
    return "\0" + path[1:] if path.startswith("@") else path  # "@name": an abstract socket (scoped by network namespace)


def _listen_unix(path: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(_address(path))
    if not path.startswith("@"):
        os.chmod(path, 0o777)
    server.listen(8)
    return server


def _host_reaches_unix(path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(_address(path))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def targets():
    """Listeners the host can reach (asserted), the secret in the rollout's environment, and paths to write."""
    marker = f"{os.getpid()}"
    run_dir = Path(f"/run/agenttune-attack-{marker}") if os.access("/run", os.W_OK) else Path(tempfile.mkdtemp(prefix="agenttune-run-"))
    run_dir.mkdir(exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix="agenttune-attack-"))
    for d in (run_dir, tmp_dir):
        os.chmod(d, 0o777)
    abstract = f"@agenttune-attack-{marker}"
    servers = [_listen_unix(str(run_dir / "s.sock")), _listen_unix(str(tmp_dir / "s.sock")), _listen_unix(abstract)]
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    servers.append(tcp)
    unix_paths = [str(run_dir / "s.sock"), str(tmp_dir / "s.sock"), PG_SOCKET, MYSQL_SOCKET]
    # The targets are real: the host reaches its own listeners, and PostgreSQL where it runs (always on CI).
    assert _host_reaches_unix(unix_paths[0]) and _host_reaches_unix(unix_paths[1]) and _host_reaches_unix(abstract)
    socket.create_connection(("127.0.0.1", tcp.getsockname()[1]), timeout=2).close()
    if os.environ.get("AGENTTUNE_PG_REQUIRED") == "1":  # CI: PostgreSQL runs, so the sandbox's view of it is a real test
        socket.create_connection(("127.0.0.1", 5432), timeout=3).close()
    if os.path.exists(PG_SOCKET):
        assert _host_reaches_unix(PG_SOCKET), f"{PG_SOCKET} exists but the host cannot connect to it"
    old = os.environ.get("AGENTTUNE_ATTACK_SECRET")
    os.environ["AGENTTUNE_ATTACK_SECRET"] = SECRET
    ctx = {
        "marker": marker, "secret": SECRET, "unix_paths": unix_paths + [abstract], "pg_dir": PG_DIR,
        "tcp_targets": [["127.0.0.1", tcp.getsockname()[1]], ["127.0.0.1", 5432], ["127.0.0.1", 3306], ["127.0.0.1", 6379], ["10.255.255.1", 80]],
        "shm_key": 0x5A000000 + os.getpid() % 0xFFFF,
        "write_paths": ["/usr/agenttune-escape.txt", "/etc/agenttune-escape.txt", str(TESTS / "agenttune-escape.txt"),
                        str(tmp_dir / "escape.txt"), f"/tmp/agenttune-escape-{marker}", "/var/tmp/agenttune-escape.txt"],
        "daemon_seconds": f"9{os.getpid() % 1000}.{os.getpid() % 97}",
    }
    yield ctx
    for server in servers:
        server.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(tmp_dir, ignore_errors=True)
    if old is None:
        os.environ.pop("AGENTTUNE_ATTACK_SECRET", None)
    else:
        os.environ["AGENTTUNE_ATTACK_SECRET"] = old


def _as_unprivileged(ctx: dict) -> dict:
    """The whole attack run from a rollout process of uid 65534 (util-linux setpriv; the interpreter exposed as for the sandbox).

    A non-root test run is already unprivileged: it runs the attacks itself.
    """
    if os.geteuid() != 0:
        return attacks.run_attacks(ctx)
    argv = sb._as_uid(UNPRIVILEGED, sb._needed_paths(sb.SandboxConfig()), [sys.executable, str(TESTS / "_sandbox_attacks.py"), json.dumps(ctx)])
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)),
           "AGENTTUNE_ATTACK_SECRET": SECRET, "LANG": "C.UTF-8"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _sandbox_available(level: str) -> tuple[bool, str]:
    result = IsolatedTool(attacks.whoami, timeout=20, level=level).invoke({})
    if result.error and result.error["type"] == "sandbox_unavailable":
        return False, result.error["message"]
    assert result.ok, result.error
    return True, ""


def _assert_contained(out: dict, level: str, ctx: dict, unprivileged: bool) -> None:
    available, why = _sandbox_available(level) if not unprivileged else (out["whoami"]["error"] != "sandbox_unavailable", out["whoami"]["message"])
    attack_keys = [k for k, v in out.items() if isinstance(v, dict) and "error" in v]
    if not available:  # the tool must refuse, naming what is missing, every time
        assert why and "unavailable: missing" in why
        for key in attack_keys:
            assert out[key]["error"] == "sandbox_unavailable" and out[key]["isolation"] == "refused", key
        return
    assert (out["uid"] != 0) if unprivileged else (out["uid"] == 0)
    assert out["whoami"]["value"] == {"uid": 65534, "cwd": "/sandbox", "home": "/sandbox", "hostname": "sandbox"}
    meta = out["whoami"]["sandbox"]
    assert meta["level"] == level and meta["chosen_by"] == "caller"
    assert meta["lowered"] == ([] if level == "strict" else ["seccomp filter"])
    must = {"own /proc", "user namespace", "pid namespace", "ipc namespace", "mnt namespace", "net namespace", "uts namespace", "no capabilities",
            "no_new_privs", "read-only filesystem", "only the expected mounts", "unprivileged uid outside", "rlimit max_processes=64"}
    assert must <= set(meta["verified"]), sorted(must - set(meta["verified"]))
    assert ("seccomp filter" in meta["verified"]) == (level == "strict")
    # Host Unix sockets (the test's in /run and /tmp, PostgreSQL, MySQL) do not exist inside; an abstract one is another network's.
    assert out["unix"]["value"] == {p: "ConnectionRefusedError:ECONNREFUSED" if p.startswith("@") else "FileNotFoundError:ENOENT" for p in ctx["unix_paths"]}
    pg = out["pg_copy"]
    assert pg["value"].startswith("OperationalError") and "No such file or directory" in pg["value"] and pg["host_marker"] is False
    # TCP: strict has no socket but AF_UNIX at all; no-seccomp has only the sandbox's own, empty loopback.
    tcp = out["tcp"]["value"]
    if level == "strict":
        assert set(tcp.values()) == {"PermissionError:EPERM"}
    else:
        assert {k: v for k, v in tcp.items() if k.startswith("127.")} == {k: "ConnectionRefusedError:ECONNREFUSED" for k in tcp if k.startswith("127.")}
        assert tcp["10.255.255.1:80"] == "OSError:ENETUNREACH"
    # /proc shows the sandbox's own two processes; no secret anywhere; the rollout is invisible.
    proc = out["proc"]["value"]
    assert proc["pids"] == [1, 2] and proc["self"] == 2
    assert proc["cmdlines"]["1"].startswith(sb.bwrap_path()) and "_sandbox_runner.py" in proc["cmdlines"]["2"]
    assert proc["secret_found"] == [] and proc["rollout_visible"] is False
    assert out["ptrace"]["value"] == ({"init": "EPERM", "parent": "EPERM", "rollout": "EPERM"} if level == "strict"
                                      else {"init": "attached", "parent": "EPERM", "rollout": "ESRCH"})  # only its own init
    # No way back to capabilities: seccomp denies a nested user namespace; without it bwrap's --disable-userns does (ENOSPC).
    assert out["namespaces"]["value"] == {"unshare_user": "EPERM" if level == "strict" else "ENOSPC", "mount": "EPERM"}
    # Shared memory dies with the call: not on the host, not in the next call.
    shm = out["shm"]
    assert f"agenttune-shm-{ctx['marker']}" in shm["value"]["posix"] and shm["value"]["sysv"] >= 0
    assert shm["host_posix"] is False and shm["host_sysv_new"] == []
    assert out["shm_next_call"]["value"] == {"posix": False, "sysv": "ENOENT"}
    paths = ctx["write_paths"]
    assert out["write"]["value"] == {paths[0]: "OSError:EROFS", paths[1]: "OSError:EROFS", paths[2]: "OSError:EROFS",
                                     paths[3]: "FileNotFoundError:ENOENT", paths[4]: "written", paths[5]: "FileNotFoundError:ENOENT"}
    assert not any(out["write"]["host_exists"].values())  # '/tmp/...' was written to the call's private /tmp only
    # Root-only files stay unreadable (the sandbox is an unprivileged uid on the host, even for a root rollout); homes are absent.
    assert out["read"]["value"] == {"/etc/shadow": "PermissionError:EACCES", "/root/.bashrc": "FileNotFoundError:ENOENT", "/home": "FileNotFoundError:ENOENT"}
    fc = out["fork_count"]
    assert 0 < fc["value"]["forked"] < 16 and fc["value"]["error"] == "BlockingIOError:EAGAIN" and fc["host_left"] == []
    bomb = out["fork_bomb"]
    assert bomb["error"] == "timeout" and bomb["seconds"] < 15 and bomb["host_left"] == []
    assert out["daemon"]["value"] == "left" and out["daemon"]["host_left"] == []
    kill = out["kill"]
    assert kill["value"] == {"parent": "sent", "init": "sent", "rollout": "ProcessLookupError:ESRCH", "all": "ProcessLookupError:ESRCH"}
    assert kill["error"] is None and out["after_kill"]["value"]["uid"] == 65534  # its init ignored it; the rollout never saw it
    assert out["memory"]["exception"] == "MemoryError"
    assert out["file_size"]["value"] == "OSError:EFBIG"


@pytest.mark.parametrize("level", ["strict", "no-seccomp"])
def test_every_escape_is_contained_with_a_root_rollout(targets, level):
    if os.geteuid() != 0:  # said, not silent: CI runs as root; a non-root run still does the unprivileged half below
        pytest.skip(f"the root half of the attack suite needs a root rollout; this run is uid {os.geteuid()}")
    ctx = {**targets, "level": level, "marker": f"{targets['marker']}r{level[0]}"}
    _assert_contained(attacks.run_attacks(ctx), level, ctx, unprivileged=False)


def test_every_escape_is_contained_with_an_unprivileged_rollout(targets):
    ctx = {**targets, "level": "strict", "marker": f"{targets['marker']}u"}
    out = _as_unprivileged(ctx)
    assert out["uid"] == (UNPRIVILEGED if os.geteuid() == 0 else os.geteuid()) != 0
    _assert_contained(out, "strict", ctx, unprivileged=True)


def test_cpu_time_is_capped_before_the_wall_clock_timeout():
    import time

    start = time.monotonic()
    result = IsolatedTool(attacks.spin, timeout=30, sandbox=sb.SandboxConfig(cpu_seconds=1)).invoke({})
    if result.error["type"] == "sandbox_unavailable":
        assert result.metadata["isolation"] == "refused"
        return
    assert result.error["type"] == "crash" and time.monotonic() - start < 20  # SIGXCPU at 1 s of CPU, not the 30 s timeout
    assert result.error["message"] == "tool 'spin' sandbox died (exit code 152)"  # bubblewrap's 128 + SIGXCPU (24)


def test_without_bubblewrap_every_level_but_rlimits_only_refuses_naming_it(monkeypatch):
    monkeypatch.setattr(sb, "bwrap_path", lambda: None)
    for level in ("strict", "no-seccomp"):
        result = IsolatedTool(attacks.whoami, timeout=10, level=level).invoke({})
        assert result.error["type"] == "sandbox_unavailable" and result.metadata["isolation"] == "refused"
        assert result.error["missing"] == ["bubblewrap (no bwrap on PATH)"] and ".ci/install-sandbox" in result.error["message"]
    default = IsolatedTool(attacks.whoami, timeout=10).invoke({})  # the default is strict, and never falls back in process
    assert default.error["type"] == "sandbox_unavailable" and default.metadata["sandbox"]["chosen_by"] == "default"
    low = IsolatedTool(attacks.whoami, timeout=10, level="rlimits-only").invoke({})
    assert low.ok and low.value["uid"] == os.getuid() and low.metadata["sandbox"]["level"] == "rlimits-only"
    assert "pid namespace" in low.metadata["sandbox"]["lowered"] and "seccomp filter" in low.metadata["sandbox"]["lowered"]


def test_without_seccomp_strict_refuses_and_no_seccomp_runs(monkeypatch):
    from agenttune_lib.tools.seccomp_policy import SeccompUnavailable

    def broken(allow_network=False):
        raise SeccompUnavailable("seccomp filter: the pyseccomp package is not installed (simulated)")

    monkeypatch.setattr(sb, "compile_filter", broken)
    strict = IsolatedTool(attacks.whoami, timeout=10).invoke({})
    assert strict.error["type"] == "sandbox_unavailable" and strict.error["missing"] == ["seccomp filter: the pyseccomp package is not installed (simulated)"]
    assert "level='no-seccomp'" in strict.error["message"]
    lower = IsolatedTool(attacks.whoami, timeout=10, level="no-seccomp").invoke({})
    available, why = _sandbox_available("no-seccomp")
    if available:
        assert lower.ok and lower.metadata["sandbox"]["lowered"] == ["seccomp filter"]
    else:
        assert lower.error["type"] == "sandbox_unavailable" and why


def test_namespaces_refused_by_the_kernel_is_a_refusal(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sb, "bwrap_path", lambda: str(fake))
    monkeypatch.setattr(sb, "_as_uid", lambda uid, paths, argv: argv)  # the fake runs as the caller
    result = IsolatedTool(attacks.whoami, timeout=10).invoke({})
    assert result.error["type"] == "sandbox_unavailable"
    assert result.error["missing"] == ["namespaces (bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged user namespaces.)"]


def test_a_protection_found_missing_at_start_refuses_the_call(monkeypatch):
    real = sb._bwrap_argv

    def writable_etc(*args, **kwargs):
        argv, mounts = real(*args, **kwargs)
        i = argv.index("/etc")
        assert argv[i - 1] == "--ro-bind"
        argv[i - 1] = "--bind"  # a mistake in the sandbox's setup: /etc mounted read-write
        return argv, mounts

    available, _ = _sandbox_available("strict")  # before the mistake is patched in
    monkeypatch.setattr(sb, "_bwrap_argv", writable_etc)
    result = IsolatedTool(attacks.whoami, timeout=10).invoke({})
    assert result.error["type"] == "sandbox_unavailable"
    if available:
        assert result.error["missing"] == ["read-only filesystem (/etc is writable)"]


def test_the_host_proc_found_at_start_refuses_the_call(monkeypatch):
    real = sb._bwrap_argv

    def host_proc(*args, **kwargs):
        argv, mounts = real(*args, **kwargs)
        i = argv.index("--proc")
        argv[i : i + 2] = ["--ro-bind", "/proc", "/proc"]  # a mistake in the sandbox's setup: the host's /proc
        return argv, mounts

    available, _ = _sandbox_available("strict")  # before the mistake is patched in
    monkeypatch.setattr(sb, "_bwrap_argv", host_proc)
    result = IsolatedTool(attacks.proc_view, timeout=10).invoke({"rollout_pid": os.getpid(), "secret": SECRET})
    assert result.error["type"] == "sandbox_unavailable" and result.value is None  # the tool never ran
    if available:
        assert result.error["missing"] == ["own /proc"]


def test_rlimits_only_still_caps_memory_and_file_size_and_says_what_it_lacks():
    tool = IsolatedTool(attacks.allocate, timeout=20, level="rlimits-only")
    result = tool.invoke({"gb": 2})
    assert result.error["exception"] == "MemoryError"
    big = IsolatedTool(attacks.big_file, timeout=20, sandbox=sb.SandboxConfig(level="rlimits-only", file_size_mb=2)).invoke({"mb": 3})
    assert big.value == "OSError:EFBIG"
    meta = big.metadata["sandbox"]
    assert meta["level"] == "rlimits-only" and meta["chosen_by"] == "caller"
    assert meta["lowered"] == [p for p in sb.LEVEL_PROTECTIONS["strict"] if p not in ("rlimits", "own session")]


def test_a_lowered_level_is_recorded_in_the_eventlog():
    tool = IsolatedTool(attacks.whoami, timeout=20, level="no-seccomp")
    model = Scripted([call("whoami"), "done"])
    log = run_episode(ReActStrategy(model), DictToolHarness({"whoami": tool}), {"prompt": "who", "answer": "done"})
    payload = next(e.payload for e in log if e.kind is EventKind.TOOL_RESULT)
    meta = payload["metadata"]["sandbox"]
    available, _ = _sandbox_available("no-seccomp")
    assert meta["level"] == "no-seccomp" and meta["chosen_by"] == "caller" and meta["lowered"] == ["seccomp filter"]
    if available:
        assert payload["metadata"]["isolation"] == "process" and "seccomp filter" not in meta["verified"]
    else:
        assert payload["error"]["type"] == "sandbox_unavailable"


def test_levels_are_validated():
    with pytest.raises(ValueError, match="SandboxConfig.level must be one of"):
        sb.SandboxConfig(level="loose")
    with pytest.raises(ValueError, match="level must be one of"):
        IsolatedTool(attacks.whoami, level="off")
