"""Expiry's reaper: the keys whose deadline passed, proposed for removal by the log's clock.

A map with expiry registers a :class:`Reaper` with the engine's extension point
(:class:`~kafkakv.map.hooks.Hooks`): it observes every applied step (the keys given a deadline,
the log's clock at the records that carried one), receives the deadlines a bootstrap loads, and
runs a thread that appends an ``EXPIRE`` op for each key once its deadline passes. Every replica
removes the key when applying that op, so stores and the data topic converge; the op's own
timestamp decides, so one proposed early changes nothing and the key comes back here.

It also keeps the log's clock as this replica can tell (:mod:`kafkakv.map.logclock`), which
reads of a map with expiry go by (:meth:`Reaper.read_now`). Costs: an idle map, no CPU (the
thread sleeps until the earliest deadline); one barrier per partition to measure the clock at
open and after a proposal came too early; one append per key reaped.
"""

from __future__ import annotations

import heapq
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from kafkakv.errors import KafkaKVError
from kafkakv.log.base import Log, Record, left
from kafkakv.map.hooks import Hooks
from kafkakv.map.logclock import LogClock
from kafkakv.map.machine import MapState, MapTable, Step
from kafkakv.map.ops import BARRIER_VALUE, OpCode
from kafkakv.map.settings import MapSettings
from kafkakv.map.topics import MapTopics

__all__ = ["Reaper", "Replica", "reaper_of"]

log = logging.getLogger("kafkakv.map")

_WAIT_SLICE = 0.5  # the reaper re-checks its state this often
_RETRY_PAUSE = 1.0  # it waits this long after the log could not answer
_REAP_JITTER = 0.05  # it waits up to this long after a deadline (fewer duplicates)

#: Append an ``EXPIRE`` op: ``propose(deadline, record key, partition)``; raises KafkaKVError
#: when it cannot (closing, too many updates in flight).
Propose = Callable[[int, bytes, int], None]


class Replica(Protocol):
    """What :func:`reaper_of` needs of the replica it reaps for (the engine is one)."""

    @property
    def log(self) -> Log: ...

    @property
    def topics(self) -> MapTopics: ...

    @property
    def held(self) -> Sequence[int]: ...

    @property
    def table(self) -> MapTable: ...

    @property
    def settings(self) -> MapSettings: ...

    def paused(self) -> AbstractContextManager[bool]: ...

    def partition_of(self, record_key: bytes) -> int: ...

    def submit(
        self,
        state: MapState | None,
        code: OpCode,
        record_key: bytes,
        p: int,
        args: Sequence[Any],
        wait: bool,
    ) -> object: ...


def reaper_of(replica: Replica, hooks: Hooks) -> Reaper:
    """The reaper of ``replica``, and the log's clock as it can tell: registered with the
    replica's ``hooks`` when its maps have expiry, unregistered (a clock that reads go by,
    nothing reaped) otherwise. It proposes each key as an async ``EXPIRE`` update."""

    def propose(deadline: int, key: bytes, p: int) -> None:
        replica.submit(None, OpCode.EXPIRE, key, p, (deadline,), False)

    settings = replica.settings
    reaper = Reaper(
        replica.log,
        replica.topics.ops,
        replica.held,
        replica.table,
        replica.paused(),
        replica.partition_of,
        propose,
        settings.timeout,
    )
    if settings.expiry:
        reaper.register(hooks)
    return reaper


