"""Flushing: the latest value of each changed key to the data topic, in one fenced batch.

A step of a partition's machine says when a flush is due; the engine then requests one
(:meth:`Flusher.request`), and the flusher's thread (:meth:`Flusher.run`) carries it out. A flush
opens the partition's transactional writer (fencing any other replica's flusher), catches the
replica up with the ops topic so that the last flush point is known, takes the plan and values
under the replica lock (:meth:`~kafkakv.map.machine.PartitionMachine.flush_plan`), and writes
data, flush point and ``FLUSHED`` mark in one atomic batch
(:func:`~kafkakv.map.machine.flush_records`). Nothing of a failed attempt is written.

What it needs of the replica it is given: the machines, the replica lock, a way to catch up
(``catch_up(p, offset, deadline)``, the engine's ``apply_until``) and to check the replica is
usable, and, through the extension point, the per-key columns of the batch (versions and
deadlines).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

import msgpack

from kafkakv.errors import FencedError, LogError, LogUnavailableError, OperationTimeoutError
from kafkakv.gcpause import gc_paused
from kafkakv.log.base import Log, LogWriter, Record, left
from kafkakv.map.machine import PartitionMachine, flush_records
from kafkakv.map.metrics import FlushTimes
from kafkakv.map.topics import MapTopics

__all__ = ["Flusher"]

log = logging.getLogger("kafkakv.map")

#: The deadline of each record key of a flush (None: none), replica lock held.
Deadlines = Callable[[Sequence[bytes]], list[int | None]]


class Flusher:
    """One replica's flushes: one at a time per partition, fenced against other replicas'.

    ``closing()`` says the replica stopped taking updates (no flush to start), ``stopped()``
    that it applies nothing more (no flush to queue again). With ``versions`` each key's
    version (the offset of its last change) goes into the batch; with ``deadlines`` each
    key's deadline."""

    def __init__(
        self,
        log: Log,
        topics: MapTopics,
        origin: bytes,
        machines: Mapping[int, PartitionMachine],
        lock: AbstractContextManager[bool],
        timeout: float,
        catch_up: Callable[[int, int, float], None],
        check_usable: Callable[[], None],
        closing: Callable[[], bool],
        stopped: Callable[[], bool],
        versions: bool = False,
        deadlines: Deadlines | None = None,
    ) -> None:
        self.log, self.topics, self.origin, self.machines = log, topics, origin, machines
        self._lock, self._timeout = lock, timeout
        self._catch_up, self._check_usable = catch_up, check_usable
        self._closing, self._stopped = closing, stopped
        self._versions, self._deadlines = versions, deadlines
        self.flush_times = FlushTimes()  # of the flushes that wrote
        #: One flush per partition at a time here.
        self.locks = {p: threading.Lock() for p in machines}
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._writers: dict[int, LogWriter] = {}

    def request(self, p: int) -> None:
        """Queue a flush of ``p`` for the thread (a step said one is due). Cheap."""
        self._queue.put(p)

    def stop(self) -> None:
        """End :meth:`run` once the flush under way, if any, is over."""
        self._queue.put(None)

    def close(self) -> None:
        """Close the writers (replica lock held, the thread stopped)."""
        for writer in self._writers.values():
            writer.close()

    def run(self) -> None:
        """Background: carry out the requested flushes until :meth:`stop` or closing. A
        flush that fails loses nothing (the ops stay): it is logged and tried again later."""
        while True:
            p = self._queue.get()
            if p is None or self._closing():  # closing: no flush to start
                return
            try:
                self.flush(p)
            except FencedError:
                log.info("flush of %s[%d] fenced by another replica", self.topics.data, p)
            except Exception as exc:  # a failed flush loses nothing: ops stay; retry later
                if self._closing():  # close() began meanwhile: not a failure
                    return
                log.warning("flush of %s[%d] failed: %s", self.topics.data, p, exc)
            finally:
                with self._lock:
                    if self.machines[p].flush_ended() and not self._stopped():
                        self._queue.put(p)

    def flush(self, p: int, deadline: float | None = None) -> int | None:
        """Flush partition ``p`` now; return the ops offset covered, or None when there was
        nothing to do, the request was stale, or keys of a map not open here are dirty.
        Waits until ``deadline`` (``time.monotonic``; default: the map's ``timeout`` from
        now) to begin, for the request's append and for a flush of ``p`` already under way
        here, then :class:`~kafkakv.errors.OperationTimeoutError`; the catch-up before the
        decision shares that deadline.

        One flush per partition at a time in this replica. Opening the partition's flush
        writer fences any other flusher; the replica then catches up with the ops topic, so
        the last flush point is known before deciding; values are collected under the lock;
        data, flush point and ``FLUSHED`` mark go out in one atomic batch. When another
        replica's flusher fenced this one meanwhile, the writer is reopened and the whole
        decision made again, until the map's ``timeout`` (then
        :class:`~kafkakv.errors.FencedError`); after another failure of the transaction,
        once. Nothing was written by a failed attempt, nothing is lost.
        """
        started = time.perf_counter()
        if deadline is None:
            deadline = time.monotonic() + self._timeout
        covered = self._flush(p, deadline)
        if covered is not None:
            self.flush_times.observe(time.perf_counter() - started)
        return covered

    def _flush(self, p: int, deadline: float) -> int | None:
        self._check_usable()
        request = msgpack.packb([self.origin, self.machines[p].applied])  # who asked, how far
        self.log.append(self.topics.flush, p, [Record(None, request)], timeout=left(deadline))
        other_failures, pause = 0, 0.001
        lock = self.locks[p]
        patience = left(deadline)
        if not lock.acquire(timeout=patience):
            raise OperationTimeoutError(  # the time left of the caller's timeout, not _timeout
                f"flush of {self.topics.data}[{p}] did not begin within {patience:.2f} s "
                "(what was left of the timeout): another flush of it here took that long"
            )
        try:
            while True:
                try:
                    return self._flush_once(p, deadline)
                except LogUnavailableError:
                    self._drop_writer(p)
                    raise
                except FencedError:
                    # Another replica's flusher opened the writer since: nothing was written
                    # here. Decide again with a fresh writer (the other's mark, once applied,
                    # may leave nothing to do) until the timeout: two flushers that fence each
                    # other take turns, and a pause of random length breaks the tie. (Once
                    # only, a flush lost to a replica flushing on its own schedule raised.)
                    self._drop_writer(p)
                    if time.monotonic() + pause >= deadline:
                        raise
                except LogError:
                    # The transaction lost a race with another flusher (Kafka may answer
                    # such a commit with an unexpected error): decide again, once.
                    self._drop_writer(p)
                    other_failures += 1
                    if other_failures > 1:
                        raise
                time.sleep(random.uniform(0, pause))
                pause = min(2 * pause, 0.05)
        finally:
            lock.release()

    def _drop_writer(self, p: int) -> None:
        writer = self._writers.pop(p, None)
        if writer is not None:
            writer.close()

    def _flush_once(self, p: int, deadline: float) -> int | None:
        ops, data = self.topics.ops, self.topics.data
        writer = self._writers.get(p)
        if writer is None:
            writer = self._writers[p] = self.log.writer(f"{ops}.flush.{p}", timeout=left(deadline))
        end = self.log.end_offset(ops, p, timeout=left(deadline))
        self._catch_up(p, end - 1, deadline)
        machine = self.machines[p]
        with gc_paused():  # a record per dirty key: see gcpause
            with self._lock:
                plan = machine.flush_plan()
                if plan is None:  # stale, nothing dirty, or keys of a map not open here
                    return None
                covered, keys = plan
                values = machine.flush_values(keys)
                # A key's version is the offset of its last change, which dirty holds.
                versions = [machine.dirty[k] for k in keys] if self._versions else None
                deadlines = None if self._deadlines is None else self._deadlines(keys)
                ids = machine.ids.snapshot()  # as of covered, as the values are
            # Outside the lock, which appliers are waiting for:
            records, mark = flush_records(
                keys, values, covered, self.origin, versions, deadlines, ids
            )
            del keys, values
            # The mark last: replicas reading the ops wait the least (LogWriter.append).
            writer.append({(data, p): records, (ops, p): [mark]}, timeout=left(deadline))
            count = len(records)
            del records  # before collection resumes: see gcpause
        log.debug("flushed %d keys of %s[%d] up to ops offset %d", count, data, p, covered)
        return covered
