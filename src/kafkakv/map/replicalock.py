"""The replica lock: appliers hold it while they change a replica's stores, readers while they
need several looks at one state (``len`` of a map with expiry, a value and its version, a
snapshot, a deep check).

CPython's locks are not fair. A thread that takes the lock again as soon as it lets go of it
(``len(m)`` in a loop, or an applier with a long backlog) wins every time against a thread
that the release woke: the first one is running already, the woken one still has to be
scheduled and get the GIL. A starved applier waits past its timeout while nothing is applied; a
starved reader hangs. :class:`ReplicaLock` hands the lock over instead: a thread that finds it
taken says so before it blocks, and a thread about to take it while others wait steps aside
until one of them has had it (up to :data:`STEP_ASIDE`), unless it holds the lock already
(reentrant: a reader may apply, as a listener's update does, and the threads waiting are
waiting for it). One turn is enough to end a starvation, and costs a thread-to-thread hand-over
only where there was contention.

>>> lock = ReplicaLock()
>>> with lock:
...     with lock:
...         lock.waiting
0
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

__all__ = ["STEP_ASIDE", "ReplicaLock"]

#: The longest a thread about to take the lock lets waiting threads go first (seconds).
STEP_ASIDE = 0.05
_NAP = 0.00005  # a pause while others wait: long enough for a woken thread to be scheduled


class ReplicaLock:
    """A reentrant lock (``with lock:``, ``acquire(blocking, timeout)``, ``release()``, as a
    ``threading.RLock``) that a thread taking it back to back cannot keep from the threads
    waiting for it. Uncontended it costs an RLock and one attribute test more; a thread that
    must wait pays for a small lock around the count of waiters."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count_lock = threading.Lock()
        #: Threads blocked on the lock now, and how many such waits ended with the lock.
        self.waiting = 0
        self.granted = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        lock = self._lock
        if self.waiting and blocking and not lock._is_owned():  # type: ignore[attr-defined]
            # Let one of the threads that wait go first, a moment at most.
            start, turn = time.monotonic(), self.granted + 1
            until = start + (STEP_ASIDE if timeout < 0 else min(STEP_ASIDE, timeout))
            while self.waiting and self.granted < turn and time.monotonic() < until:
                time.sleep(_NAP)
            if timeout >= 0:
                timeout = max(0.0, timeout - (time.monotonic() - start))
        if lock.acquire(False):
            return True
        if not blocking:
            return False
        with self._count_lock:
            self.waiting += 1
        got = False
        try:
            got = lock.acquire(True, timeout)
            return got
        finally:
            with self._count_lock:
                self.waiting -= 1
                self.granted += got

    def release(self) -> None:
        self._lock.release()

    def held(self) -> bool:
        """Whether the calling thread holds the lock."""
        return bool(self._lock._is_owned())  # type: ignore[attr-defined]

    __enter__ = acquire  # ``with lock:``, one Python call fewer than a method calling it

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()
