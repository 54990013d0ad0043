"""Async updates on their way to the log: the bound on how many are unapplied, and the thread
that appends them in batches.

An async update must not wait for the log. It takes a slot (:class:`Slots`: at most
``max_in_flight`` updates unapplied), puts itself in the :class:`Sender`'s outbox (its ops
record, or for a ``put_async`` its pair, which the engine gathers with the puts queued next to
it into ``WRITE_MANY`` records) and returns. The sender thread wakes, lets a small batch grow
for a moment (Kafka's ``linger.ms``), and hands up to ``batch`` updates at a time to the
engine's send function, which appends them with one pipelined send per partition. Appliers
give the slots back. An update that waits asks the sender first (:meth:`Sender.wait_sent`),
so that it reaches the log after the async updates made before it.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kafkakv.gcpause import gc_paused
from kafkakv.log.base import Record, new_tuple
from kafkakv.map.futures import PutGroup
from kafkakv.map.ops import OpCode, encode_op, write_many_chunks

__all__ = ["Sender", "Slots", "records_of"]

#: One async update on its way: its partition and its ops record; or, for a ``put_async``
#: the engine gathers with others into a record as it sends them, its partition, its map
#: (a ``MapState``), store key, value and future.
Outgoing = tuple[int, Record] | tuple[int, Any, bytes, bytes, Any]


def records_of(
    queued: list[Outgoing], p: int, origin: bytes, max_record_bytes: int, seqs: Iterator[int]
) -> tuple[list[Record], list[tuple[int, Any]]]:
    """The ops records of partition ``p``'s queued updates, in their order: a record as it
    is; a run of puts of one map as ``WRITE_MANY`` records (cut as ``put_all``'s are, to
    ``max_record_bytes`` less the map's prefix), each numbered from ``seqs`` and returned
    with a :class:`~kafkakv.map.futures.PutGroup` of the run's futures, to be pending by that
    number. Sizes were checked when the puts were queued. Pure: no I/O, no lock."""
    records: list[Record] = []
    groups: list[tuple[int, Any]] = []
    run: list[Any] = []
    for item in queued:
        if len(item) == 2:
            if run:
                _gather(p, run, records, groups, origin, max_record_bytes, seqs)
                run = []
            records.append(item[1])
        else:
            if run and item[1] is not run[0][1]:
                _gather(p, run, records, groups, origin, max_record_bytes, seqs)
                run = []
            run.append(item)
    if run:
        _gather(p, run, records, groups, origin, max_record_bytes, seqs)
    return records, groups


def _gather(
    p: int,
    run: list[Any],
    records: list[Record],
    groups: list[tuple[int, Any]],
    origin: bytes,
    max_record_bytes: int,
    seqs: Iterator[int],
) -> None:
    """Append to ``records`` the ``WRITE_MANY`` records of ``run``, queued puts of one map
    in partition ``p``, and to ``groups`` the seq and :class:`PutGroup` of each."""
    state = run[0][1]
    keys = [item[2] for item in run]
    values: list[bytes | None] = [item[3] for item in run]
    start = 0
    for ks, vs in write_many_chunks(keys, values, max_record_bytes - len(state.prefix)):
        seq = next(seqs)
        groups.append((seq, PutGroup([item[4] for item in run[start : start + len(ks)]], p)))
        start += len(ks)
        value = encode_op(OpCode.WRITE_MANY, origin, seq, (ks, vs))
        records.append(new_tuple(Record, (state.prefix + ks[0], value, (), None, None, None)))


class Slots:
    """At most ``limit`` async updates unapplied. Taking and giving are counters (``next`` on
    an itertools.count is atomic under the GIL); only a caller over the limit takes a lock and
    sleeps, and givers wake it.

    A hot caller may take its slot inline, as :meth:`take` does: ``ticket = next(s.tickets)``,
    and if ``ticket - s.given > s.limit``, ``s.wait(ticket, timeout)``.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.tickets = itertools.count(1)
        self.given = 0  # written by appliers only, under the replica lock or _cond
        self._cond = threading.Condition(threading.Lock())
        self._sleepers = 0

    def take(self, timeout: float) -> bool:
        """Take a slot, waiting up to ``timeout`` seconds for one; False when none came."""
        ticket = next(self.tickets)
        return ticket - self.given <= self.limit or self.wait(ticket, timeout)

    def wait(self, ticket: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until ``ticket`` (from :attr:`tickets`) is within
        the limit; False when it did not come, its slot given back."""
        with self._cond:
            self._sleepers += 1
            try:
                if self._cond.wait_for(lambda: ticket - self.given <= self.limit, timeout):
                    return True
                self.given += 1  # give the unused ticket back
                return False
            finally:
                self._sleepers -= 1

    def give(self, n: int) -> None:
        """Give ``n`` slots back (their updates were applied or failed)."""
        if n:
            with self._cond:
                self.given += n
                if self._sleepers:
                    self._cond.notify_all()


class Sender:
    """The outbox of async updates and the loop of the thread that sends them (:meth:`run`).

    Writers append to :attr:`outbox` and, when :attr:`idle`, call :meth:`wake` (one wake-up
    per idle period, not one per update). ``send`` gets the batches; it must not raise. It
    may return a callable, which the thread runs once it counted the batch sent (see
    :meth:`wait_sent`).
    """

    def __init__(
        self,
        send: Callable[[list[Outgoing]], Callable[[], None] | None],
        *,
        batch: int = 5000,
        linger: float = 0.0005,
        wait_slice: float = 0.5,
    ) -> None:
        self.outbox: collections.deque[Outgoing] = collections.deque()
        self.ready = threading.Condition()
        #: The thread waits for work: a writer that appends should wake it.
        self.idle = False
        self._send = send
        self._batch = batch
        self._linger = linger
        self._slice = wait_slice
        self._closing = False  # drain: say when idle with an empty outbox
        self._stopped = False
        # Updates taken from the outbox, ever, and of those the ones whose send returned;
        # threads in wait_sent() (told when a send returns). Written under ``ready``.
        self._taken = 0
        self._sent = 0
        self._waiting = 0

    def wake(self) -> None:
        with self.ready:
            if self.idle:
                self.idle = False
                self.ready.notify()

    def run(self) -> None:
        """The sender thread: send what the outbox holds, in batches, until :meth:`stop`."""
        outbox, ready = self.outbox, self.ready
        while True:
            with ready:
                self.idle = True  # set before looking, so no append goes unnoticed
                if self._closing:
                    ready.notify_all()  # drain() waits for an idle sender and an empty outbox
                while not outbox and not self._stopped:
                    ready.wait(self._slice)
                self.idle = False
            if self._stopped:
                return
            if self._linger and len(outbox) < self._batch // 4:
                time.sleep(self._linger)  # let a batch gather: one append per batch
            with gc_paused():  # the batch is freed on return, inside the pause: see gcpause
                with ready:  # a batch is taken whole, or left whole to take_unsent()
                    outbox = self.outbox
                    if self._stopped:
                        return
                    popleft = outbox.popleft
                    batch = [popleft() for _ in range(min(len(outbox), self._batch))]
                    self._taken += len(batch)
                then = self._send(batch)
                with ready:
                    self._sent += len(batch)
                    if self._waiting:
                        ready.notify_all()
                del batch
                if then is not None:
                    then()

    def drain(self, deadline: float, alive: Callable[[], bool]) -> bool:
        """Wait until every update in the outbox was handed to the log and the thread is idle
        (True), or until ``deadline`` or the thread's death (``alive()`` False)."""
        ready, outbox = self.ready, self.outbox
        with ready:
            self._closing = True
            ready.notify_all()
            while outbox or not self.idle:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not alive():
                    return False
                ready.wait(min(remaining, self._slice))
        return True

    def busy(self) -> bool:
        """Whether updates are queued or being sent (a look without the lock)."""
        return bool(self.outbox) or not self.idle

    def wait_sent(self, deadline: float) -> bool:
        """Wait until every update queued before this call was handed to ``send`` and the
        send returned (True), or until ``deadline`` or :meth:`stop` (False). Updates queued
        meanwhile are not waited for."""
        with self.ready:
            target = self._taken + len(self.outbox)
            self._waiting += 1
            try:
                while self._sent < target:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._stopped:
                        return False
                    self.ready.wait(min(remaining, self._slice))
            finally:
                self._waiting -= 1
        return True

    def stop(self) -> None:
        """End the thread's loop: it takes no batch after this returns (one it took before
        is still being sent)."""
        with self.ready:
            self._stopped = True
            self.ready.notify_all()

    def take_unsent(self) -> list[Outgoing]:
        """The updates the thread never took, after :meth:`stop`. Each update is either here
        or was handed to ``send``, never both: the thread takes its batches under the same
        lock."""
        with self.ready:
            unsent, self.outbox = list(self.outbox), collections.deque()
        return unsent
