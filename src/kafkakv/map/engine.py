"""The replica engine: the lifecycle and the apply loop of a replica, around
:mod:`kafkakv.map.machine`.

One engine follows one set of map topics for the partitions it holds, on behalf of one or more
maps that share those topics. The protocol's decisions are made by one
:class:`~kafkakv.map.machine.PartitionMachine` per partition; the engine is the shell that
reads records, hands them to the machine, and carries its steps out:

* **open** (:meth:`ReplicaEngine.start`): bootstrap each held partition
  (:mod:`kafkakv.map.bootstrap`), apply the ops up to the log's end, then start the threads:
  the follower (:mod:`kafkakv.map.follower`), the sender (:mod:`kafkakv.map.updates`), the
  flusher (:mod:`kafkakv.map.flusher`) and those of features;
* **apply** (:meth:`~ReplicaEngine.apply_until`, ``_apply_available``, ``_carry_out``): in log
  order under the replica lock, read a batch, ``apply_batch``, write the step's changes with its
  positions in one store write, publish the position, request a flush when one is due, tell the
  step observers, then resolve futures and tell taps and listeners. Any thread may apply: a
  writer waiting for its own record applies up to it itself (no hand-off on the hot path);
  the follower applies updates made elsewhere; barriers (:mod:`kafkakv.map.barriers`) apply
  up to a point;
* **flush** when a step says one is due (:mod:`kafkakv.map.flusher`);
* **close**: stop taking updates, drain what is in flight
  (:meth:`~kafkakv.map.updates.Updates.drain`), stop the threads, close the stores.

Features that watch or extend the apply step (expiry's reaper and the log's clock, metrics) are
modules of their own, built by their own functions and registered with one extension point,
:class:`~kafkakv.map.hooks.Hooks` (step observers, bootstrap and flush hooks, threads,
lifecycle); the change feed and listeners hear each change through the map's taps and
listeners (:mod:`kafkakv.map.listeners`). An engine never started, filled from the log, is a
reference replica (:mod:`kafkakv.map.reference`).

Locks: ``_lock`` (re-entrant) guards the stores and the machines, and is held while observers,
listeners and future callbacks run, so they see changes in log order. The barrier groups and
the sender (:mod:`kafkakv.map.sender`) have locks of their own, never held during I/O.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from kafkakv import functions
from kafkakv.errors import (
    ClosedError,
    OperationTimeoutError,
    PartitionStalledError,
    UnknownFunctionError,
)
from kafkakv.gcpause import gc_paused
from kafkakv.log.base import Log, Record, new_tuple
from kafkakv.map import metrics
from kafkakv.map.barriers import Barriers
from kafkakv.map.bootstrap import READ_BATCH, Bootstrap
from kafkakv.map.flusher import Flusher
from kafkakv.map.follower import WAIT_SLICE, ReplicaFollower
from kafkakv.map.futures import complete, fail
from kafkakv.map.hooks import Hooks
from kafkakv.map.keyspace import KeySpace
from kafkakv.map.listeners import tell, tell_run
from kafkakv.map.machine import (
    CHANGE,
    RESULT,
    ApplyError,
    ErrorLog,
    MapState,
    MapTable,
    PartitionMachine,
    Step,
    Tap,
)
from kafkakv.map.ops import Op
from kafkakv.map.reads import ReadGate
from kafkakv.map.reaper import reaper_of
from kafkakv.map.replicalock import ReplicaLock
from kafkakv.map.settings import MapSettings
from kafkakv.map.topics import MapTopics
from kafkakv.map.updates import Updates
from kafkakv.store.base import Positions

__all__ = ["ReplicaEngine"]

log = logging.getLogger("kafkakv.map")

_NO_CHANGES: dict[bytes, bytes | None] = {}


class ReplicaEngine:
    """See the module docstring. Built and started by :class:`~kafkakv.db.Database`."""

    def __init__(
        self,
        log: Log,
        topics: MapTopics,
        partition_count: int,
        held: Sequence[int],
        maps: Sequence[MapState],
        settings: MapSettings,
        max_record_bytes: int,
    ) -> None:
        self.log = log
        self.topics = topics
        self.partition_count = partition_count
        self.held = tuple(sorted(held))
        self.holds = frozenset(self.held).__contains__  # holds(p): is partition p held here
        self.settings = settings
        self.max_record_bytes = max_record_bytes
        self.maps = list(maps)
        self.keyspace = KeySpace(
            partition_count, bool(settings.hash_tags), shared=bool(maps[0].prefix)
        )
        self.table = MapTable(maps)
        for state in maps:
            state.versions = {} if settings.versions else None
            state.expiries = {} if settings.expiry else None
        #: A writer may apply its own record from the bytes it sent (not a map with expiry,
        #: which decides by the timestamp the log gives the record).
        self._applies_own = not settings.expiry
        #: ... and a batch of several records, where the log stores one with nothing between.
        self._applies_own_batches = log.appends_contiguously
        self.origin = os.urandom(8)
        #: The log's calls for the appends this replica applies itself, which do not wake its
        #: follower (see Log.own_appends): the blocking updates and barriers, whose caller
        #: applies through its own record (apply_until). Should that fail (a timeout, a stall),
        #: the follower applies the record at its next wake-up, within WAIT_SLICE.
        self._own = log.own_appends(self.origin)
        self._lock = ReplicaLock()  # handed over to waiting threads: see map.replicalock
        #: The protocol state of each held partition (see kafkakv.map.machine).
        self.machines = {
            p: PartitionMachine(
                p, self.table, self.origin, settings.flush_period, topics.ops, partition_count
            )
            for p in self.held
        }
        # Step events not run yet, shared by every apply: a listener that updates the map
        # applies a step of its own, whose events run after the ones before them.
        self._events: collections.deque[tuple[int, Any, Any]] = collections.deque()
        self.errors = ErrorLog()
        self._closed = False  # close() began: no new updates; what is in flight drains
        self._stopped = False  # the threads stop, nothing more is applied
        self._disowned = False  # inherited through fork: see disown
        self._failure: BaseException | None = None
        #: Partitions this replica stopped applying, at a record it cannot apply as the others
        #: do (see _stall). Read without the lock on every read: a dict, empty as a rule.
        self.stalled: dict[int, PartitionStalledError] = {}
        #: Open while a local read may skip every check (open, not failed, nothing stalled);
        #: see _checks_changed. Every map of this engine reads it (kafkakv.map.reads).
        self.read_gate = ReadGate()
        self._threads: list[threading.Thread] = []
        #: The update path (kafkakv.map.updates): its outbox, pending futures and slots.
        self.updates = updates = Updates(
            log,
            topics.ops,
            partition_count,
            self.origin,
            max_record_bytes,
            settings.max_in_flight,
            settings.timeout,
            self._lock,
            self._own.append,
            self.read_gate,
            self.check_usable,
            self.check_partitions,
            self.apply_until,
            self._apply_sent_to,
            WAIT_SLICE,
        )
        self.submit, self.submit_put = updates.submit, updates.submit_put
        self.submit_many, self.pending_updates = updates.submit_many, updates.pending_updates
        self._pending, self._slots, self._sender = updates.pending, updates.slots, updates.sender
        self.barriers = Barriers(
            log,
            topics.ops,
            self.machines,
            settings.barriers,
            settings.timeout,
            self.keyspace,
            self.apply_until,
            self._own.append,
            self.check_usable,
        )
        self.sync, self.catch_up = self.barriers.sync, self.barriers.catch_up
        self.end_watches = self.barriers.end_watches  # read by the maps' linearizable reads
        # -- the features beside the apply step, through the extension point (map.hooks)
        self.hooks = hooks = Hooks()
        #: The reaper of a map with expiry, and the log's clock as this replica can tell.
        self.reaper = reaper_of(self, hooks)
        self.log_clock = self.reaper.log_clock
        self.log_now, self.read_now = self.reaper.log_now, self.reaper.read_now
        metrics.register(self, hooks)
        self._observers = hooks.steps  # the same list: a feature may register later
        self.flusher = Flusher(
            log,
            topics,
            self.origin,
            self.machines,
            self._lock,
            settings.timeout,
            self.apply_until,
            self.check_usable,
            lambda: self._closed or self._stopped,
            lambda: self._stopped,
            bool(settings.versions),
            hooks.flush_deadlines,
        )
        self.flush, self.flush_times = self.flusher.flush, self.flusher.flush_times
        self.bootstrap = Bootstrap(
            log,
            topics,
            self.table,
            self.maps,
            self.keyspace,
            self.errors,
            bool(settings.versions or settings.expiry),  # headers say something: read them
            hooks.loaded,
        )

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Bootstrap every held partition, then start the follower, sender and flusher."""
        deadline = time.monotonic() + self.settings.timeout * max(1, len(self.held))
        for p in self.held:
            self.bootstrap.start(self.machines[p], deadline)
            with self._lock:
                self._applied_to_end(p, deadline)
        Hooks.run(self.hooks.started)
        threads = [
            (self._follow, "follower"),
            (self.updates.run_sender, "sender"),
            (self.flusher.run, "flusher"),
        ]
        threads.extend((target, name) for name, target in self.hooks.threads)
        for target, name in threads:
            thread = threading.Thread(
                target=target, name=f"kafkakv-{self.topics.data}-{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def close(self, timeout: float | None = None) -> int:
        """Stop taking updates, drain the ones in flight, stop the threads, close the stores.

        Draining sends the async updates still queued and applies every update that reached
        the log, so that each future resolves with its true result; it takes at most
        ``timeout`` seconds (default: the map's timeout). An update still unresolved then
        fails with :class:`~kafkakv.errors.ClosedError`, whose message says whether it never
        reached the log or reached it with an outcome this replica did not see. Returns the
        number of updates that failed so, or failed to reach the log while draining.
        Idempotent (later calls return 0).
        """
        if self._closed or self._disowned:
            return 0
        self._closed = True
        self._checks_changed()
        undelivered = self.updates.undelivered
        Hooks.run(self.hooks.closing)
        limit = self.settings.timeout if timeout is None else timeout
        deadline = time.monotonic() + max(0.0, limit)
        if self._failure is None and self._threads:
            self.updates.drain(
                deadline,
                self._threads[1].is_alive,  # the sender's: see start
                self.machines,
                self.stalled,
                self._apply_available,
                lambda: self._failure is not None,
            )
        self._stopped = True
        self._sender.stop()
        self.flusher.stop()
        Hooks.run(self.hooks.stopped)
        # The follower needs no join: it checks _stopped under the lock before applying.
        for thread in self._threads[1:]:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        with self._lock:
            failed = self.updates.fail_unresolved(self.maps[0].name)
            self.flusher.close()
            for state in self.maps:
                state.store.close()
        self.barriers.shared.wake_all()
        return failed + self.updates.undelivered - undelivered

    def disown(self, message: str) -> None:
        """In a child made by fork: refuse every use with ClosedError(``message``) from now on,
        and never touch the locks, threads, writers or stores the parent owns (the threads are
        gone, and a lock one of them held stays held)."""
        self._disowned = True
        self._stopped = True
        self._failure = ClosedError(message)
        self._checks_changed()

    def _checks_changed(self) -> None:
        """Called whenever closing, a failure or a stall changes what check_usable and
        check_partitions say."""
        self.read_gate.open = not (
            self._closed or self._stopped or self._failure is not None or self.stalled
        )

    @property
    def undelivered(self) -> int:
        """Async updates that failed before reaching the log (see kafkakv.map.updates)."""
        return self.updates.undelivered

    def check_usable(self) -> None:
        if self._closed:
            raise ClosedError(f"map {self.maps[0].name!r} is closed")
        if self._failure is not None:
            raise self._failure

    def check_partitions(self, partitions: Iterable[int]) -> None:
        """Raise :class:`~kafkakv.errors.PartitionStalledError` if one of ``partitions`` is
        stalled and cannot resume yet (its missing function is still not registered)."""
        for p in partitions:
            if p in self.stalled:
                self._resume_or_raise(p)

    def _resume_or_raise(self, p: int) -> None:
        stall = self.stalled.get(p)
        if stall is None:
            return
        if stall.function is not None and _registered(stall.function):
            # Registered since: applying goes on (from this thread or the follower's).
            self.stalled.pop(p, None)
            self._checks_changed()
            log.warning(
                "replica of %s resumes applying partition %d: function %r is registered now",
                self.topics.data,
                p,
                stall.function,
            )
            return
        raise stall

    def _check_applying(self, p: int) -> None:
        """apply_until's check: closing still applies (draining), stopping does not."""
        if self._failure is not None:
            raise self._failure
        if self._stopped:
            raise ClosedError(f"map {self.maps[0].name!r} is closed")
        if p in self.stalled:
            self._resume_or_raise(p)

    def paused(self) -> contextlib.AbstractContextManager[bool]:
        """Nothing is applied to the stores while this is held (the replica lock: reentrant,
        the same object each call, and threads already waiting for it go first): updates and
        the follower wait. Keep it short; writers waiting past their timeout raise
        OperationTimeoutError."""
        return self._lock

    # -- keys and partitions ------------------------------------------------------------
    def partition_of(self, record_key: bytes) -> int:
        return self.keyspace.partition_of(record_key)

    def positions(self) -> dict[int, Positions]:
        with self._lock:
            return {p: Positions(m.applied, m.flushed) for p, m in self.machines.items()}

    # -- change feeds (kafkakv.map.feed) --------------------------------------------------
    def add_tap(self, state: MapState, tap: Tap) -> dict[int, Positions]:
        """Call ``tap`` with every change of map ``state`` applied from now on, and return
        the positions now: the tap gets exactly the changes at or after them, in log order
        per partition (both are taken under the replica lock)."""
        with self._lock:
            self.check_usable()
            state.taps.append(tap)
            return self.positions()

    def remove_tap(self, state: MapState, tap: Tap) -> None:
        with self._lock, contextlib.suppress(ValueError):
            state.taps.remove(tap)

    def _apply_sent_to(self, partitions: list[int]) -> None:
        """In the sender thread, after a send: apply ``partitions`` unless another thread is
        applying (it will apply what was sent)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            for p in partitions:
                if not self._stopped:
                    self._apply_available(p)
        finally:
            self._lock.release()

    # -- applying -----------------------------------------------------------------------
    def apply_until(
        self,
        p: int,
        offset: int,
        deadline: float,
        own: Sequence[Record] = (),
        ops: Sequence[Op | None] = (),
    ) -> None:
        """Return once ``offset`` of partition ``p`` is applied, applying it here if need be.

        ``own`` is the batch of records this replica appended, the last at ``offset``, if it
        was one: when everything before them is applied, they are applied as they are, without
        reading them back (the log holds exactly these bytes there; for a batch of several,
        only a log that ``appends_contiguously``), each as its op in ``ops`` without decoding
        it where one is given (what :func:`~kafkakv.map.ops.sent_op` returned for it). Raises
        OperationTimeoutError at ``deadline``; the update may still apply later.
        """
        machine = self.machines[p]
        first = offset - len(own) + 1  # of the own batch
        while machine.applied <= offset:
            if self._failure is not None or self._stopped or p in self.stalled:
                self._check_applying(p)  # raises, or resumes a stalled partition
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._lock.acquire(timeout=remaining):
                raise OperationTimeoutError(
                    f"ops offset {offset} of {self.topics.ops}[{p}] was not applied in time; "
                    "the update may still be applied later"
                )
            try:
                if machine.applied > offset:  # applied while this thread waited (the follower)
                    progressed = True
                # A map with expiry decides by the record's timestamp, which the log gives
                # it: it reads the records back rather than apply the bytes sent.
                elif (
                    own
                    and machine.applied == first
                    and (len(own) == 1 or self._applies_own_batches)
                    and p not in self.stalled
                    and self._applies_own
                ):
                    if len(own) == 1:  # a put: no comprehension on the sync path
                        mine = [new_tuple(Record, (own[0][0], own[0][1], (), None, p, first))]
                    else:
                        mine = [
                            new_tuple(Record, (r[0], r[1], (), None, p, at))
                            for at, r in enumerate(own, first)
                        ]
                    self._carry_out(p, machine.apply_batch(mine, offset + 1, ops or None))
                    progressed = True  # or stalled there: the loop's check raises it
                else:
                    try:
                        progressed = self._apply_available(p, until=offset, deadline=deadline)
                    except OperationTimeoutError:  # a read that got no answer in what was
                        progressed = False  # left (at most KafkaLog's 2 s): again, till deadline
            finally:
                self._lock.release()
            if not progressed and machine.applied <= offset:
                left = deadline - time.monotonic()  # the read above took its share
                self.log.wait(self.topics.ops, p, machine.applied, max(0.0, left))

    def _apply_available(
        self, p: int, limit: int = 50_000, until: int | None = None, deadline: float | None = None
    ) -> bool:
        """Read and apply what partition ``p`` has: up to ``limit`` records, or only until
        offset ``until`` is applied; each read waits no later than ``deadline``
        (``time.monotonic``; None: the log's own patience). Lock held."""
        machine, ops = self.machines[p], self.topics.ops
        applied = 0
        while applied < limit and p not in self.stalled:
            with gc_paused():  # thousands of short-lived objects per batch: see gcpause
                if deadline is None:
                    records, after = self.log.read_batch(
                        ops, p, machine.applied, max_records=READ_BATCH
                    )
                else:
                    records, after = self.log.read_within(
                        ops, p, machine.applied, deadline - time.monotonic(), max_records=READ_BATCH
                    )
                if not records:
                    # Offsets with nothing to apply (Kafka's transaction markers): step over.
                    applied += self.step_over(p, after)
                    break
                self._carry_out(p, machine.apply_batch(records, after))
                applied += len(records)
                del records  # before collection resumes: see gcpause
            if p in self.stalled or (until is not None and machine.applied > until):
                break
        return applied > 0

    def step_over(self, p: int, after: int) -> bool:
        """Move partition ``p`` on to ``after`` past offsets with nothing to apply, stores
        included; False when ``after`` is not ahead. Lock held, or an engine never started."""
        step = self.machines[p].step_over(after)
        if step is not None:
            self._carry_out(p, step)
        return step is not None

    def apply_records(self, p: int, records: Sequence[Record], after: int) -> None:
        """Apply ``records`` of partition ``p``, which the caller read from the applied
        position on, and step past them to ``after``. Lock held, or an engine never started
        (a reference replica: see kafkakv.map.reference)."""
        self._carry_out(p, self.machines[p].apply_batch(records, after))

    def _carry_out(self, p: int, step: Step) -> None:
        """Do what a step of partition ``p``'s machine decided: note its errors and stall,
        write its changes with its positions to every store (one write each), publish the
        position, queue a flush, then resolve futures and tell listeners. Lock held."""
        if step.errors:
            self.errors.extend(step.errors)
        if step.stall is not None:
            self._stall(p, *step.stall)
        position = {p: new_tuple(Positions, (step.applied, step.flushed))}  # step.positions
        changes = step.changes
        for state in self.maps:
            state.store.write(changes.get(id(state), _NO_CHANGES), position)
        # Only now: threads that check the position without the lock find the data there.
        self.machines[p].advance(step)
        if step.flush_due:
            self.flusher.request(p)
        for observer in self._observers:
            observer(p, step)
        events, pending = self._events, self._pending
        events.extend(step.events)
        freed = 0
        while events:
            kind, target, arg = events.popleft()
            if kind >= CHANGE:  # a change, or a bulk batch's run of them
                if kind == CHANGE:
                    tell(target, p, arg)
                else:
                    tell_run(target, p, arg)
                continue
            future = pending.pop(target, None)
            if future is not None:
                freed += future.slot
                if kind == RESULT:
                    complete(future, arg)
                else:
                    fail(future, arg)
        if freed:  # a sync update holds no slot: no call
            self._slots.give(freed)

    def _stall(self, p: int, offset: int, key: bytes | None, exc: UnknownFunctionError) -> None:
        """Stop applying ``p`` at the record at ``offset`` (see PartitionStalledError). Lock
        held."""
        stall = PartitionStalledError(
            f"this replica stopped applying {self.topics.ops}[{p}] at offset {offset}: the "
            f"update there calls function {exc.name!r}, which is not registered in this "
            "process. The other replicas may have applied it, so this one waits rather than "
            "skip it: register the function (applying resumes) or restart with it",
            partition=p,
            offset=offset,
            function=exc.name,
        )
        if p not in self.stalled:
            log.error("%s", stall)
            self.errors.append(ApplyError(p, offset, str(stall), key, self.topics.ops))
        self.stalled[p] = stall
        self._checks_changed()

    def _follow(self) -> None:
        """Background: apply what other processes append (see kafkakv.map.follower)."""
        ReplicaFollower(
            self.log,
            self.topics.ops,
            f"replica of {self.topics.data}",
            self.machines,
            self._lock,
            self._apply_available,
            lambda: self._stopped,
            lambda: bool(self._pending),
            lambda: self.updates.last_local,
            self.stalled,
            self._resume_or_raise,
            self._follow_failed,
            self._own.wait_any,
        ).run()

    def _follow_failed(self, exc: Exception) -> None:
        """The log failed under the follower: say so to every caller."""
        log.error("replica of %s stopped following: %s", self.topics.data, exc)
        self._failure = exc
        self._checks_changed()
        with self._lock:
            self.updates.fail_pending(list(self._pending), exc)

    def _applied_to_end(self, p: int, deadline: float) -> None:
        """Open, after ``p``'s bootstrap: apply its ops up to the log's end offset now (one
        offsets query, then reads of 5000 ops), and store the positions. Lock held."""
        machine = self.machines[p]
        end = self.log.end_offset(self.topics.ops, p)
        if end > machine.applied:
            # A stall does not fail the open: reads of p raise it, and errors() shows it.
            with contextlib.suppress(PartitionStalledError):
                self.apply_until(p, end - 1, deadline)
        else:  # persist the positions even when there is nothing to apply
            for state in self.maps:
                state.store.write({}, {p: Positions(machine.applied, machine.flushed)})


def _registered(name: str) -> bool:
    try:
        functions.lookup(name)
    except UnknownFunctionError:
        return False
    return True
