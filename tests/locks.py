"""Lock files held by another process, as the embedded log's writers take them (``flock``):
one place that knows how a test holds such a lock and how it checks one is held."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from tests.waiting import wait_for

__all__ = ["held", "is_held", "wait_until_held"]


def is_held(path: str | os.PathLike[str]) -> bool:
    """Whether some process holds ``path``'s flock: try to take it without waiting, and let go
    at once if that worked. Creates the file if it is missing."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases it if this call took it
    return False


def wait_until_held(path: str | os.PathLike[str], timeout: float = 30.0) -> None:
    """Return once another process holds ``path``; fail the test after ``timeout`` seconds."""
    wait_for(lambda: is_held(path), timeout, f"another process to take {path}")


@contextmanager
def held(path: str | os.PathLike[str]) -> Iterator[int]:
    """Util-linux ``flock`` holds ``path`` (and sleeps) for the block; yields its pid once the
    lock is taken. On leaving, its process group is killed: the sleeping child has the lock too."""
    proc = subprocess.Popen(["flock", os.fspath(path), "sleep", "60"], start_new_session=True)
    try:
        wait_until_held(path)
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
