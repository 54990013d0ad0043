"""The update path of a replica: how an update leaves this process for the ops topic.

An update that waits (``put``, ``put_all``...) is encoded, appended as one of the replica's
own appends, and applied up to by its caller (the engine's ``apply_until``, given here): one
append and one read, no hand-off to another thread. An async update takes one of
``max_in_flight`` slots and is queued for the :class:`~kafkakv.map.sender.Sender`, which sends
batches with one pipelined send per partition (queued ``put_async`` pairs gathered into
``WRITE_MANY`` records, :func:`~kafkakv.map.sender.records_of`). Each update is pending by its
number (``seq``, see :mod:`kafkakv.map.dedup`) in :attr:`Updates.pending` until the applier
resolves its future; an update that could not be sent fails at once and frees its slot. On
close, :meth:`Updates.drain` hands what is queued to the log and applies until every pending
update resolves, within a deadline; :meth:`Updates.fail_unresolved` fails the rest.

What it needs of the replica is given to it: the read gate (open while nothing is closed,
failed or stalled: the common case costs one attribute), the checks to raise otherwise, the
replica lock, ``apply_until`` and what applies a small batch the sender sent.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NoReturn

from kafkakv.errors import (
    ClosedError,
    DecodeError,
    KafkaKVError,
    LogUnavailableError,
    OperationTimeoutError,
    RecordTooLargeError,
)
from kafkakv.log.base import Log, Record, left, new_tuple
from kafkakv.map.dedup import numbering
from kafkakv.map.follower import STALL_RETRY
from kafkakv.map.futures import BatchFuture, BatchPart, OpFuture, PutGroup
from kafkakv.map.keyspace import RESERVED_KEYS, check_update_key
from kafkakv.map.machine import MapState, PartitionMachine
from kafkakv.map.ops import (
    PAIR_SLACK,
    Op,
    OpCode,
    decode_op,
    encode_op,
    sent_op,
    write_many_chunks,
)
from kafkakv.map.reads import ReadGate
from kafkakv.map.sender import Outgoing, Sender, Slots, records_of

__all__ = ["Updates"]

log = logging.getLogger("kafkakv.map")

SEND_BATCH = 5000  # async updates appended in one batch at most (a read takes as many)
_APPLY_SENT_BELOW = SEND_BATCH // 4
"""The sender applies what it sent itself (where the log stores on send) only for batches
smaller than this: a few updates waiting for their answers. Larger batches come from a stream
of async updates, for which the follower applying while the sender sends is faster."""
_LINGER = 0.0005  # how long the sender lets a small batch grow (Kafka's linger.ms)
_RESERVED = frozenset(RESERVED_KEYS)

#: ``apply_until(p, offset, deadline, own records, their ops)``: the engine's.
ApplyUntil = Callable[[int, int, float, Sequence[Record], Sequence[Op | None]], None]


class Updates:
    """The update path of one replica (``origin``) over ``ops``; see the module docstring.

    ``append`` is the log's append for the replica's own appends (:meth:`Log.own_appends`);
    ``check_usable()`` and ``check_partitions(ps)`` raise what refuses an update when the
    ``gate`` is closed; ``apply_sent(ps)`` applies partitions the sender just sent a small
    batch to (where the log stores on send); ``wait_slice`` bounds the sender's waits."""

    def __init__(
        self,
        log: Log,
        ops: str,
        partition_count: int,
        origin: bytes,
        max_record_bytes: int,
        max_in_flight: int,
        timeout: float,
        lock: AbstractContextManager[bool],
        append: Callable[..., int],
        gate: ReadGate,
        check_usable: Callable[[], None],
        check_partitions: Callable[[Iterable[int]], None],
        apply_until: ApplyUntil,
        apply_sent: Callable[[list[int]], None],
        wait_slice: float,
    ) -> None:
        self._log, self._ops, self._partition_count = log, ops, partition_count
        self.origin, self.max_record_bytes, self._timeout = origin, max_record_bytes, timeout
        self._lock: Any = lock  # a ReplicaLock: held() says whether this thread holds it
        self._gate, self._check_usable, self._check_partitions = (
            gate,
            check_usable,
            check_partitions,
        )
        self._apply_until, self._apply_sent_to = apply_until, apply_sent
        self._append = append
        #: Each partition's update numbers (see kafkakv.map.dedup: dense in a partition, so
        #: the replicas' tables of applied ids stay small; unique in this replica): lane 0
        #: for the updates appended here and waited for, lane 1 for those the sender hands
        #: to the log (a pipelined producer on Kafka), which overtake each other.
        self.seqs = [iter(numbering(p, partition_count)) for p in range(partition_count)]
        self._sent_seqs = [iter(numbering(p, partition_count, 1)) for p in range(partition_count)]
        #: This replica's updates not resolved yet, by seq (the applier resolves them).
        self.pending: dict[int, OpFuture] = {}
        self.slots = Slots(max_in_flight)
        # Where the log stores a batch before send() returns, the sender applies a small one
        # at once (if no other thread is applying): the updates' futures resolve without
        # waiting for the follower's wake-up, and the time that applying takes lets the next
        # batch grow, so the sender needs no linger of its own. Large batches, and every batch
        # elsewhere (Kafka), the follower applies.
        self._apply_sent = log.stores_on_send
        self.sender = Sender(
            self._send_batch,
            batch=SEND_BATCH,
            linger=0.0 if self._apply_sent else _LINGER,
            wait_slice=wait_slice,
        )
        self._sender_thread: threading.Thread | None = None
        self.last_local = 0.0  # monotonic time a local writer last started or finished
        #: Async updates that failed before reaching the log (counted for close()'s report).
        self.undelivered = 0

    def fail_unresolved(self, name: str) -> int:
        """On close, once the sender stopped: fail every update still unresolved with
        ClosedError (saying whether it never reached the log, or its outcome is unknown here)
        and return how many. Replica lock held."""
        # Never sent: what the sender did not take. A batch it took and may still be sending
        # stays among the pending updates, whose outcome is unknown here.
        unsent_updates = self.sender.take_unsent()
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
                    future = self.pending.pop(decode_op(item[1].value).seq, None)
                else:  # a queued put, pending nowhere yet
                    future = item[4]
                if future is not None:
                    future.resolve(exception=unsent)
                    failed += 1
            pending = dict(self.pending)
            self.pending.clear()
            for future in pending.values():
                if not future.done():
                    future.resolve(exception=unknown)
                    failed += 1
        return failed

    def drain(
        self,
        deadline: float,
        sender_alive: Callable[[], bool],
        machines: Mapping[int, PartitionMachine],
        stalled: Container[int],
        apply: Callable[[int], bool],
        failed: Callable[[], bool],
    ) -> None:
        """On close, before the sender stops: hand every queued update to the log, then apply
        until every pending update is resolved, or ``deadline``, or ``failed()``. ``machines``
        are the held partitions' (an update of a ``stalled`` one is not waited for);
        ``apply(p)`` applies what the log has of partition ``p`` (True if anything was),
        under the replica lock, which it takes here. The replica's threads still run."""
        if not self.sender.drain(deadline, sender_alive) and sender_alive():
            return  # out of time
        pending, ops = self.pending, self._ops
        while pending and not failed():
            live = {f.partition for f in list(pending.values()) if f.partition not in stalled}
            remaining = deadline - time.monotonic()
            if not live or remaining <= 0:
                return
            progressed = False
            for p in sorted(p for p in live if p in machines):
                if not self._lock.acquire(timeout=remaining):
                    return
                try:
                    progressed |= apply(p)
                except (LogUnavailableError, OperationTimeoutError) as exc:
                    log.warning("closing a replica of %s: cannot apply for now: %s", ops, exc)
                except KafkaKVError:
                    return
                finally:
                    self._lock.release()
            if pending and not progressed:
                waiting = {(ops, p): machines[p].applied for p in live if p in machines}
                self._log.wait_any(waiting, min(max(0.0, remaining), STALL_RETRY))

    def pending_updates(self) -> list[OpFuture]:
        """This replica's updates not resolved yet (a snapshot): the queued puts, then the
        updates with an ops record."""
        queued = [item[4] for item in list(self.sender.outbox) if len(item) != 2]
        for entry in list(self.pending.values()):
            if isinstance(entry, PutGroup):
                queued.extend(f for f in entry.futures if not f.done())
            else:
                queued.append(entry)
        return queued

    def run_sender(self) -> None:
        """The sender thread's loop (see kafkakv.map.sender)."""
        self._sender_thread = threading.current_thread()
        self.sender.run()

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
        if not self._gate.open:  # no call when fine
            self._check_update(p)
        if record_key in RESERVED_KEYS:  # the keys no update may have
            check_update_key(record_key)
        seq = next(self.seqs[p] if wait else self._sent_seqs[p])
        value = encode_op(code, self.origin, seq, args)
        if len(record_key) + len(value) > self.max_record_bytes:
            raise RecordTooLargeError(
                f"an update of {len(record_key) + len(value)} bytes is over the "
                f"{self.max_record_bytes} bytes a record of {self._ops} may hold (its "
                "max.message.bytes less the log's framing)"
            )
        future = OpFuture(state, not wait, p)  # a caller that waits is its own bound
        if not wait:
            self._take_slot()
            self.pending[seq] = future  # one dict store: atomic under the GIL, no lock
            sender = self.sender
            sender.outbox.append((p, new_tuple(Record, (record_key, value, (), None, None, None))))
            if sender.idle:
                sender.wake()  # one wake-up, not one per update until it runs
            return future
        # One deadline for the whole call: each wait below takes what the ones before left.
        self.last_local = started = (
            time.monotonic()
        )  # keeps the follower away: see kafkakv.map.follower
        deadline = started + self._timeout
        sender = self.sender
        if sender.outbox or not sender.idle:  # sender.busy(), one call fewer on every put
            self._after_queued(deadline)
        self.pending[seq] = future
        record = new_tuple(Record, (record_key, value, (), None, None, None))
        try:
            offset = self._append(self._ops, p, [record], timeout=deadline - time.monotonic())
        except BaseException as exc:
            self.fail_pending([seq], exc)
            raise
        try:
            op = sent_op(code, self.origin, seq, args)
            self._apply_until(p, offset, deadline, (record,), (op,))
        finally:
            self.last_local = time.monotonic()
        return future

    def _check_update(self, p: int) -> None:
        """Refuse an update of partition ``p`` before anything of it is queued or appended:
        ClosedError, the engine's failure, or the partition's stall."""
        self._check_usable()
        self._check_partitions((p,))

    def _take_slot(self, unsent: str = "") -> None:
        """Take one of the ``max_in_flight`` slots for an async update; OperationTimeoutError
        (with ``unsent`` at the end of its message) when none frees up in time."""
        if not self.slots.take(self._timeout):
            self._no_slot(unsent)

    def _no_slot(self, unsent: str = "") -> NoReturn:
        raise OperationTimeoutError(
            f"{self.slots.limit} updates are still unapplied after {self._timeout} s{unsent}"
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
        if not self._gate.open:
            self._check_update(p)
        if not state.prefix and key in _RESERVED:  # the keys no update may have
            check_update_key(key)
        if 2 * len(key) + len(value) > self.max_record_bytes - len(state.prefix) - PAIR_SLACK:
            return self.submit(state, OpCode.PUT, state.prefix + key, p, (value,), False)
        future = OpFuture(state, 1, p)
        slots = self.slots
        ticket = next(slots.tickets)
        if ticket - slots.given > slots.limit and not slots.wait(ticket, self._timeout):
            self._no_slot()
        sender = self.sender
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
        if not self._gate.open:
            self._check_usable()
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
        if not self._gate.open:
            self._check_partitions(groups)
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
        lane = self.seqs if wait else self._sent_seqs
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
                self.pending[seq] = part
                self.sender.outbox.append((part.partition, record))
                if self.sender.idle:
                    self.sender.wake()
            return batch
        deadline = time.monotonic() + self._timeout
        if self.sender.busy():
            self._after_queued(deadline)
        for seq, part, _ in parts:
            self.pending[seq] = part
        self.last_local = time.monotonic()  # keeps the follower away: see kafkakv.map.follower
        try:
            ends = {}
            for p, group_records in records.items():
                try:
                    first = self._append(self._ops, p, group_records, timeout=left(deadline))
                    ends[p] = first + len(group_records) - 1  # the offset of its last record
                except BaseException as exc:
                    self.fail_pending([seq for seq, part, _ in parts if part.partition == p], exc)
                    raise
            for p, offset in ends.items():
                self._apply_until(p, offset, deadline, records[p], own_ops[p])
        finally:
            self.last_local = time.monotonic()
        return batch

    def _after_queued(self, deadline: float) -> None:
        """Before an update that waits is appended: wait until the async updates this
        replica queued before it were handed to the log, so that the log has this replica's
        updates in the order they were made. Not in the sender thread (a listener's update
        while it applies), nor while holding the replica lock (a listener's update in an
        applier): the sender may need that lock to fail a batch. Raises
        OperationTimeoutError at ``deadline`` (nothing appended)."""
        if self._lock.held() or threading.current_thread() is self._sender_thread:
            return
        if not self.sender.wait_sent(deadline):
            self._check_usable()
            raise OperationTimeoutError(
                "the async updates queued before this update were not sent in time; "
                "it was not appended"
            )

    def fail_pending(self, seqs: Iterable[int], exc: BaseException) -> None:
        freed = 0
        with self._lock:
            for seq in seqs:
                future = self.pending.pop(seq, None)
                if future is not None:
                    freed += future.slot
                    future.resolve(exception=exc)
        self.slots.give(freed)
        self.undelivered += freed  # async updates the log did not take

    def _send_batch(self, items: list[Outgoing]) -> Callable[[], None] | None:
        """Send the sender's queued updates, one pipelined send per partition: ops records
        as they are, and queued puts gathered into records (:func:`~kafkakv.map.sender.records_of`). Returns
        what the sender runs once it has counted them sent: applying the partitions that
        got a small batch (see _apply_sent), or None."""
        if self._partition_count == 1:
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
                self.pending.update(groups)
            except Exception as exc:  # not for pairs checked when queued; never stop the sender
                self._fail_queued(queued, exc)
                continue
            try:
                # Not as this replica's own appends (not the own appends): the sender applies a small
                # batch only if no other thread holds the lock (_apply_sent_to), and a large
                # one never, so the follower must hear of it.
                self._log.send(self._ops, p, records, self._send_failed, timeout=self._timeout)
            except Exception as exc:  # fail these updates; keep sending others
                self.fail_pending([decode_op(r.value).seq for r in records], exc)
                continue
            if self._apply_sent and len(queued) < _APPLY_SENT_BELOW:
                small.append(p)
        return functools.partial(self._apply_sent_to, small) if small else None

    def _fail_queued(self, queued: list[Outgoing], exc: BaseException) -> None:
        """Fail updates the sender took but could not make records of."""
        self.fail_pending([decode_op(item[1].value).seq for item in queued if len(item) == 2], exc)
        puts = [item[4] for item in queued if len(item) != 2]
        for future in puts:
            future.resolve(exception=exc)
        self.slots.give(len(puts))
        self.undelivered += len(puts)

    def _send_failed(self, record: Record, exc: BaseException) -> None:
        """A record of a pipelined send that the log could not store: fail its update."""
        try:
            seq = decode_op(record.value).seq
        except DecodeError:  # cannot happen for a record this engine encoded
            log.error("a failed send of %s: %s", self._ops, exc)
            return
        self.fail_pending([seq], exc)
