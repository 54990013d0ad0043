"""Wake-ups when another process publishes to a partition.

Every publish is a ``pwrite`` of the partition's head file, which Linux reports through
inotify. One thread per open log reads the inotify descriptor and bumps one counter;
:meth:`ChangeNotifier.wait_for_any` sleeps on a condition until the counter moves (then
re-checks the caller's condition) or the timeout passes. The reader thread parks while nobody
waits and coalesces bursts; see docs/embedded-log.md. Where inotify is unavailable (not Linux, or the per-user instance limit is
reached) waiting falls back to polling every millisecond.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["ChangeNotifier"]

_IN_MODIFY = 0x00000002
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")
_POLL_S = 0.001
_COALESCE_S = 0.0005


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name or "libc.so.6", use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return lib
    except (OSError, AttributeError):
        return None


class ChangeNotifier:
    """Per-log watcher of head files."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._total = 0  # moves on every batch of events; what waiters compare
        self._waiters = 0  # threads inside wait_for_any; the reader thread parks at zero
        self._watched: dict[str, int] = {}
        self._fd = -1
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None
        self._closed = False
        self._libc = _libc()
        if self._libc is not None:
            fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    @property
    def uses_inotify(self) -> bool:
        return self._fd >= 0

    def _watch(self, head_path: str) -> bool:
        """Make sure ``head_path`` is watched; False when it cannot be (then poll)."""
        if self._fd < 0 or self._libc is None:
            return False
        if head_path in self._watched:
            return True
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(head_path), _IN_MODIFY)
        if wd < 0:
            return False
        self._watched[head_path] = wd
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kafkakv-notify", daemon=True)
            self._thread.start()
        return True

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._closed:
            with self._cond:
                # Nobody waiting: leave events in the kernel queue, which merges repeats of
                # one head into a single event, instead of waking for each append.
                while self._waiters == 0 and not self._closed:
                    self._cond.wait()
            poller.poll()
            if self._closed:
                return
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                return
            if len(data) >= _EVENT.size:
                # Waiters re-check their own condition, so which head moved does not matter.
                with self._cond:
                    self._total += 1
                    self._cond.notify_all()
                # Coalesce: under a stream of appends, wake waiters at most once per pause
                # instead of once per append (each wake-up costs the writers GIL time). The
                # first event after a quiet spell is still delivered at once.
                time.sleep(_COALESCE_S)

    def wait_for(self, head_path: str, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Return True once ``ready()`` holds, False when ``timeout`` seconds pass first."""
        return self.wait_for_any([head_path], ready, timeout)

    def wait_for_any(
        self, head_paths: Sequence[str], ready: Callable[[], bool], timeout: float | None
    ) -> bool:
        """Like :meth:`wait_for`, woken by a publish to any of ``head_paths``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            watching = all([self._watch(path) for path in head_paths])
            self._waiters += 1
            if self._waiters == 1:
                self._cond.notify_all()  # the reader thread may be parked: resume reading
        try:
            return self._wait(watching, ready, deadline)
        finally:
            with self._cond:
                self._waiters -= 1

    def _wait(self, watching: bool, ready: Callable[[], bool], deadline: float | None) -> bool:
        while True:
            with self._cond:
                seen = self._total
            if ready():
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            if watching:
                with self._cond:
                    if self._total == seen:
                        # A bounded sleep: a publish by a process that lost its inotify event
                        # (queue overflow) is still seen within a second.
                        self._cond.wait(1.0 if remaining is None else min(remaining, 1.0))
            else:
                time.sleep(_POLL_S if remaining is None else min(_POLL_S, remaining))

    def close(self) -> None:
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=2)
        for fd in (self._fd, self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._fd = self._wake_r = self._wake_w = -1
        with self._cond:
            self._cond.notify_all()
