"""The replica engine: the threads and I/O around :mod:`kafkakv.map.ops`.

One engine follows one set of map topics for the partitions it holds, on behalf of one or more
maps that share those topics. It

* **bootstraps** each partition: the data topic up to its end (taking the flush point recorded
  there), then the ops after that point; a persistent store resumes at its own offset instead;
* **applies** ops in log order under one lock. Any thread may do it: a writer waiting for its
  own record applies up to it itself (no hand-off to another thread on the hot path), and a
  background thread follows the partitions for updates made elsewhere;
* **sends** async updates in batches from a sender thread, with at most ``max_in_flight``
  unapplied;
* **shares barriers**: a reader joins the next barrier of a partition; one reader per group
  appends it and applies up to it, the others wait on the same group;
* **flushes**: every ``flush_period`` ops of a partition, the replica whose op crossed the mark
  writes the latest value of each changed key, a flush point for the data topic and a
  ``FLUSHED`` mark for the ops topic, in one fenced atomic batch.

Locks: ``_lock`` (re-entrant) guards the stores, positions and dirty sets, and is held while
listeners and future callbacks run, so they see changes in log order; ``_barrier_cond`` guards
the barrier groups. Nothing blocks on I/O while holding ``_barrier_cond``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import msgpack
import msgspec

from kafkakv import functions
from kafkakv.codecs import Codec
from kafkakv.errors import (
    ClosedError,
    DataLossError,
    DecodeError,
    FencedError,
    KafkaKVError,
    LogError,
    LogUnavailableError,
    OperationFailedError,
    OperationTimeoutError,
    PartitionStalledError,
    RecordTooLargeError,
    ResultDecodeError,
    UnknownFunctionError,
)
from kafkakv.gcpause import gc_paused
from kafkakv.log.base import Log, LogWriter, Record, records_of
from kafkakv.log.partitioner import partition_for
from kafkakv.map import metrics
from kafkakv.map.ops import KEEP, Keep, OpCode, decide, decode_op, encode_op
from kafkakv.map.settings import MapSettings
from kafkakv.map.topics import MapTopics
from kafkakv.store.base import Positions, Store

__all__ = ["FLUSH_POINT_KEY", "ApplyError", "MapState", "OpFuture", "ReplicaEngine"]

log = logging.getLogger("kafkakv.map")

#: Key of the record that each flush adds to the data topic: its value is msgpack ``[X]``, the
#: last ops offset the flush covers. Compaction keeps the newest one per partition.
FLUSH_POINT_KEY = b"\x00kafkakv:flush-point"

_BULK_MIN = 16  # batches at least this long try the bulk path of _apply_records
_READ_BATCH = 5000  # at least _SEND_BATCH: a read never splits a batch the sender wrote
_SEND_BATCH = 5000  # async updates appended in one batch at most
_LOAD_BYTES = 32 << 20  # bytes of data records read at once while bootstrapping
_LINGER = 0.0005  # how long the sender lets a small batch grow (Kafka's linger.ms)
_WAIT_SLICE = 0.5  # the follower thread re-checks its state this often
_FOLLOW_PAUSE = 0.0002  # what the follower waits after a wake-up before taking the lock
_LOCAL_GRACE = 0.005  # the follower idles this long after a local writer applied
_RETRY_PAUSE = 1.0  # the follower waits this long after the log could not answer
_STALL_RETRY = 0.05  # a stalled partition looks for its missing function this often


_FUTURE_GUARD = threading.Lock()


class OpFuture(Future[Any]):
    """A :class:`concurrent.futures.Future` that asyncio code can also ``await``.

    Most update futures are completed before anyone waits on them, and the condition variable
    a Future creates up front is most of its cost (an async put makes one per update). Here it
    is created when first needed: a waiter, a callback, ``concurrent.futures.wait``. Creating
    it and completing without it share one lock, so a waiter that arrives during completion
    finds the future finished.
    """

    def __init__(
        self, state: MapState | None = None, slot: bool = False, partition: int = -1
    ) -> None:
        # No Future.__init__: that would build the Condition now.
        self._cond: threading.Condition | None = None
        self._state = "PENDING"
        self._result = None
        self._exception = None
        # _waiters and _done_callbacks, the lists Future keeps, are made with the condition:
        # every use of them holds it. Fewer objects per future is less work for the cyclic
        # garbage collector, which otherwise dominates when 100,000 futures are alive. For
        # the same reason the engine's bookkeeping of an update lives here, not in an object
        # of its own: the map whose codec decodes the result, and whether the update holds
        # one of the max_in_flight slots.
        self.map_state = state
        self.slot = slot
        self.partition = partition

    @property
    def _condition(self) -> threading.Condition:
        cond = self._cond
        if cond is None:
            with _FUTURE_GUARD:
                cond = self._cond
                if cond is None:
                    self._waiters: list[Any] = []
                    self._done_callbacks: list[Callable[[Future[Any]], object]] = []
                    cond = self._cond = threading.Condition()
        return cond

    @_condition.setter
    def _condition(self, cond: threading.Condition) -> None:
        self._cond = cond

    def _complete_unobserved(self, result: Any, exception: BaseException | None) -> bool:
        """Finish without a Condition when nothing could be waiting; False otherwise."""
        with _FUTURE_GUARD:
            if self._cond is not None:
                return False
            if self._state != "PENDING":
                raise InvalidStateError(f"this future is {self._state.lower()} already")
            self._result, self._exception, self._state = result, exception, "FINISHED"
            return True

    def set_result(self, result: Any) -> None:
        if not self._complete_unobserved(result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._complete_unobserved(None, exception):
            super().set_exception(exception)

    def resolve(self, result: Any = None, exception: BaseException | None = None) -> None:
        """Complete with ``result`` or ``exception`` unless the owner cancelled it already.
        (The applier's path: the unobserved case inline, one lock, no nested calls.)"""
        with _FUTURE_GUARD:
            if self._cond is None:
                if self._state == "PENDING":
                    self._result, self._exception, self._state = result, exception, "FINISHED"
                return
        try:
            if exception is None:
                super().set_result(result)
            else:
                super().set_exception(exception)
        except InvalidStateError:
            pass  # cancelled: the owner stopped caring

    # Once FINISHED a future never changes: answer without building the condition.
    def done(self) -> bool:
        return self._state == "FINISHED" or super().done()

    def result(self, timeout: float | None = None) -> Any:
        if self._state == "FINISHED":
            if self._exception is not None:
                raise self._exception
            return self._result
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == "FINISHED":
            return self._exception
        return super().exception(timeout)

    def __await__(self) -> Any:
        import asyncio

        return asyncio.wrap_future(self).__await__()


Listener = Callable[[Any, Any, Any, bool], None]


@dataclass
class MapState:
    """One map held by an engine: how its keys look in records, its codecs, store, listeners."""

    name: str
    prefix: bytes
    keys: Codec[Any]
    values: Codec[Any]
    store: Store
    listeners: list[Listener] = field(default_factory=list)
    #: Store keys whose key or value this replica's codecs cannot read (a record another
    #: program wrote, a replica with other codecs): kept as written, so that every replica
    #: holds the same bytes, and left out of iteration and len() here.
    unreadable: dict[bytes, ApplyError] = field(default_factory=dict)


@dataclass(frozen=True)
class ApplyError:
    """A record that every replica refused the same way, or that stopped this one: an op that
    failed when applied, an ops record that did not decode, a data record whose key or value
    does not decode (``topic`` says which topic the offset is in). ``key`` is the record key
    (the map's prefix included), when it has one."""

    partition: int
    offset: int
    error: str
    key: bytes | None = None
    topic: str = ""


def _reset_after_fork() -> None:
    """A thread of the parent may have held the guard while forking: a fresh one."""
    global _FUTURE_GUARD
    _FUTURE_GUARD = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level constructor (hot paths)


class _ErrorLog(collections.deque[ApplyError]):
    """The latest 1000 records noted as errors, and how many were noted in all."""

    def __init__(self) -> None:
        super().__init__(maxlen=1000)
        self.total = 0

    def append(self, error: ApplyError) -> None:
        self.total += 1
        super().append(error)


class _Slots:
    """At most ``limit`` async updates unapplied. Taking and giving are counters (``next`` on
    an itertools.count is atomic under the GIL); only a caller over the limit takes a lock and
    sleeps, and givers wake it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._taken = itertools.count(1)
        self._given = 0  # written by appliers only, under the replica lock or _cond
        self._cond = threading.Condition(threading.Lock())
        self._sleepers = 0

    def take(self, timeout: float) -> bool:
        ticket = next(self._taken)
        if ticket - self._given <= self.limit:
            return True
        with self._cond:
            self._sleepers += 1
            try:
                if self._cond.wait_for(lambda: ticket - self._given <= self.limit, timeout):
                    return True
                self._given += 1  # give the unused ticket back
                return False
            finally:
                self._sleepers -= 1

    def give(self, n: int) -> None:
        if n:
            with self._cond:
                self._given += n
                if self._sleepers:
                    self._cond.notify_all()


class _BarrierGroup:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = False
        self.error: BaseException | None = None


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
        self._plain = len(maps) == 1 and maps[0].prefix == b""
        self._by_prefix = {m.prefix: m for m in maps}
        self.origin = os.urandom(8)
        self._seq = itertools.count()
        self._lock = threading.RLock()
        self._applied = dict.fromkeys(self.held, 0)  # next ops offset to apply
        self._flushed = dict.fromkeys(self.held, -1)  # last ops offset a flush covered
        self._dirty: dict[int, dict[bytes, int]] = {p: {} for p in self.held}
        self._flush_asked: set[int] = set()
        # Per partition, the last own op that crossed a flush mark while a flush was running:
        # the flusher takes it up when that flush ends, so no mark goes unflushed.
        self._flush_missed: dict[int, int] = {}
        self._next_flush = dict.fromkeys(self.held, settings.flush_period - 1)
        self._pending: dict[int, OpFuture] = {}
        self._events: collections.deque[tuple[Callable[[Any, Any], None], Any, Any]] = (
            collections.deque()
        )
        self.errors = _ErrorLog()
        self._slots = _Slots(settings.max_in_flight)
        self._sender_idle = False
        # Async updates waiting for the sender: (partition, ops record).
        self._outbox: collections.deque[tuple[int, Record]] = collections.deque()
        self._outbox_ready = threading.Condition()
        self._flush_queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._writers: dict[int, LogWriter] = {}
        self._flush_locks = {p: threading.Lock() for p in self.held}
        self._barrier_cond = threading.Condition()
        self._barrier_next: dict[int, _BarrierGroup | None] = dict.fromkeys(self.held)
        self._barrier_busy: dict[int, bool] = dict.fromkeys(self.held, False)
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
        self._threads: list[threading.Thread] = []

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Bootstrap every held partition, then start the follower, sender and flusher."""
        deadline = time.monotonic() + self.settings.timeout * max(1, len(self.held))
        for p in self.held:
            self._bootstrap(p, deadline)
        metrics.track(self)
        for target, name in (
            (self._follow, "follower"),
            (self._send_loop, "sender"),
            (self._flush_loop, "flusher"),
        ):
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
        undelivered = self.undelivered
        metrics.forget(self)
        limit = self.settings.timeout if timeout is None else timeout
        deadline = time.monotonic() + max(0.0, limit)
        if self._failure is None and self._threads:
            self._drain(deadline)
        self._stopped = True
        with self._outbox_ready:
            self._outbox_ready.notify_all()
        self._flush_queue.put(None)
        # The follower needs no join: it checks _stopped under the lock before applying.
        for thread in self._threads[1:]:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
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
            outbox, self._outbox = list(self._outbox), collections.deque()
            for _, record in outbox:
                future = self._pending.pop(decode_op(record.value).seq, None)
                if future is not None:
                    future.resolve(exception=unsent)
                    failed += 1
            pending, self._pending = self._pending, {}
            for future in pending.values():
                if not future.done():
                    future.resolve(exception=unknown)
                    failed += 1
            for writer in self._writers.values():
                writer.close()
            for state in self.maps:
                state.store.close()
        with self._barrier_cond:
            self._barrier_cond.notify_all()
        return failed + self.undelivered - undelivered

    def disown(self, message: str) -> None:
        """In a child made by fork: refuse every use with ClosedError(``message``) from now on,
        and never touch the locks, threads, writers or stores the parent owns (the threads are
        gone, and a lock one of them held stays held)."""
        self._disowned = True
        self._stopped = True
        self._failure = ClosedError(message)

    def _drain(self, deadline: float) -> None:
        """close(): hand every queued update to the log, then apply until every future of
        this replica is resolved, or ``deadline``. The threads still run meanwhile."""
        ready, outbox = self._outbox_ready, self._outbox
        with ready:  # the sender is idle with an empty outbox: every update was handed over
            ready.notify_all()
            sender = self._threads[1]  # follower, sender, flusher
            while (outbox or not self._sender_idle) and sender.is_alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                ready.wait(min(remaining, _WAIT_SLICE))
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
                waiting = {(ops, p): self._applied[p] for p in live if p in self._applied}
                self.log.wait_any(waiting, min(max(0.0, remaining), _STALL_RETRY))

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
        self._load(p, self.log.start_offset(self.topics.ops, p))
        return self._flushed[p]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing is applied to the stores while this is held (the replica lock): updates
        and the follower wait. Keep it short; writers waiting past their timeout raise
        OperationTimeoutError."""
        with self._lock:
            yield

    # -- keys and partitions ------------------------------------------------------------
    def partition_of(self, record_key: bytes) -> int:
        if self.partition_count == 1:
            return 0
        return partition_for(record_key, self.partition_count)

    def pending_updates(self) -> list[OpFuture]:
        """This replica's updates not resolved yet (a snapshot)."""
        return list(self._pending.values())

    def positions(self) -> dict[int, Positions]:
        with self._lock:
            return {p: Positions(self._applied[p], self._flushed[p]) for p in self.held}

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
        if self._closed or self._failure is not None:
            self.check_usable()
        if self.stalled and p in self.stalled:  # refused before appending: nothing in flight
            self._resume_or_raise(p)
        seq = next(self._seq)
        value = encode_op(code, self.origin, seq, args)
        if len(record_key) + len(value) > self.max_record_bytes:
            raise RecordTooLargeError(
                f"an update of {len(record_key) + len(value)} bytes is over the ops topic's "
                f"max.message.bytes={self.max_record_bytes}"
            )
        future = OpFuture(state, not wait, p)  # a caller that waits is its own bound
        if not wait:
            if not self._slots.take(self.settings.timeout):
                raise OperationTimeoutError(
                    f"{self.settings.max_in_flight} updates are still unapplied after "
                    f"{self.settings.timeout} s"
                )
            self._pending[seq] = future  # one dict store: atomic under the GIL, no lock
            self._outbox.append((p, _new_tuple(Record, (record_key, value, (), None, None, None))))
            if self._sender_idle:
                with self._outbox_ready:
                    if self._sender_idle:  # one wake-up, not one per update until it runs
                        self._sender_idle = False
                        self._outbox_ready.notify()
            return future
        self._pending[seq] = future
        timeout = self.settings.timeout
        self._last_local = time.monotonic()  # keeps the follower away: see _follow
        try:
            offset = self.log.append(
                self.topics.ops, p, [Record(record_key, value)], timeout=timeout
            )
        except BaseException as exc:
            self._fail_pending([seq], exc)
            raise
        try:
            self.apply_until(p, offset, time.monotonic() + timeout)
        finally:
            self._last_local = time.monotonic()
        return future

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

    def _send_loop(self) -> None:
        outbox, ready = self._outbox, self._outbox_ready
        while True:
            with ready:
                self._sender_idle = True  # set before looking, so no append goes unnoticed
                if self._closed:
                    ready.notify_all()  # close() waits for an idle sender and an empty outbox
                while not outbox and not self._stopped:
                    ready.wait(_WAIT_SLICE)
                self._sender_idle = False
            if self._stopped:
                return
            if len(outbox) < _SEND_BATCH // 4:
                time.sleep(_LINGER)  # let a batch gather: one append per batch, not per update
            with gc_paused():  # the batch is freed on return, inside the pause: see gcpause
                popleft = outbox.popleft
                self._send_batch([popleft() for _ in range(min(len(outbox), _SEND_BATCH))])

    def _send_batch(self, items: list[tuple[int, Record]]) -> None:
        """Send ``(partition, ops record)`` pairs, one pipelined send per partition."""
        if self.partition_count == 1:
            by_partition = {0: [record for _, record in items]}
        else:
            by_partition = {}
            for p, record in items:
                by_partition.setdefault(p, []).append(record)
        for p, records in by_partition.items():
            try:
                self.log.send(
                    self.topics.ops, p, records, self._send_failed, timeout=self.settings.timeout
                )
            except Exception as exc:  # fail these updates; keep sending others
                self._fail_pending([decode_op(r.value).seq for r in records], exc)

    def _send_failed(self, record: Record, exc: BaseException) -> None:
        """A record of a pipelined send that the log could not store: fail its update."""
        try:
            seq = decode_op(record.value).seq
        except DecodeError:  # cannot happen for a record this engine encoded
            log.error("a failed send of %s: %s", self.topics.ops, exc)
            return
        self._fail_pending([seq], exc)

    # -- applying -----------------------------------------------------------------------
    def apply_until(self, p: int, offset: int, deadline: float) -> None:
        """Return once ``offset`` of partition ``p`` is applied, applying it here if need be.

        Raises OperationTimeoutError at ``deadline``; the update may still apply later.
        """
        while self._applied[p] <= offset:
            self._check_applying(p)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._lock.acquire(timeout=remaining):
                raise OperationTimeoutError(
                    f"ops offset {offset} of {self.topics.ops}[{p}] was not applied in time; "
                    "the update may still be applied later"
                )
            try:
                progressed = self._apply_available(p, until=offset)
            finally:
                self._lock.release()
            if not progressed and self._applied[p] <= offset:
                self.log.wait(self.topics.ops, p, self._applied[p], max(0.0, remaining))

    def _apply_available(self, p: int, limit: int = 50_000, until: int | None = None) -> bool:
        """Read and apply what partition ``p`` has: up to ``limit`` records, or only until
        offset ``until`` is applied. Lock held."""
        applied = 0
        while applied < limit and p not in self.stalled:
            with gc_paused():  # thousands of short-lived objects per batch: see gcpause
                records, after = self.log.read_batch(
                    self.topics.ops, p, self._applied[p], max_records=_READ_BATCH
                )
                if not records:
                    # Offsets with nothing to apply (Kafka's transaction markers): step over.
                    if after > self._applied[p]:
                        self._applied[p] = after
                        applied += 1
                    break
                self._apply_records(p, records, after)
                applied += len(records)
                del records  # before collection resumes: see gcpause
            if p in self.stalled or (until is not None and self._applied[p] > until):
                break
        return applied > 0

    def replay(self, p: int, stop: int) -> set[bytes]:
        """Apply the ops of ``p`` from the applied position up to ``stop`` (exclusive) and no
        further; return the record keys of the records applied. Stops early at a stall or
        where the log ends (then ``positions()[p].applied < stop``); a read that finds nothing
        below the log's end offset is retried for up to the map's timeout. One read per 5000
        ops. For an engine of one's own (see :meth:`reference`), or with :meth:`paused`."""
        ops = self.topics.ops
        touched: set[bytes] = set()
        deadline = time.monotonic() + self.settings.timeout
        while self._applied[p] < stop and p not in self.stalled:
            position = self._applied[p]
            with gc_paused():  # as _apply_available
                records, after = self.log.read_batch(ops, p, position, max_records=_READ_BATCH)
                if records and (records[-1].offset or 0) >= stop:
                    records = [r for r in records if (r.offset or 0) < stop]
                    after = stop
                after = min(after, stop)
                if records:
                    self._apply_records(p, records, after)
                    touched.update(r.key for r in records if r.key is not None)
                elif after > position:
                    self._applied[p] = after  # offsets with nothing to apply: step over
                del records
            if self._applied[p] > position or p in self.stalled:
                continue
            # Nothing read: the end of the log, or a reader not caught up with it yet.
            if self.log.end_offset(ops, p) <= position or time.monotonic() > deadline:
                break
            time.sleep(_STALL_RETRY)
        return touched

    def _apply_records(self, p: int, records: Sequence[Record], after: int) -> None:
        """The state machine step for a batch of ops records of partition ``p``, read up to
        ``after`` (exclusive). Lock held.

        A record this replica cannot apply as the others do (a function not registered here)
        stalls the partition: the records before it are applied, it and those after are not
        (``after`` becomes its offset), and applying resumes there later."""
        if (
            len(records) >= _BULK_MIN
            and self._plain
            and not self.maps[0].listeners
            and self._apply_puts(p, records, after)
        ):
            return
        changes: dict[int, dict[bytes, bytes | None]] = {}
        dirty = self._dirty[p]
        events = self._events
        pending_ops = self._pending
        origin = self.origin
        last = self._applied[p] - 1
        freed = 0
        stall = False  # True: stopped at the record at offset ``last``
        plain = self.maps[0] if self._plain else None
        if plain is not None:  # one map, record key = store key: resolved once per batch
            plain_overlay: dict[bytes, bytes | None] = {}
            changes[id(plain)] = plain_overlay
        next_flush = self._next_flush[p]
        ops = self.topics.ops
        for key, value, _, _, _, offset in records:
            assert offset is not None
            last = offset
            try:
                code, op_origin, seq, args = decode_op(value)
            except DecodeError as exc:
                self.errors.append(ApplyError(p, offset, str(exc), key, ops))
                continue
            if code >= OpCode.BARRIER:  # control records
                if code is OpCode.FLUSHED:
                    self._mark_flushed(p, args[0])
                    next_flush = self._next_flush[p]
                continue
            mine = op_origin == origin
            pending = pending_ops.pop(seq, None) if mine else None
            if key is None:
                continue
            if plain is not None:
                state, user_key, overlay = plain, key, plain_overlay
            else:
                found = self._state_for(key)
                if found is None:
                    dirty[key] = offset  # another map's key: this replica cannot flush it
                    continue
                state = found
                user_key = key[len(state.prefix) :] if state.prefix else key
                overlay = changes.setdefault(id(state), {})
            current = overlay[user_key] if user_key in overlay else state.store.get(user_key)
            new: bytes | Keep | None
            try:
                if code is OpCode.PUT and type(args[0]) is bytes:  # the common case, inline
                    result, new = current, args[0]
                else:
                    result, new = decide(code, args, current, user_key, state.keys, state.values)
            except UnknownFunctionError as exc:
                # The other replicas may well know it: stop here rather than skip the record.
                if pending is not None:
                    pending_ops[seq] = pending  # still pending: decided when applying resumes
                self._stall(p, offset, key, exc)
                stall = True
                break
            except OperationFailedError as exc:
                self.errors.append(ApplyError(p, offset, str(exc), key, ops))
                if pending is not None:
                    freed += pending.slot
                    events.append((_fail, pending, exc))
                continue
            if new is not KEEP and new != current:
                overlay[user_key] = new
                dirty[key] = offset
                unreadable = state.unreadable
                if new is not None:
                    check_key = current is None or user_key in unreadable
                    problem = (
                        _unreadable(state, user_key, new, check_key)
                        if check_key or not state.values.reads_any_bytes
                        else None
                    )
                    if problem is not None:
                        unreadable[user_key] = error = ApplyError(p, offset, problem, key, ops)
                        self.errors.append(error)
                    elif unreadable:
                        unreadable.pop(user_key, None)
                elif unreadable:
                    unreadable.pop(user_key, None)
                if state.listeners:
                    events.append((_notify, state, (user_key, current, new, mine)))
            if pending is not None:
                freed += pending.slot
                events.append((_complete, pending, result))
            if mine and offset >= next_flush:
                if p in self._flush_asked:
                    self._flush_missed[p] = offset
                else:
                    self._ask_flush(p, offset)
                    next_flush = self._next_flush[p]
        after = last if stall else max(after, last + 1)  # a stall: from its record on
        position = {p: Positions(after, self._flushed[p])}
        for state in self.maps:
            state.store.write(changes.get(id(state), {}), position)
        # Only now: threads that check _applied without the lock must find the data there.
        self._applied[p] = after
        while events:  # shared deque: a listener that updates the map keeps the order
            fn, target, arg = events.popleft()
            fn(target, arg)
        self._slots.give(freed)

    def _apply_puts(self, p: int, records: Sequence[Record], after: int) -> bool:
        """:meth:`_apply_records` for the common bulk batch, a pass of C-level operations per
        step instead of a Python loop per record: one map without listeners, every record a
        well-formed ``PUT`` of a bytes value, no key twice. Returns False, having changed
        nothing, for any other batch. Lock held.

        Every key is marked dirty, changed or not (a flush writes an unchanged value again)."""
        try:
            ops = list(map(_decode_put, cast(list[bytes], [r[1] for r in records])))
        except (msgspec.DecodeError, TypeError):  # another op, a malformed one, a null value
            return False
        keys = cast(list[bytes], [r[0] for r in records])
        if None in keys or len(set(keys)) != len(keys):  # a key twice: decided in order
            return False
        state = self.maps[0]
        values = [op[3] for op in ops]
        if state.values.undecodable(values) or state.keys.undecodable(keys):
            return False  # the record loop notes them one by one
        if state.unreadable:  # readable values replace unreadable ones
            for key in keys:
                state.unreadable.pop(key, None)
        offsets = cast(list[int], [r[5] for r in records])
        origin = self.origin
        pop = self._pending.pop
        futures = [pop(seq, None) if o == origin else None for _, o, seq, _ in ops]
        previous = state.store.get_many(keys)
        self._dirty[p].update(zip(keys, offsets, strict=True))
        last = offsets[-1]
        if last >= self._next_flush[p]:  # rare: decided as the record loop does
            for (_, o, _, _), offset in zip(ops, offsets, strict=True):
                if o == origin and offset >= self._next_flush[p]:
                    if p in self._flush_asked:
                        self._flush_missed[p] = offset
                    else:
                        self._ask_flush(p, offset)
        after = max(after, last + 1)
        changes = dict(zip(keys, values, strict=True))
        state.store.write(changes, {p: Positions(after, self._flushed[p])})
        self._applied[p] = after  # only now: see _apply_records
        done = [(f, old) for f, old in zip(futures, previous, strict=True) if f is not None]
        events = self._events
        events.extend([(_complete, f, old) for f, old in done])
        while events:
            fn, target, arg = events.popleft()
            fn(target, arg)
        self._slots.give(sum(f.slot for f, _ in done))
        return True

    def _ask_flush(self, p: int, offset: int) -> None:
        """Queue a flush of ``p`` for the op at ``offset``: at most one per period. Lock held."""
        self._flush_asked.add(p)
        self._next_flush[p] = offset + self.settings.flush_period
        self._flush_queue.put(p)

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

    def _state_for(self, key: bytes | None) -> MapState | None:
        if key is None:
            return None
        if self._plain:
            return self.maps[0]
        n = key[0] if key else 0
        return self._by_prefix.get(key[: n + 1])

    def _mark_flushed(self, p: int, covered: Any) -> None:
        if not isinstance(covered, int) or covered <= self._flushed[p]:
            return
        self._flushed[p] = covered
        self._next_flush[p] = max(self._next_flush[p], covered + self.settings.flush_period)
        # In place (an apply loop may hold the dict), and without a del per covered key:
        # this runs under the lock, and most keys are covered.
        dirty = self._dirty[p]
        if max(dirty.values(), default=-1) <= covered:
            dirty.clear()
        else:
            newer = {k: o for k, o in dirty.items() if o > covered}
            dirty.clear()
            dirty.update(newer)

    def _follow(self) -> None:
        """Background: apply what other processes append, for every held partition."""
        ops = self.topics.ops
        while not self._stopped:
            try:
                quiet = time.monotonic() - self._last_local
                if quiet < _LOCAL_GRACE:
                    # Threads of this process are appending and applying up to their own
                    # records, which takes in every other process's record before them. Stay
                    # out of their way (no inotify wait, so no wake-up per append); whatever
                    # arrives after the last of them is applied once they have been quiet for
                    # _LOCAL_GRACE.
                    time.sleep(_LOCAL_GRACE - quiet)
                    continue
                resumed = self._resume_stalled()
                waiting = {(ops, p): self._applied[p] for p in self.held if p not in self.stalled}
                if waiting:
                    pause = _STALL_RETRY if self.stalled else _WAIT_SLICE
                    ready = [*self.log.wait_any(waiting, pause), *resumed]
                else:
                    time.sleep(_STALL_RETRY)
                    ready = resumed
                if not ready:
                    continue
                # A wake-up may come from a local writer that just started: give it the
                # moment it needs to apply its own record rather than compete for the lock.
                time.sleep(_FOLLOW_PAUSE)
                for _, p in ready:
                    with self._lock:
                        if not self._stopped:
                            self._apply_available(p)
            except ClosedError:
                return
            except (LogUnavailableError, OperationTimeoutError) as exc:
                # Brokers down or a leader moving: reads from the store go on, and following
                # resumes when the log answers again.
                if self._stopped:
                    return
                log.warning("replica of %s cannot follow for now: %s", self.topics.data, exc)
                time.sleep(_RETRY_PAUSE)
            except Exception as exc:  # the log failed under us: say so to every caller
                if self._stopped:
                    return
                log.error("replica of %s stopped following: %s", self.topics.data, exc)
                self._failure = exc
                with self._lock:
                    self._fail_pending(list(self._pending), exc)
                return

    def _resume_stalled(self) -> list[tuple[str, int]]:
        """The stalled partitions whose missing function is registered now, un-stalled."""
        resumed = []
        for p in list(self.stalled):
            try:
                self._resume_or_raise(p)
            except PartitionStalledError:
                continue
            resumed.append((self.topics.ops, p))
        return resumed

    # -- barriers -----------------------------------------------------------------------
    def sync(self, partitions: Iterable[int], timeout: float | None) -> None:
        """Make this replica reflect every update completed anywhere before the call."""
        limit = self.settings.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        mode = self.settings.barriers
        if mode == "auto":
            mode = "offset" if self.log.end_offset_is_linearizable else "shared"
        for p in partitions:
            if mode == "offset":  # no record at all: the end offset is authoritative
                target = self.log.end_offset(self.topics.ops, p) - 1
                if target >= self._applied[p]:
                    self.apply_until(p, target, deadline)
            elif mode == "shared":
                self._shared_barrier(p, deadline)
            else:
                self._barrier(p, deadline)

    def _barrier(self, p: int, deadline: float) -> None:
        remaining = max(0.0, deadline - time.monotonic())
        offset = self.log.append(self.topics.ops, p, [Record(None, _BARRIER)], timeout=remaining)
        self.apply_until(p, offset, deadline)

    def _shared_barrier(self, p: int, deadline: float) -> None:
        """Join the next barrier group of ``p``; the first member free to lead runs it."""
        cond = self._barrier_cond
        with cond:
            group = self._barrier_next[p]
            if group is None:
                group = self._barrier_next[p] = _BarrierGroup()
            while not group.done:
                self.check_usable()
                if not self._barrier_busy[p] and self._barrier_next[p] is group:
                    self._barrier_busy[p] = True
                    self._barrier_next[p] = None
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OperationTimeoutError(f"no barrier of {self.topics.ops}[{p}] in time")
                cond.wait(remaining)
            else:
                if group.error is not None:
                    raise group.error
                return
        try:  # this thread leads the group
            self._barrier(p, deadline)
        except BaseException as exc:
            group.error = exc
            raise
        finally:
            with cond:
                group.done = True
                self._barrier_busy[p] = False
                cond.notify_all()

    # -- flushing -----------------------------------------------------------------------
    def _flush_loop(self) -> None:
        while True:
            p = self._flush_queue.get()
            if p is None or self._stopped:
                return
            try:
                self.flush(p)
            except FencedError:
                log.info("flush of %s[%d] fenced by another replica", self.topics.data, p)
            except Exception as exc:  # a failed flush loses nothing: ops stay; retry later
                if self._stopped:
                    return
                log.warning("flush of %s[%d] failed: %s", self.topics.data, p, exc)
            finally:
                with self._lock:
                    self._flush_asked.discard(p)
                    missed = self._flush_missed.pop(p, -1)
                    if missed > self._flushed[p] and not self._stopped:
                        self._ask_flush(p, missed)

    def flush(self, p: int) -> int | None:
        """Flush partition ``p`` now; return the ops offset covered, or None when there was
        nothing to do, the request was stale, or keys of a map not open here are dirty.

        One flush per partition at a time in this replica. Opening the partition's flush
        writer fences any other flusher; the replica then catches up with the ops topic, so
        the last flush point is known before deciding; values are collected under the lock;
        data, flush point and ``FLUSHED`` mark go out in one atomic batch. When another
        replica's flusher fenced this one meanwhile (or its transaction failed otherwise), the
        writer is reopened and the whole decision made again, once; a second failure raises,
        e.g. :class:`~kafkakv.errors.FencedError` (nothing was written, nothing is lost).
        """
        self.check_usable()
        request = msgpack.packb([self.origin, self._applied[p]])  # who asked, and how far
        self.log.append(
            self.topics.flush, p, [Record(None, request)], timeout=self.settings.timeout
        )
        with self._flush_locks[p]:
            try:
                return self._flush_once(p)
            except LogUnavailableError:
                self._drop_writer(p)
                raise
            except LogError:
                # Fenced by another replica's flusher, or the transaction lost a race with
                # one (Kafka may answer such a commit with an unexpected error): nothing was
                # written. Drop the writer and decide again with a fresh one, once.
                self._drop_writer(p)
            try:
                return self._flush_once(p)
            except LogError:
                self._drop_writer(p)
                raise

    def _drop_writer(self, p: int) -> None:
        writer = self._writers.pop(p, None)
        if writer is not None:
            writer.close()

    def _flush_once(self, p: int) -> int | None:
        ops, data = self.topics.ops, self.topics.data
        writer = self._writers.get(p)
        if writer is None:
            writer = self._writers[p] = self.log.writer(
                f"{ops}.flush.{p}", timeout=self.settings.timeout
            )
        end = self.log.end_offset(ops, p)
        self.apply_until(p, end - 1, time.monotonic() + self.settings.timeout)
        with gc_paused():  # a record per dirty key: see gcpause
            with self._lock:
                covered = self._applied[p] - 1
                if covered <= self._flushed[p]:
                    return None  # stale: someone flushed this far already
                latest = self._flush_values(p)
                if latest is None or not latest[0]:
                    return None
            records = records_of(*latest)  # outside the lock, which appliers are waiting for
            del latest
            records.append(Record(FLUSH_POINT_KEY, msgpack.packb([covered])))
            mark = Record(None, encode_op(OpCode.FLUSHED, self.origin, -1, [covered]))
            # The mark last: replicas reading the ops wait the least (LogWriter.append).
            writer.append({(data, p): records, (ops, p): [mark]}, timeout=self.settings.timeout)
            count = len(records)
            del records  # before collection resumes: see gcpause
        log.debug("flushed %d keys of %s[%d] up to ops offset %d", count, data, p, covered)
        return covered

    def _flush_values(self, p: int) -> tuple[list[bytes], list[bytes | None]] | None:
        """Each dirty key of ``p`` (as a record key) and its latest value; None when keys of a
        map not open here are dirty (this replica cannot flush them). Lock held."""
        keys = list(self._dirty[p])
        if self._plain:  # one map, record key = store key
            return keys, self.maps[0].store.get_many(keys)
        values: list[bytes | None] = []
        for key in keys:
            state = self._state_for(key)
            if state is None:
                log.debug("not flushing %s[%d]: keys of another map", self.topics.data, p)
                return None
            values.append(state.store.get(key[len(state.prefix) :]))
        return keys, values

    # -- bootstrap ----------------------------------------------------------------------
    def _bootstrap(self, p: int, deadline: float) -> None:
        """Load partition ``p``: resume a persistent store, or data topic then ops."""
        ops = self.topics.ops
        start = self.log.start_offset(ops, p)
        resumed = self._resume_point(p)
        if resumed is not None and resumed.applied >= start:
            self._applied[p], self._flushed[p] = resumed.applied, resumed.flushed
            self._collect_dirty(p, max(resumed.flushed + 1, start), resumed.applied)
        else:
            self._load(p, start)
        self._next_flush[p] = self._flushed[p] + self.settings.flush_period
        with self._lock:
            self._applied_to_end(p, deadline)

    def _load(self, p: int, start: int) -> None:
        """Load partition ``p`` from the data topic and take its flush point as the position
        (ops from there on are still to apply). Raises DataLossError when the ops topic,
        starting at ``start``, no longer holds the ops after that point."""
        flushed = self._load_data(p)
        if start > flushed + 1:
            raise DataLossError(
                f"{self.topics.ops}[{p}] starts at offset {start} but the data topic covers "
                f"ops only up to {flushed}: retention removed unflushed updates"
            )
        self._applied[p], self._flushed[p] = flushed + 1, flushed

    def _applied_to_end(self, p: int, deadline: float) -> None:
        end = self.log.end_offset(self.topics.ops, p)
        if end > self._applied[p]:
            # A stall does not fail the open: reads of p raise it, and errors() shows it.
            with contextlib.suppress(PartitionStalledError):
                self.apply_until(p, end - 1, deadline)
        else:  # persist the positions even when there is nothing to apply
            for state in self.maps:
                state.store.write({}, {p: Positions(self._applied[p], self._flushed[p])})

    def _resume_point(self, p: int) -> Positions | None:
        if not all(state.store.persistent for state in self.maps):
            return None
        seen = [state.store.positions().get(p) for state in self.maps]
        first = seen[0]
        if first is None or any(s != first for s in seen):
            return None
        return first

    def _collect_dirty(self, p: int, start: int, stop: int) -> None:
        """A resumed replica does not know which keys changed since the last flush: every key
        of an op in ``[start, stop)`` is treated as changed (a superset is safe to flush)."""
        dirty, position = self._dirty[p], start
        while position < stop:
            records = self.log.read(self.topics.ops, p, position, max_records=_READ_BATCH)
            if not records:
                break
            for record in records:
                assert record.offset is not None
                if record.offset >= stop:
                    return
                if record.key is not None:
                    dirty[record.key] = record.offset
            position = (records[-1].offset or 0) + 1

    def _load_data(self, p: int) -> int:
        """Read the data topic of ``p`` to its end into the stores; return the flush point."""
        data = self.topics.data
        for state in self.maps:
            if state.store.persistent:
                state.store.drop_partition(p, self._keys_of(state, p))
        flushed = -1
        position = self.log.start_offset(data, p)
        while True:
            with gc_paused():  # one tuple per record, none of them garbage: see gcpause
                records = self.log.read(
                    data, p, position, max_records=_READ_BATCH * 5, max_bytes=_LOAD_BYTES
                )
                if not records:  # stop on an empty read, not at an offset: gaps cannot stall it
                    return flushed
                if self._plain:  # record key = store key; a dict built at C speed
                    batch = {r[0]: r[1] for r in records}
                    batch.pop(None, None)
                    if FLUSH_POINT_KEY in batch:
                        del batch[FLUSH_POINT_KEY]
                        flushed = max(flushed, _last_flush_point(records))
                    loaded = cast(dict[bytes, bytes | None], batch)
                    self._note_loaded(self.maps[0], p, records, loaded)
                    self.maps[0].store.write(loaded, {})
                else:
                    flushed = max(flushed, self._load_shared(p, records))
                position = (records[-1].offset or 0) + 1
                del records  # before collection resumes: see gcpause

    def _note_loaded(
        self, state: MapState, p: int, records: Sequence[Record], batch: dict[bytes, bytes | None]
    ) -> None:
        """Bootstrap's check of a batch of data records (``batch``: the last value per key):
        the keys and values this replica's codecs cannot read go to ``state.unreadable`` and
        :attr:`errors`, with their offsets. One pass at C speed when all are readable."""
        if state.values.reads_any_bytes:
            values: list[bytes] = []
        else:
            values = cast(list[bytes], list(batch.values()))
            if None in values:  # tombstones: nothing to read
                values = [v for v in values if v is not None]
        unreadable = state.unreadable
        if not state.values.undecodable(values) and not state.keys.undecodable(list(batch)):
            if unreadable:
                for key in batch:
                    unreadable.pop(key, None)
            return
        latest = {r[0]: r for r in records if r[0] in batch}
        for key, record in latest.items():
            self._note_value(state, p, record, key)

    def _note_value(self, state: MapState, p: int, record: Record, user_key: bytes) -> None:
        """Note whether the data record's key and value are readable here (bootstrap)."""
        value, unreadable = record.value, state.unreadable
        problem = None if value is None else _unreadable(state, user_key, value, True)
        if problem is None:
            unreadable.pop(user_key, None)
        else:
            assert record.offset is not None
            error = ApplyError(p, record.offset, problem, record.key, self.topics.data)
            unreadable[user_key] = error
            self.errors.append(error)

    def _load_shared(self, p: int, records: Sequence[Record]) -> int:
        """Write data records of several maps to their stores; return the flush point seen."""
        flushed = -1
        changes: dict[int, dict[bytes, bytes | None]] = {}
        for record in records:
            key = record.key
            if key == FLUSH_POINT_KEY:
                flushed = max(flushed, _flush_point(record.value))
                continue
            owner = self._state_for(key)
            if owner is None or key is None:
                continue
            user_key = key[len(owner.prefix) :]
            self._note_value(owner, p, record, user_key)
            changes.setdefault(id(owner), {})[user_key] = record.value
        for state in self.maps:
            if id(state) in changes:
                state.store.write(changes[id(state)], {})
        return flushed

    def _keys_of(self, state: MapState, p: int) -> Iterable[bytes]:
        prefix = state.prefix
        return [k for k in state.store if self.partition_of(prefix + k) == p]


_BARRIER = encode_op(OpCode.BARRIER, b"", 0)

#: Decodes the value of a PUT of bytes (``[code, origin, seq, value]``) and refuses any other.
_decode_put = msgspec.msgpack.Decoder(tuple[Literal[1], bytes, int, bytes]).decode
assert OpCode.PUT.value == 1


def _last_flush_point(records: Sequence[Record]) -> int:
    return max(_flush_point(r.value) for r in records if r.key == FLUSH_POINT_KEY)


def _flush_point(value: bytes | None) -> int:
    try:
        (covered,) = msgpack.unpackb(value or b"", raw=False)
        return int(covered)
    except Exception as exc:
        raise DecodeError(f"a flush point record that does not decode: {exc}") from exc


def _fail(future: OpFuture, exc: BaseException) -> None:
    future.resolve(exception=exc)


def _complete(future: OpFuture, result: Any) -> None:
    if type(result) is bytes and future.map_state is not None:
        try:
            value = future.map_state.values.decode(result)
        except KafkaKVError as exc:
            message = f"the update was applied, but the value it returns does not decode: {exc}"
            future.resolve(exception=ResultDecodeError(message, result))
            return
        future.resolve(value)
    else:
        future.resolve(result)


def _notify(state: MapState, change: tuple[bytes, bytes | None, bytes | None, bool]) -> None:
    key, old, new, mine = change
    try:
        k = state.keys.decode(key)
        o = None if old is None else state.values.decode(old)
        n = None if new is None else state.values.decode(new)
    except KafkaKVError as exc:
        log.warning("listener of %s skipped a change it cannot decode: %s", state.name, exc)
        return
    for listener in list(state.listeners):
        try:
            listener(k, o, n, mine)
        except Exception:
            log.exception("a listener of map %s raised", state.name)


def _registered(name: str) -> bool:
    try:
        functions.lookup(name)
    except UnknownFunctionError:
        return False
    return True


def _unreadable(state: MapState, key: bytes, value: bytes, check_key: bool) -> str | None:
    """Why this replica's codecs cannot read ``value`` (or ``key``), or None when they can."""
    try:
        if not state.values.reads_any_bytes:
            state.values.check(value)
        if check_key:
            state.keys.check(key)
    except DecodeError as exc:
        return f"stored as written, but this replica's codecs cannot read it: {exc}"
    return None
