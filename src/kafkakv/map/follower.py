"""The replica's follower: applies what other processes append, for every held partition.

One :class:`~kafkakv.log.follow.Follower` loop over the ops partitions the replica holds. A
writer of this process applies up to its own record itself (taking in every other record
before it), so the follower stays out of the way while local writers are busy, and applies
what arrives after them once they have been quiet for ``_LOCAL_GRACE``. A stalled partition
is not waited on; the loop looks every ``_STALL_RETRY`` whether its missing function is
registered now, and applies it again if so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

from kafkakv.errors import ClosedError, PartitionStalledError
from kafkakv.log.base import Log, TopicPartition
from kafkakv.log.follow import Follower
from kafkakv.map.machine import PartitionMachine

__all__ = ["STALL_RETRY", "WAIT_SLICE", "ReplicaFollower"]

WAIT_SLICE = 0.5  # the follower thread re-checks its state this often
STALL_RETRY = 0.05  # a stalled partition looks for its missing function this often
_FOLLOW_PAUSE = 0.0002  # what the follower waits after a wake-up before taking the lock
_LOCAL_GRACE = 0.005  # the follower idles this long after a local writer applied
_RETRY_PAUSE = 1.0  # the follower waits this long after the log could not answer

WaitAny = Callable[[Mapping[TopicPartition, int], float | None], set[TopicPartition]]


class ReplicaFollower:
    """Follows ``ops`` for the partitions of ``machines`` (their applied positions say where).

    What it needs of the replica: ``lock`` (the replica lock, held to apply), ``apply(p)``
    (apply what ``p`` has; lock held), ``stopped()``, ``busy()`` (updates of this replica are
    pending: a wake-up may be its own), ``last_local()`` (``time.monotonic`` when a local
    writer last started or finished), ``stalled`` (partition -> its stall) and ``resume(p)``
    (un-stall ``p`` or raise PartitionStalledError), and ``failed(exc)`` for a log that failed
    under it. ``wait_any`` is the log's, as the replica's own appends see it."""

    def __init__(
        self,
        log: Log,
        ops: str,
        what: str,
        machines: Mapping[int, PartitionMachine],
        lock: AbstractContextManager[bool],
        apply: Callable[[int], object],
        stopped: Callable[[], bool],
        busy: Callable[[], bool],
        last_local: Callable[[], float],
        stalled: Mapping[int, PartitionStalledError],
        resume: Callable[[int], None],
        failed: Callable[[Exception], None],
        wait_any: WaitAny,
    ) -> None:
        self.ops, self.machines, self.stalled = ops, machines, stalled
        self._lock, self._apply, self._stopped, self._busy = lock, apply, stopped, busy
        self._last_local, self._resume, self._failed = last_local, resume, failed
        self._follower = Follower(
            log, what, wait_slice=WAIT_SLICE, retry_pause=_RETRY_PAUSE, wait_any=wait_any
        )

    def run(self) -> None:
        """Background: follow until the replica stops, or the log fails (``failed``)."""
        try:
            self._follower.run(
                self._positions, self._handle, self._stopped, also_ready=self._resumed
            )
        except ClosedError:
            return
        except Exception as exc:  # the log failed under us: say so to every caller
            if not self._stopped():
                self._failed(exc)

    def _positions(self) -> dict[TopicPartition, int] | None:
        """Where the follower waits: every held partition that is not stalled."""
        quiet = time.monotonic() - self._last_local()
        if quiet < _LOCAL_GRACE:
            # Threads of this process are appending and applying up to their own records,
            # which takes in every other process's record before them. Stay out of their way
            # (no wait on the log, so no wake-up per append); whatever arrives after the last
            # of them is applied once they have been quiet for _LOCAL_GRACE.
            time.sleep(_LOCAL_GRACE - quiet)
            return None
        self._follower.wait_slice = STALL_RETRY if self.stalled else WAIT_SLICE
        ops, stalled = self.ops, self.stalled
        return {(ops, p): m.applied for p, m in self.machines.items() if p not in stalled}

    def _handle(self, ready: Sequence[TopicPartition]) -> bool:
        if self._busy():
            # A wake-up may come from this replica's own updates: a writer about to apply
            # its record, the sender's batch growing. Give them a moment rather than compete
            # for the lock. An update from elsewhere to an idle replica is applied at once.
            time.sleep(_FOLLOW_PAUSE)
        for _, p in ready:
            with self._lock:
                if not self._stopped():
                    self._apply(p)
        return True

    def _resumed(self) -> list[TopicPartition]:
        """The stalled partitions whose missing function is registered now, un-stalled."""
        resumed = []
        for p in list(self.stalled):
            try:
                self._resume(p)
            except PartitionStalledError:
                continue
            resumed.append((self.ops, p))
        return resumed