class Reaper:
    """The deadlines of a replica's keys and the log's clock; see the module docstring.

    ``lock`` is the replica lock (the clock changes under it only, and a key's deadline is
    checked under it before it is proposed); ``partition_of`` maps a record key to its
    partition; ``timeout`` bounds a measurement of the clock."""

    def __init__(
        self,
        log: Log,
        ops: str,
        held: Sequence[int],
        table: MapTable,
        lock: AbstractContextManager[bool],
        partition_of: Callable[[bytes], int],
        propose: Propose,
        timeout: float,
    ) -> None:
        self.log, self.ops, self.held, self.table = log, ops, held, table
        self._lock, self._partition_of, self._propose = lock, partition_of, propose
        self._timeout = timeout
        #: The log's clock as this replica can tell (see kafkakv.map.logclock), unless the
        #: log stamps records with this machine's clock (Log.clock_is_local): then read it.
        self.log_clock = LogClock()
        self.clock_is_local = log.clock_is_local
        #: Keys to reap, ``(when, deadline, record key)``, earliest first, ``when`` by the
        #: log's clock; ``_reaping`` holds each ``(deadline, key)``.
        self._heap: list[tuple[float, int, bytes]] = []
        self._reaping: set[tuple[int, bytes]] = set()
        self._wake = threading.Condition(threading.Lock())
        self._stopped = False

    # -- the extension point's hooks --------------------------------------------------
    def register(self, hooks: Hooks) -> None:
        """Register with the engine's extension point: observe steps and loaded deadlines,
        give the deadlines of a flush, measure the clocks once open, run the thread."""
        hooks.steps.append(self.observe)
        hooks.deadlines_loaded.append(self.schedule)
        hooks.flush_deadlines = self.deadlines
        hooks.started.append(self.measure_clocks)
        hooks.threads.append(("reaper", self.run))
        hooks.stopped.append(self.stop)

    def observe(self, p: int, step: Step) -> None:
        """A step observer: what a step of ``p`` tells the reaper: the log's clock at the
        latest expiry record it applied (an ``EXPIRE`` decided too early says the estimate
        ran ahead: measure the clock again before the next proposal), and the keys to reap.
        Replica lock held."""
        if not (step.expiring or step.log_time):
            return
        if step.log_time:
            mono = _mono_ms()
            if step.early:
                self.log_clock.contradicted(p, step.early, mono)
            self.log_clock.observe(p, step.log_time, mono)
        self.schedule(step.expiring)

    def schedule(self, expiring: Sequence[tuple[int, bytes]], delay: float = 0.0) -> None:
        """Reap each ``(deadline, record key)`` ``delay`` ms after its deadline, by the log's
        clock (a key already waiting with that deadline is not added twice)."""
        if not expiring:
            return
        with self._wake:
            heap, reaping = self._heap, self._reaping
            earliest = heap[0][0] if heap else None
            for deadline, key in expiring:
                if (deadline, key) in reaping:
                    continue
                reaping.add((deadline, key))
                heapq.heappush(heap, (deadline + delay, deadline, key))
            if earliest is None or (heap and heap[0][0] < earliest):
                self._wake.notify()

    def deadlines(self, record_keys: Sequence[bytes]) -> list[int | None]:
        """The deadline of each record key (None: none), for a flush. Replica lock held."""
        out: list[int | None] = []
        for key in record_keys:
            state = self.table.state_for(key)
            if state is None or not state.expiries:
                out.append(None)
            else:
                out.append(state.expiries.get(key[len(state.prefix) :]))
        return out

    def stop(self) -> None:
        """End :meth:`run` (at once, or after the key it is proposing)."""
        self._stopped = True
        with self._wake:
            self._wake.notify_all()

    # -- the log's clock ----------------------------------------------------------------
    def log_now(self) -> float | None:
        """The log's clock now as this replica can tell, in ms since the epoch: this
        machine's wall clock where the log stamps with it (Log.clock_is_local), else the
        estimate (the least over the held partitions, a lower bound: see
        kafkakv.map.logclock); None while it has no sample (no record with a ttl applied,
        the reaper has not measured yet)."""
        if self.clock_is_local:
            return time.time() * 1000
        return self.log_clock.earliest(_mono_ms())

    def read_now(self) -> float:
        """:meth:`log_now` for reads of a map with expiry: while there is no sample, no key
        reads as expired (late, never early; the reaper measures the clock at once)."""
        now = self.log_now()
        return -math.inf if now is None else now

    def _partition_now(self, p: int) -> float | None:
        """The log's clock of partition ``p`` for the reaper (see :meth:`log_now`); None until
        measured, and again after an ``EXPIRE`` that the estimate made too early."""
        if self.clock_is_local:
            return time.time() * 1000
        if not self.log_clock.fresh(p):
            return None
        return self.log_clock.now(p, _mono_ms())

    def measure_clocks(self) -> None:
        """At open, after bootstrap: measure the log's clock of each partition whose keys
        have deadlines (one barrier each), so that reads and ``ttl()`` right after open go
        by a fresh estimate rather than by records replayed long after they were stamped.
        Nothing for a log that stamps with this machine's clock; should the log not answer,
        the reaper measures later."""
        if self.clock_is_local:
            return
        with self._wake:
            keys = [key for _, _, key in self._heap]
        found: set[int] = set()
        for key in keys:  # until every held partition is found: one key will do for most
            found.add(self._partition_of(key))
            if len(found) == len(self.held):
                break
        for p in sorted(found):
            if not self._measure_clock(p):
                return

    def _measure_clock(self, p: int) -> bool:
        """Append a barrier to ``p`` and read back the timestamp the log gave it: a fresh
        sample of the log's clock there (one append and one read). False when the log did
        not answer within the map's timeout."""
        ops = self.ops
        deadline = time.monotonic() + self._timeout
        try:
            barrier = [Record(None, BARRIER_VALUE)]
            offset = self.log.append(ops, p, barrier, timeout=left(deadline))
            while time.monotonic() < deadline and not self._stopped:
                records, _ = self.log.read_batch(ops, p, offset, max_records=1)
                if records and records[0].offset == offset:
                    mono = _mono_ms()
                    with self._lock:  # the clock changes under the replica lock only
                        self.log_clock.measured(p, records[0].timestamp or 0, mono)
                    return True
                time.sleep(0.01)  # a reader not caught up with the append yet
        except KafkaKVError as exc:
            if not self._stopped:
                log.warning("could not read the clock of %s[%d]: %s", ops, p, exc)
        return False

    # -- the thread ---------------------------------------------------------------------
    def run(self) -> None:
        """Background: when a key's deadline passes by the log's clock (this replica's lower
        bound of it, :class:`~kafkakv.map.logclock.LogClock`), propose an ``EXPIRE`` op for
        it. Sleeps until the earliest deadline. Replicas reap the same key independently,
        each after a random 0-50 ms, and skip a key already removed. Before the first
        proposal for a partition, and after one came too early, it measures the log's clock
        there, unless the log stamps with this machine's clock (then it reads that)."""
        heap = self._heap
        while not self._stopped:
            measure = None
            due: list[tuple[float, int, bytes]] = []
            with self._wake:
                wait = _WAIT_SLICE
                while heap and not self._stopped:
                    when, deadline, key = heap[0]
                    p = self._partition_of(key)
                    now = self._partition_now(p)
                    if now is None:
                        measure = p
                        break
                    if when > now:
                        wait = min(wait, (when - now) / 1000)
                        break
                    due.append(heapq.heappop(heap))
                    self._reaping.discard((deadline, key))
                if not due and measure is None:
                    self._wake.wait(max(wait, 0.001))
                    continue
            if measure is not None and not self._measure_clock(measure):
                time.sleep(_RETRY_PAUSE)  # the log did not answer: try again later
            if not due:
                continue
            time.sleep(random.uniform(0, _REAP_JITTER))
            for _, deadline, key in due:
                if self._stopped:
                    return
                self._expire(deadline, key)

    def _expire(self, deadline: int, key: bytes) -> None:
        state = self.table.state_for(key)
        if state is None or state.expiries is None:
            return
        user_key = key[len(state.prefix) :]
        with self._lock:
            if state.expiries.get(user_key) != deadline or state.store.get(user_key) is None:
                return  # put again, removed, or reaped by another replica meanwhile
        p = self._partition_of(key)
        try:
            self._propose(deadline, key, p)
        except KafkaKVError as exc:  # closing, or too many in flight: the next replica reaps
            if not self._stopped:
                log.warning("could not reap key %r of %s: %s", key, state.name, exc)
                now = self._partition_now(p) or float(deadline)
                self.schedule([(deadline, key)], max(0.0, now - deadline) + 1000.0)


def _mono_ms() -> float:
    """This process's monotonic clock in ms: what the log's clock is estimated against (it
    does not move when the wall clock is set)."""
    return time.monotonic() * 1000
