"""The one loop that follows partitions of a log: wait until records arrive, hand them over.

A map replica's follower thread, a directory's thread and ``kafkakv log tail`` all do the same
thing: wait on every partition they follow at once (:meth:`~kafkakv.log.base.Log.wait_any`,
which blocks on a notification, not a poll), read what arrived, and ride out a log that cannot
answer for a while. :class:`Follower` is that loop; its owner says where each partition stands,
what to do with the partitions that are ready, and when to stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from kafkakv.errors import ClosedError, LogUnavailableError, OperationTimeoutError
from kafkakv.log.base import Log, TopicPartition

__all__ = ["Follower"]

log = logging.getLogger("kafkakv.log")


class Follower:
    """Follows partitions of ``log`` on behalf of ``what`` (named in log lines).

    ``wait_slice`` bounds each wait, so that a stop is noticed within it; after the log could
    not answer (:class:`~kafkakv.errors.LogUnavailableError`,
    :class:`~kafkakv.errors.OperationTimeoutError`) the loop waits ``retry_pause`` and goes on.
    ``wait_any`` replaces ``log.wait_any`` (an owner's from :meth:`Log.own_appends`).
    """

    def __init__(
        self,
        log: Log,
        what: str,
        *,
        wait_slice: float = 0.5,
        retry_pause: float = 1.0,
        wait_any: Callable[[Mapping[TopicPartition, int], float | None], set[TopicPartition]]
        | None = None,
    ) -> None:
        self.log = log
        self._wait_any = log.wait_any if wait_any is None else wait_any
        self.what = what
        self.wait_slice = wait_slice
        self.retry_pause = retry_pause

    def run(
        self,
        positions: Callable[[], Mapping[TopicPartition, int] | None],
        handle: Callable[[Sequence[TopicPartition]], bool],
        stopped: Callable[[], bool],
        *,
        idle_timeout: float | None = None,
        also_ready: Callable[[], Sequence[TopicPartition]] | None = None,
    ) -> None:
        """Loop until ``stopped()``: wait until a partition of ``positions()`` (partition ->
        the offset to read next) may have a record there, then call ``handle`` with the
        partitions that may, which returns whether it found anything.

        ``positions()`` may return None to skip a round without waiting (its owner has just
        slept, or wants to), or an empty mapping to wait a slice with nothing to follow.
        ``also_ready()``, when given, names partitions to hand over this round whatever the
        log says (a partition that can go on for another reason).

        Returns when stopped, when the log was closed while stopping, or once
        ``idle_timeout`` seconds passed without ``handle`` finding anything. Raises
        :class:`~kafkakv.errors.ClosedError` when the log was closed under a follower that
        was not stopping, and any other error of the log or of ``handle``.
        """
        idle_since = time.monotonic()
        while not stopped():
            try:
                waiting = positions()
                if waiting is None:
                    continue
                extra = also_ready() if also_ready is not None else ()
                slice_ = self.wait_slice
                if idle_timeout is not None:
                    left = idle_timeout - (time.monotonic() - idle_since)
                    if left <= 0:
                        return
                    slice_ = min(slice_, left)
                if extra:
                    slice_ = 0.0
                if waiting:
                    ready = [*self._wait_any(waiting, slice_), *extra]
                else:
                    if slice_:
                        time.sleep(slice_)
                    ready = list(extra)
                if ready and handle(ready):
                    idle_since = time.monotonic()
            except ClosedError:
                if stopped():
                    return
                raise
            except (LogUnavailableError, OperationTimeoutError) as exc:
                # Brokers down or a leader moving: following resumes when the log answers.
                if stopped():
                    return
                log.warning("%s cannot follow for now: %s", self.what, exc)
                time.sleep(self.retry_pause)
