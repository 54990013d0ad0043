"""The replica engine: the threads and I/O around :mod:`kafkakv.map.machine`.

One engine follows one set of map topics for the partitions it holds, on behalf of one or more
maps that share those topics. The protocol's decisions are made by one
:class:`~kafkakv.map.machine.PartitionMachine` per partition; the engine is the shell that
reads records, hands them to the machine, and carries its steps out. It

* **bootstraps** each partition: the data topic up to its end (taking the flush point recorded
  there), then the ops after that point; a persistent store resumes at its own offset instead;
* **applies** ops in log order under one lock: read a batch, ``apply_batch``, write the step's
  changes with its positions in one store write, publish the position, resolve futures and
  tell listeners. Any thread may do it: a writer waiting for its own record applies up to it
  itself (no hand-off to another thread on the hot path), and a background thread follows the
  partitions for updates made elsewhere;
* **sends** async updates in batches from a sender thread, with at most ``max_in_flight``
  unapplied;
* **shares barriers**: a reader joins the next barrier of a partition; one reader per group
  appends it and applies up to it, the others wait on the same group;
* **flushes** when a step says one is due: the latest value of each changed key, a flush point
  for the data topic and a ``FLUSHED`` mark for the ops topic, in one fenced atomic batch.

Locks: ``_lock`` (re-entrant) guards the stores and the machines, and is held while listeners
and future callbacks run, so they see changes in log order. The barrier groups
(:mod:`kafkakv.map.barriers`) and the sender (:mod:`kafkakv.map.sender`) have locks of their
own, never held during I/O.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

from kafkakv import functions
from kafkakv.errors import (
    ClosedError,
    DecodeError,
    KafkaKVError,
    LogUnavailableError,
    OperationTimeoutError,
    PartitionStalledError,
    RecordTooLargeError,
    UnknownFunctionError,
)
from kafkakv.gcpause import gc_paused
from kafkakv.log.base import Log, Record, left, new_tuple
from kafkakv.map import metrics
from kafkakv.map.barriers import Barriers
from kafkakv.map.bootstrap import READ_BATCH, Bootstrap
from kafkakv.map.dedup import numbering
from kafkakv.map.flusher import Flusher
from kafkakv.map.follower import STALL_RETRY, WAIT_SLICE, ReplicaFollower
from kafkakv.map.futures import BatchFuture, BatchPart, OpFuture, PutGroup, complete, fail
from kafkakv.map.hooks import Hooks
from kafkakv.map.keyspace import RESERVED_KEYS, KeySpace, check_update_key
from kafkakv.map.listeners import tell
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
from kafkakv.map.ops import (
    PAIR_SLACK,
    Op,
    OpCode,
    decode_op,
    encode_op,
    sent_op,
    write_many_chunks,
)
from kafkakv.map.reads import EndWatch, ReadGate
from kafkakv.map.reaper import Reaper
from kafkakv.map.replicalock import ReplicaLock
from kafkakv.map.sender import Outgoing, Sender, Slots, records_of
from kafkakv.map.settings import MapSettings
from kafkakv.map.topics import MapTopics
from kafkakv.store.base import Positions

__all__ = ["ReplicaEngine"]

log = logging.getLogger("kafkakv.map")

_SEND_BATCH = 5000  # async updates appended in one batch at most (at most READ_BATCH)
_APPLY_SENT_BELOW = _SEND_BATCH // 4
"""The sender applies what it sent itself (where the log stores on send) only for batches
smaller than this: a few updates waiting for their answers. Larger batches come from a stream
of async updates, for which the follower applying while the sender sends is faster."""
_LINGER = 0.0005  # how long the sender lets a small batch grow (Kafka's linger.ms)
_NO_CHANGES: dict[bytes, bytes | None] = {}
#: A ``put_async`` queued for the sender (see Outgoing): partition, map, store key, value, future.
QueuedPut = tuple[int, MapState, bytes, bytes, OpFuture]
_RESERVED = frozenset(RESERVED_KEYS)


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
        #: Each partition's update numbers (see kafkakv.map.dedup: dense in a partition, so
        #: the replicas' tables of applied ids stay small; unique in this replica): lane 0
        #: for the updates appended here and waited for, lane 1 for those the sender hands
        #: to the log (a pipelined producer on Kafka), which overtake each other.
        self._seqs = [iter(numbering(p, partition_count)) for p in range(partition_count)]
        self._sent_seqs = [iter(numbering(p, partition_count, 1)) for p in range(partition_count)]
        self._lock = ReplicaLock()  # handed over to waiting threads: see map.replicalock
        #: The protocol state of each held partition (see kafkakv.map.machine).
        self.machines = {
            p: PartitionMachine(
                p, self.table, self.origin, settings.flush_period, topics.ops, partition_count
            )
            for p in self.held
        }
        self._pending: dict[int, OpFuture] = {}
        # Step events not run yet, shared by every apply: a listener that updates the map
        # applies a step of its own, whose events run after the ones before them.
        self._events: collections.deque[tuple[int, Any, Any]] = collections.deque()
        self.errors = ErrorLog()
        self._slots = Slots(settings.max_in_flight)
        # Where the log stores a batch before send() returns, the sender applies a small one
        # at once (if no other thread is applying): the updates' futures resolve without
        # waiting for the follower's wake-up, and the time that applying takes lets the next
        # batch grow, so the sender needs no linger of its own. Large batches, and every batch
        # elsewhere (Kafka), the follower applies.
        self._apply_sent = log.stores_on_send
        self._sender = Sender(
            self._send_batch,
            batch=_SEND_BATCH,
            linger=0.0 if self._apply_sent else _LINGER,
            wait_slice=WAIT_SLICE,
        )
        #: sync() needs no barrier record: the log's end offset is authoritative.
        offset_barriers = settings.barriers == "offset" or (
            settings.barriers == "auto" and log.end_offset_is_linearizable
        )
        self._last_local = 0.0  # monotonic time a local writer last started or finished
        self._closed = False  # close() began: no new updates; what is in flight drains
        self._stopped = False  # the threads stop, nothing more is applied
        self._disowned = False  # inherited through fork: see disown
        #: Async updates that failed before reaching the log (counted for close()'s report).
        self.undelivered = 0
        self._failure: BaseException | None = None
        #: Partitions this replica stopped applying, at a record it cannot apply as the others
        #: do (see _stall). Read without the lock on every read: a dict, empty as a rule.
        self.stalled: dict[int, PartitionStalledError] = {}
        #: Open while a local read may skip every check (open, not failed, nothing stalled);
        #: see _checks_changed. Every map of this engine reads it (kafkakv.map.reads).
        self.read_gate = ReadGate()
        #: Where a linearizable read finds the replica at the log's end without asking the log
        #: (see kafkakv.map.reads.PyEndWatch): one watch per partition, by number, when the
        #: replica holds them all and barriers are end offsets. Each is noted by _apply_to_end
        #: of its partition; None otherwise (each read then catches up).
        self.end_watches: tuple[EndWatch, ...] | None = (
            tuple(EndWatch(self.machines[p]) for p in range(self.partition_count))
            if offset_barriers and len(self.machines) == self.partition_count
            else None
        )
        self._threads: list[threading.Thread] = []
        self.barriers = Barriers(
            log,
            topics.ops,
            self.machines,
            settings.barriers,
            offset_barriers,
            settings.timeout,
            self.keyspace,
            self.apply_until,
            self._own.append,
            self.check_usable,
            self.end_watches,
        )
        self.sync, self.catch_up = self.barriers.sync, self.barriers.catch_up
        # -- the features beside the apply step, through the extension point (map.hooks)
        self.hooks = hooks = Hooks()
        #: The reaper of a map with expiry, and the log's clock as this replica can tell.
        self.reaper = Reaper(
            log,
            topics.ops,
            self.held,
            self.table,
            self._lock,
            self.partition_of,
            self._propose_expire,
            settings.timeout,
        )
        self.log_clock = self.reaper.log_clock
        self.log_now, self.read_now = self.reaper.log_now, self.reaper.read_now
        if settings.expiry:
            self.reaper.register(hooks)
        hooks.started.append(functools.partial(metrics.track, self))
        hooks.closing.append(functools.partial(metrics.forget, self))
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
            (self._sender.run, "sender"),
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
        undelivered = self.undelivered
        Hooks.run(self.hooks.closing)
        limit = self.settings.timeout if timeout is None else timeout
        deadline = time.monotonic() + max(0.0, limit)
        if self._failure is None and self._threads:
            self._drain(deadline)
        self._stopped = True
        self._sender.stop()
        self.flusher.stop()
        Hooks.run(self.hooks.stopped)
        # The follower needs no join: it checks _stopped under the lock before applying.
        for thread in self._threads[1:]:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        # Never sent: what the sender did not take. A batch it took and may still be sending
        # stays among the pending updates, whose outcome is unknown here.
        unsent_updates = self._sender.take_unsent()
        name = self.maps[0].name
        unsent = ClosedError(
            f"map {name!r} was closed before this update was sent: it never reached the log"
        )
        unknown = ClosedError(
            f"map {name!r} was closed before this replica applied the update: it reached the "
            "log, or was on its way, and its outcome is unknown here (sync() from another "
            "replica shows it)"
        )
        failed = 0
        with self._lock:
            for item in unsent_updates:
                if len(item) == 2:  # an ops record, pending by its seq
                    future = self._pending.pop(decode_op(item[1].value).seq, None)
                else:  # a queued put, pending nowhere yet
                    future = item[4]
                if future is not None:
                    future.resolve(exception=unsent)
                    failed += 1
            pending, self._pending = self._pending, {}
            for future in pending.values():
                if not future.done():
                    future.resolve(exception=unknown)
                    failed += 1
            self.flusher.close()
            for state in self.maps:
                state.store.close()
        self.barriers.shared.wake_all()
        return failed + self.undelivered - undelivered

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

    def _drain(self, deadline: float) -> None:
        """close(): hand every queued update to the log, then apply until every future of
        this replica is resolved, or ``deadline``. The threads still run meanwhile."""
        sender = self._threads[1]  # follower, sender, flusher
        if not self._sender.drain(deadline, sender.is_alive) and sender.is_alive():
            return  # out of time
        ops = self.topics.ops
        while self._pending and self._failure is None:
            live = {f.partition for f in list(self._pending.values())} - set(self.stalled)
            remaining = deadline - time.monotonic()
            if not live or remaining <= 0:
                return
            progressed = False
            for p in sorted(live & set(self.held)):
                if not self._lock.acquire(timeout=remaining):
                    return
                try:
                    progressed |= self._apply_available(p)
                except (LogUnavailableError, OperationTimeoutError) as exc:
                    log.warning("closing %s: cannot apply for now: %s", self.topics.data, exc)
                except KafkaKVError:
                    return
                finally:
                    self._lock.release()
            if self._pending and not progressed:
                machines = self.machines
                waiting = {(ops, p): machines[p].applied for p in live if p in machines}
                self.log.wait_any(waiting, min(max(0.0, remaining), STALL_RETRY))

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

    # -- deep check (kafkakv.map.deepcheck) ---------------------------------------------
    def reference(self, state: MapState) -> ReplicaEngine:
        """A new engine over the same log, topics and partitions for map ``state`` alone,
        never started (no threads, no updates of its own): a reference replica that
        :meth:`rebuild` and :meth:`replay` fill with this engine's own bootstrap and apply
        code. ``state`` should have an empty store. Close it after use."""
        return ReplicaEngine(
            self.log,
            self.topics,
            self.partition_count,
            self.held,
            [state],
            self.settings,
            self.max_record_bytes,
        )

    def rebuild(self, p: int) -> int:
        """Load partition ``p`` from the data topic alone, as a new replica's bootstrap does,
        and return the ops offset that the data covers (-1: none); the ops after it are
        left to :meth:`replay`. Raises DataLossError as bootstrap does."""
        deadline = time.monotonic() + self.settings.timeout
        start = self.log.start_offset(self.topics.ops, p)
        self.bootstrap.load(self.machines[p], start, deadline)
        return self.machines[p].flushed

    def paused(self) -> contextlib.AbstractContextManager[bool]:
        """Nothing is applied to the stores while this is held (the replica lock: reentrant,
        the same object each call, and threads already waiting for it go first): updates and
        the follower wait. Keep it short; writers waiting past their timeout raise
        OperationTimeoutError."""
        return self._lock

    # -- keys and partitions ------------------------------------------------------------
    def partition_of(self, record_key: bytes) -> int:
        return self.keyspace.partition_of(record_key)

    def pending_updates(self) -> list[OpFuture]:
        """This replica's updates not resolved yet (a snapshot): the queued puts, then the
        updates with an ops record."""
        queued = [item[4] for item in list(self._sender.outbox) if len(item) != 2]
        for entry in list(self._pending.values()):
            if isinstance(entry, PutGroup):
                queued.extend(f for f in entry.futures if not f.done())
            else:
                queued.append(entry)
        return queued

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

    # -- updates ------------------------------------------------------------------------
    def submit(
        self,
        state: MapState | None,
        code: OpCode,
        record_key: bytes,
        p: int,
        args: Sequence[Any],
        wait: bool,
    ) -> OpFuture:
        """Append one update and return its future; with ``wait`` apply up to it first.

        Raises OperationTimeoutError when ``max_in_flight`` updates stay unapplied for the whole
        timeout, and ClosedError after close.
        """
        if self._closed or self._failure is not None or self.stalled:  # no call when fine
            self._check_update(p)
        if record_key in RESERVED_KEYS:  # the keys no update may have
            check_update_key(record_key)
        seq = next(self._seqs[p] if wait else self._sent_seqs[p])
        value = encode_op(code, self.origin, seq, args)
        if len(record_key) + len(value) > self.max_record_bytes:
            raise RecordTooLargeError(
                f"an update of {len(record_key) + len(value)} bytes is over the "
                f"{self.max_record_bytes} bytes a record of {self.topics.ops} may hold (its "
                "max.message.bytes less the log's framing)"
            )
        future = OpFuture(state, not wait, p)  # a caller that waits is its own bound
        if not wait:
            self._take_slot()
            self._pending[seq] = future  # one dict store: atomic under the GIL, no lock
            sender = self._sender
            sender.outbox.append((p, new_tuple(Record, (record_key, value, (), None, None, None))))
            if sender.idle:
                sender.wake()  # one wake-up, not one per update until it runs
            return future
        # One deadline for the whole call: each wait below takes what the ones before left.
        self._last_local = started = time.monotonic()  # keeps the follower away: see _follow
        deadline = started + self.settings.timeout
        sender = self._sender
        if sender.outbox or not sender.idle:  # sender.busy(), one call fewer on every put
            self._after_queued(deadline)
        self._pending[seq] = future
        record = new_tuple(Record, (record_key, value, (), None, None, None))
        try:
            offset = self._own.append(
                self.topics.ops, p, [record], timeout=deadline - time.monotonic()
            )
        except BaseException as exc:
            self._fail_pending([seq], exc)
            raise
        try:
            op = sent_op(code, self.origin, seq, args)
            self.apply_until(p, offset, deadline, (record,), (op,))
        finally:
            self._last_local = time.monotonic()
        return future

    def _check_update(self, p: int) -> None:
        """Refuse an update of partition ``p`` before anything of it is queued or appended:
        ClosedError, the engine's failure, or the partition's stall."""
        if self._closed or self._failure is not None:
            self.check_usable()
        if self.stalled and p in self.stalled:
            self._resume_or_raise(p)

    def _take_slot(self, unsent: str = "") -> None:
        """Take one of the ``max_in_flight`` slots for an async update; OperationTimeoutError
        (with ``unsent`` at the end of its message) when none frees up in time."""
        if not self._slots.take(self.settings.timeout):
            self._no_slot(unsent)

    def _no_slot(self, unsent: str = "") -> NoReturn:
        raise OperationTimeoutError(
            f"{self.settings.max_in_flight} updates are still unapplied after "
            f"{self.settings.timeout} s{unsent}"
        )

    def submit_put(self, state: MapState, key: bytes, value: bytes, p: int) -> OpFuture:
        """``put_async`` of store key ``key`` (the map prefix left out) of map ``state`` in
        partition ``p``: take a slot and queue the pair, returning its future. The sender
        gathers consecutive queued puts of one map into ``WRITE_MANY`` records
        (:func:`~kafkakv.map.sender.records_of`), which decide each pair as its put would and give each future
        the value its pair found. A pair too large to share a record goes as a ``PUT`` of its
        own (:meth:`submit`). Raises as :meth:`submit`.
        """
        # The hot path of bulk loads: the common case of _check_update, pair_fits and
        # _take_slot inline (a Python call each was a tenth of the caller's time).
        if self._closed or self._failure is not None or self.stalled:
            self._check_update(p)
        if not state.prefix and key in _RESERVED:  # the keys no update may have
            check_update_key(key)
        if 2 * len(key) + len(value) > self.max_record_bytes - len(state.prefix) - PAIR_SLACK:
            return self.submit(state, OpCode.PUT, state.prefix + key, p, (value,), False)
        future = OpFuture(state, 1, p)
        slots = self._slots
        ticket = next(slots.tickets)
        if ticket - slots.given > slots.limit and not slots.wait(ticket, self.settings.timeout):
            self._no_slot()
        sender = self._sender
        sender.outbox.append((p, state, key, value, future))
        if sender.idle:
            sender.wake()  # one wake-up, not one per update until it runs
        return future

    def submit_many(
        self,
        state: MapState,
        keys: list[bytes],
        values: Sequence[bytes | None],
        partitions: list[int] | None,
        wait: bool,
        expires: int | None = None,
    ) -> BatchFuture:
        """Append a batch of puts (and removes: value None) of map ``state`` as ``WRITE_MANY``
        records, one per partition (``partitions[i]`` is the partition of ``keys[i]``; None:
        every key in partition 0) and size limit, and return one future for them all, whose
        result is how many keys had a value before. With ``wait``, apply up to them first.
        With ``expires`` (a map with expiry), the puts expire that many ms after their record's
        timestamp (``PUT_FOR``).
        Every record is encoded, and checked against the size limit, before any is appended.
        """
        if self._closed or self._failure is not None:
            self.check_usable()
        if not state.prefix and not _RESERVED.isdisjoint(keys):
            check_update_key(next(k for k in keys if k in _RESERVED))
        groups: dict[int, tuple[list[bytes], list[bytes | None]]]
        if partitions is None:
            groups = {0: (keys, list(values))}
        else:
            groups = {}
            for k, v, p in zip(keys, values, partitions, strict=True):
                group = groups.get(p)
                if group is None:
                    group = groups[p] = ([], [])
                group[0].append(k)
                group[1].append(v)
        if self.stalled:
            self.check_partitions(groups)
        room = self.max_record_bytes - len(state.prefix)
        chunks = [
            (p, chunk)
            for p, (ks, vs) in groups.items()
            for chunk in write_many_chunks(ks, vs, room)
        ]
        batch = BatchFuture(len(chunks))
        records: dict[int, list[Record]] = {}
        own_ops: dict[int, list[Op | None]] = {}  # each record's op, as decoding it would give
        parts: list[tuple[int, BatchPart, Record]] = []
        code, extra = (OpCode.WRITE_MANY, ()) if expires is None else (OpCode.PUT_FOR, (expires,))
        lane = self._seqs if wait else self._sent_seqs
        for p, (ks, vs) in chunks:
            seq = next(lane[p])
            args = (ks, vs, *extra)
            value = encode_op(code, self.origin, seq, args)
            record = new_tuple(Record, (state.prefix + ks[0], value, (), None, None, None))
            parts.append((seq, BatchPart(batch, not wait, p), record))
            records.setdefault(p, []).append(record)
            if wait:
                own_ops.setdefault(p, []).append(sent_op(code, self.origin, seq, args))
        if not parts:
            batch.resolve(0)
            return batch
        if not wait:
            for sent, (seq, part, record) in enumerate(parts):
                self._take_slot(
                    f": {len(parts) - sent} of the batch's {len(parts)} records were not sent "
                    "(the others were)"
                )
                self._pending[seq] = part
                self._sender.outbox.append((part.partition, record))
                if self._sender.idle:
                    self._sender.wake()
            return batch
        deadline = time.monotonic() + self.settings.timeout
        if self._sender.busy():
            self._after_queued(deadline)
        for seq, part, _ in parts:
            self._pending[seq] = part
        self._last_local = time.monotonic()  # keeps the follower away: see _follow
        try:
            ends = {}
            for p, group_records in records.items():
                try:
                    first = self._own.append(
                        self.topics.ops, p, group_records, timeout=left(deadline)
                    )
                    ends[p] = first + len(group_records) - 1  # the offset of its last record
                except BaseException as exc:
                    self._fail_pending([seq for seq, part, _ in parts if part.partition == p], exc)
                    raise
            for p, offset in ends.items():
                self.apply_until(p, offset, deadline, records[p], own_ops[p])
        finally:
            self._last_local = time.monotonic()
        return batch

    def _after_queued(self, deadline: float) -> None:
        """Before an update that waits is appended: wait until the async updates this
        replica queued before it were handed to the log, so that the log has this replica's
        updates in the order they were made. Not in the sender thread (a listener's update
        while it applies), nor while holding the replica lock (a listener's update in an
        applier): the sender may need that lock to fail a batch. Raises
        OperationTimeoutError at ``deadline`` (nothing appended)."""
        threads = self._threads  # follower, sender, flusher: once started
        if self._lock.held() or (len(threads) > 1 and threading.current_thread() is threads[1]):
            return
        if not self._sender.wait_sent(deadline):
            self.check_usable()
            raise OperationTimeoutError(
                "the async updates queued before this update were not sent in time; "
                "it was not appended"
            )

    def _fail_pending(self, seqs: Iterable[int], exc: BaseException) -> None:
        freed = 0
        with self._lock:
            for seq in seqs:
                future = self._pending.pop(seq, None)
                if future is not None:
                    freed += future.slot
                    future.resolve(exception=exc)
        self._slots.give(freed)
        self.undelivered += freed  # async updates the log did not take

    def _send_batch(self, items: list[Outgoing]) -> Callable[[], None] | None:
        """Send the sender's queued updates, one pipelined send per partition: ops records
        as they are, and queued puts gathered into records (:func:`~kafkakv.map.sender.records_of`). Returns
        what the sender runs once it has counted them sent: applying the partitions that
        got a small batch (see _apply_sent), or None."""
        if self.partition_count == 1:
            by_partition = {0: items}
        else:
            by_partition = {}
            for item in items:
                by_partition.setdefault(item[0], []).append(item)
        small: list[int] = []
        for p, queued in by_partition.items():
            try:
                records, groups = records_of(
                    queued, p, self.origin, self.max_record_bytes, self._sent_seqs[p]
                )
                self._pending.update(groups)
            except Exception as exc:  # not for pairs checked when queued; never stop the sender
                self._fail_queued(queued, exc)
                continue
            try:
                # Not as this replica's own appends (self._own): the sender applies a small
                # batch only if no other thread holds the lock (_apply_sent_to), and a large
                # one never, so the follower must hear of it.
                self.log.send(
                    self.topics.ops, p, records, self._send_failed, timeout=self.settings.timeout
                )
            except Exception as exc:  # fail these updates; keep sending others
                self._fail_pending([decode_op(r.value).seq for r in records], exc)
                continue
            if self._apply_sent and len(queued) < _APPLY_SENT_BELOW:
                small.append(p)
        return functools.partial(self._apply_sent_to, small) if small else None

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

    def _fail_queued(self, queued: list[Outgoing], exc: BaseException) -> None:
        """Fail updates the sender took but could not make records of."""
        self._fail_pending([decode_op(item[1].value).seq for item in queued if len(item) == 2], exc)
        puts = [item[4] for item in queued if len(item) != 2]
        for future in puts:
            future.resolve(exception=exc)
        self._slots.give(len(puts))
        self.undelivered += len(puts)

    def _send_failed(self, record: Record, exc: BaseException) -> None:
        """A record of a pipelined send that the log could not store: fail its update."""
        try:
            seq = decode_op(record.value).seq
        except DecodeError:  # cannot happen for a record this engine encoded
            log.error("a failed send of %s: %s", self.topics.ops, exc)
            return
        self._fail_pending([seq], exc)

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
                        progressed = self._apply_available(p, until=offset)
                    except OperationTimeoutError:  # a read that got no answer in its slice
                        progressed = False  # (KafkaLog's reads wait 2 s): again, till deadline
            finally:
                self._lock.release()
            if not progressed and machine.applied <= offset:
                self.log.wait(self.topics.ops, p, machine.applied, max(0.0, remaining))

    def _apply_available(self, p: int, limit: int = 50_000, until: int | None = None) -> bool:
        """Read and apply what partition ``p`` has: up to ``limit`` records, or only until
        offset ``until`` is applied. Lock held."""
        machine, ops = self.machines[p], self.topics.ops
        applied = 0
        while applied < limit and p not in self.stalled:
            with gc_paused():  # thousands of short-lived objects per batch: see gcpause
                records, after = self.log.read_batch(
                    ops, p, machine.applied, max_records=READ_BATCH
                )
                if not records:
                    # Offsets with nothing to apply (Kafka's transaction markers): step over.
                    applied += machine.step_over(after)
                    break
                self._carry_out(p, machine.apply_batch(records, after))
                applied += len(records)
                del records  # before collection resumes: see gcpause
            if p in self.stalled or (until is not None and machine.applied > until):
                break
        return applied > 0

    def replay(self, p: int, stop: int) -> set[bytes]:
        """Apply the ops of ``p`` from the applied position up to ``stop`` (exclusive) and no
        further; return the record keys of the records applied. Stops early at a stall or
        where the log ends (then ``positions()[p].applied < stop``); a read that finds nothing
        below the log's end offset is retried for up to the map's timeout. One read per 5000
        ops. For an engine of one's own (see :meth:`reference`), or with :meth:`paused`."""
        machine, ops = self.machines[p], self.topics.ops
        touched: set[bytes] = set()
        deadline = time.monotonic() + self.settings.timeout
        while machine.applied < stop and p not in self.stalled:
            position = machine.applied
            with gc_paused():  # as _apply_available
                records, after = self.log.read_batch(ops, p, position, max_records=READ_BATCH)
                if records and (records[-1].offset or 0) >= stop:
                    records = [r for r in records if (r.offset or 0) < stop]
                    after = stop
                after = min(after, stop)
                if records:
                    self._carry_out(p, machine.apply_batch(records, after))
                    for r in records:
                        touched.update(machine.keys_of(r))
                else:
                    machine.step_over(after)  # offsets with nothing to apply
                del records
            if machine.applied > position or p in self.stalled:
                continue
            # Nothing read: the end of the log, or a reader not caught up with it yet.
            if self.log.end_offset(ops, p) <= position or time.monotonic() > deadline:
                break
            time.sleep(STALL_RETRY)
        return touched

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
            if kind == CHANGE:
                tell(target, p, arg)
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
            lambda: self._last_local,
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
            self._fail_pending(list(self._pending), exc)

    def _propose_expire(self, deadline: int, key: bytes, p: int) -> None:
        """The reaper's proposal: an async ``EXPIRE`` of record key ``key`` at ``deadline``."""
        self.submit(None, OpCode.EXPIRE, key, p, (deadline,), False)

    def _applied_to_end(self, p: int, deadline: float) -> None:
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
