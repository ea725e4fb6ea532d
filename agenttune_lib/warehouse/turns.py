"""Turns on a DuckDB file across processes: an exclusive ``flock`` on a sidecar file, held while a process has the
warehouse attached.

DuckDB's own file lock cannot be waited on: a process that finds it taken can only sleep and try again, and a
process that uses the file in a loop re-takes it within microseconds of letting go, so a polling writer can wait
out its whole timeout. A blocked ``flock`` sleeps in the kernel and is woken the moment the holder lets go, so
processes take turns. The sidecar (``<file>.turn``) is used instead of the database file because DuckDB's own
``fcntl`` lock lives there, and on NFS ``flock`` is emulated with ``fcntl`` and would collide with it.
"""
from __future__ import annotations

import os
import threading
import weakref

try:
    import fcntl
except ImportError:  # not a POSIX system: no turns, DuckDB's lock alone decides
    fcntl = None  # type: ignore[assignment]

# Turns this process holds: a forked child closes its copies (a flock belongs to the open file, which fork
# shares, so a child that kept them would keep the parent's turn held after the parent let go or died).
_HELD: "weakref.WeakSet[FileTurn]" = weakref.WeakSet()


class TurnTimeout(TimeoutError):
    """The file's turn did not come within the timeout (another process held the warehouse all that time)."""


class FileTurn:
    """One process's turn on ``path`` (a DuckDB file): :meth:`take` blocks until it is this process's turn."""

    def __init__(self, path: str) -> None:
        self.sidecar = path + ".turn"
        self._fd: int | None = None

    def take(self, timeout_s: float) -> bool:
        """Wait for the turn (at most ``timeout_s``); False when the sidecar cannot be created (a read-only
        directory, or no ``flock`` on this system): then there is no turn to take and DuckDB's lock alone decides."""
        if fcntl is None:
            return False
        try:
            fd = os.open(self.sidecar, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not _wait_for_flock(fd, timeout_s):
                os.close(fd)  # the waiting thread's flock, if it still succeeds, is released with the file
                raise TurnTimeout(f"waited {timeout_s:.0f} s for {self.sidecar}: another process held the warehouse") from None
        except OSError:  # a filesystem without flock: no turns
            os.close(fd)
            return False
        self._fd = fd
        _HELD.add(self)
        return True

    def give(self) -> None:
        """Let the next process in (no-op when no turn is held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _HELD.discard(self)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)  # type: ignore[union-attr]
        finally:
            os.close(fd)


def _wait_for_flock(fd: int, timeout_s: float) -> bool:
    """A blocking ``flock`` with a timeout: the call waits in a daemon thread (``flock`` itself has none)."""
    done = threading.Event()
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # the fd was closed after a timeout, or the filesystem refused
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=wait, name="agenttune-warehouse-turn", daemon=True).start()
    return done.wait(max(timeout_s, 0.0)) and not failed


def _forget_in_child() -> None:
    for turn in list(_HELD):
        fd, turn._fd = turn._fd, None
        if fd is not None:
            os.close(fd)  # closes the child's copy only: the parent's turn stays the parent's
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
