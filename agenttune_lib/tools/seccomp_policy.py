"""The seccomp filter every ``strict`` sandbox call runs under, compiled with libseccomp (via ``pyseccomp``) to BPF for bubblewrap.

Default allow, with EPERM for what a tool never needs and an escape would: tracing or reading
other processes (``ptrace``, ``process_vm_*``, ``pidfd_getfd``), new namespaces (``unshare``,
``setns``, namespace flags to ``clone``; ``clone3`` answers ENOSYS so libc falls back to ``clone``),
mounts, kernel keyrings, eBPF, perf, ``userfaultfd``, ``io_uring`` (a seccomp bypass), modules,
reboot/kexec, clocks, ``TIOCSTI`` terminal injection — and, unless network is allowed, every
socket family but ``AF_UNIX``: no TCP/UDP at all, not even the sandbox's own loopback.
"""
from __future__ import annotations

import errno
import functools
import os

__all__ = ["SeccompUnavailable", "compile_filter", "DENIED_SYSCALLS", "NAMESPACE_CLONE_FLAGS"]

#: Syscalls answered with EPERM (names missing on this architecture are skipped).
DENIED_SYSCALLS: tuple[str, ...] = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    "unshare", "setns",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "syslog", "quotactl", "lookup_dcookie", "open_by_handle_at", "name_to_handle_at",
    "iopl", "ioperm", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "vhangup", "uselib",
)
#: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET.
NAMESPACE_CLONE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_AF_UNIX = 1


class SeccompUnavailable(RuntimeError):
    """The filter cannot be built here (pyseccomp or libseccomp missing)."""


def compile_filter(allow_network: bool = False) -> int:
    """The BPF program in a fresh memfd, positioned at 0, for ``bwrap --seccomp FD`` (the caller closes it)."""
    program = _program(allow_network)
    fd = os.memfd_create("agenttune-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@functools.lru_cache(maxsize=2)
def _program(allow_network: bool) -> bytes:
    """The compiled BPF bytes (built once per network setting)."""
    try:
        import pyseccomp as seccomp
    except ImportError as exc:
        raise SeccompUnavailable(f"seccomp filter: the pyseccomp package is not installed ({exc})") from exc
    try:
        filt = seccomp.SyscallFilter(seccomp.ALLOW)
    except Exception as exc:  # libseccomp.so.2 missing or unusable
        raise SeccompUnavailable(f"seccomp filter: libseccomp is not usable ({type(exc).__name__}: {exc})") from exc
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        try:
            filt.add_rule(deny, name)
        except Exception:  # not a syscall on this architecture
            continue
    for flag in (1 << bit for bit in range(32) if NAMESPACE_CLONE_FLAGS >> bit & 1):  # one rule per flag: any one denies
        filt.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    filt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for request in (_TIOCSTI, _TIOCLINUX):
        filt.add_rule(deny, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
    if not allow_network:
        filt.add_rule(deny, "socket", seccomp.Arg(0, seccomp.NE, _AF_UNIX))
    fd = os.memfd_create("agenttune-seccomp-build", os.MFD_CLOEXEC)
    try:
        with os.fdopen(fd, "w+b") as buf:
            filt.export_bpf(buf)
            buf.flush()
            buf.seek(0)
            program = buf.read()
    except Exception as exc:
        raise SeccompUnavailable(f"seccomp filter: could not export BPF ({type(exc).__name__}: {exc})") from exc
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"seccomp filter: libseccomp exported {len(program)} bytes, not a BPF program")
    return program
