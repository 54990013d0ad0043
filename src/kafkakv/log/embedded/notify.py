"""Wake-ups when another process publishes to a partition.

Every publish is a ``pwrite`` of the partition's head file, which Linux reports through
inotify. :meth:`ChangeNotifier.wait_for_any` sleeps until an event arrives (then re-checks the
caller's condition) or the timeout passes. There is no thread of its own: of the threads
waiting at a time, one reads the inotify descriptor itself (it sleeps in ``poll``), counts
the events and wakes the others, which sleep on a condition; when it leaves, the next one
takes over. So a lone waiter, such as a replica's follower, is woken by the kernel directly,
with no hand-off between threads. Bursts are coalesced; see docs/embedded-log.md. Where
inotify is unavailable (not Linux, or the per-user instance limit is reached) waiting falls
back to polling every millisecond.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
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
_COALESCE_S = 0.0005  # events closer together than this are delivered together
_SLICE_S = 1.0  # a waiter re-checks its condition at least this often


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
        # Held as the plain lock (a C-level ``with``) and waited on through the condition.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._total = 0  # moves on every batch of events; what waiters compare
        self._reading = False  # a waiter is reading the descriptor (guarded by _mutex)
        self._sleepers = 0  # waiters asleep on _cond, whom a reader must wake (guarded too)
        self._last_event = 0.0  # monotonic time of the last batch of events
        self._watched: dict[str, int] = {}
        self._fd = -1
        self._wake_r, self._wake_w = -1, -1
        self._poller: select.poll | None = None
        self._closed = False
        self._libc = _libc()
        if self._libc is not None:
            fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                self._poller = select.poll()
                self._poller.register(fd, select.POLLIN)
                self._poller.register(self._wake_r, select.POLLIN)  # close() interrupts

    @property
    def uses_inotify(self) -> bool:
        return self._fd >= 0

    def _watch(self, head_path: str) -> bool:
        """Make sure ``head_path`` is watched; False when it cannot be (then poll)."""
        if self._fd < 0 or self._libc is None or self._closed:
            return False
        if head_path in self._watched:
            return True
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(head_path), _IN_MODIFY)
        if wd < 0:
            return False
        self._watched[head_path] = wd
        return True

    def wait_for(self, head_path: str, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Return True once ``ready()`` holds, False when ``timeout`` seconds pass first."""
        return self.wait_for_any([head_path], ready, timeout)

    def wait_for_any(
        self, head_paths: Sequence[str], ready: Callable[[], bool], timeout: float | None
    ) -> bool:
        """Like :meth:`wait_for`, woken by a publish to any of ``head_paths``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._mutex:
            watching = all([self._watch(path) for path in head_paths])
        while True:
            seen = self._total  # an int read whole under the GIL; compared under _mutex below
            if ready():
                return True
            remaining = _SLICE_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return False
            if not watching or self._closed:
                time.sleep(min(_POLL_S, remaining))
                continue
            with self._mutex:
                if self._total != seen:
                    continue  # events came while ready() ran: look again
                if self._reading or self._closed:
                    self._sleepers += 1
                    try:
                        self._cond.wait(min(remaining, _SLICE_S if self._reading else _POLL_S))
                    finally:
                        self._sleepers -= 1
                    continue
                self._reading = True
            self._read_events(min(remaining, _SLICE_S))

    def _read_events(self, timeout: float) -> None:
        """As the reading waiter: sleep in ``poll`` until events arrive or ``timeout`` passes,
        count them, and wake the other waiters (one of them reads next)."""
        arrived = False
        try:
            # In a stream of events, let them gather: waiters wake about 2,000 times a second
            # at most, rather than once per append. The first event after a quiet spell is
            # not delayed.
            pause = self._last_event + _COALESCE_S - time.monotonic()
            if pause > 0:
                time.sleep(min(pause, timeout))
            assert self._poller is not None
            if self._poller.poll(math.ceil(timeout * 1000)) and not self._closed:
                try:
                    arrived = len(os.read(self._fd, 65536)) >= _EVENT.size
                except BlockingIOError:  # another reader took them (no contextlib: 3 calls)
                    arrived = False
        finally:
            # The path of every wake-up: kept to the fewest calls (a lone waiter, such as a
            # replica's follower, wakes no one).
            with self._mutex:
                self._reading = False
                if arrived:
                    self._total += 1
                    self._last_event = time.monotonic()
                if self._sleepers:
                    self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiter and release the descriptors (once the reading waiter left)."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")  # interrupts the reading waiter's poll
            self._cond.notify_all()
            deadline = time.monotonic() + 2
            self._sleepers += 1  # the reading waiter wakes this one as it leaves
            while self._reading and time.monotonic() < deadline:
                self._cond.wait(0.1)
            self._sleepers -= 1
        for fd in (self._fd, self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._fd = self._wake_r = self._wake_w = -1
