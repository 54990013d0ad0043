"""Random-access reads over Kafka consumers: what :meth:`Log.read` and :meth:`Log.wait` need.

A Kafka consumer streams; the ``Log`` interface asks for "the records at or after offset N of
this partition". A :class:`Reader` bridges the two for one thread (a consumer must not be shared
between threads that consume at once). It assigns each partition it is asked about, once, and
keeps, per partition, the records the consumer delivered that nobody has read yet. A read at
the offset where the previous one stopped costs no seek; a read elsewhere seeks. The consumer
reports the end of a partition (``enable.partition.eof``) at the offset after the last record it
may see, past transaction markers; that is how a read knows it has reached the end and how
far a reader may step over offsets that hold nothing. A read or wait stops at the first report
that the brokers refuse the client (:mod:`kafkakv.log.kafka.refusals`), which the consumer's
polls serve.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kafkakv.errors import ClosedError, KafkaKVError, OffsetOutOfRangeError, OperationTimeoutError
from kafkakv.log.base import Batch, Record, new_tuple
from kafkakv.log.kafka.errors import error_class, translate
from kafkakv.log.kafka.nudge import Nudge
from kafkakv.log.kafka.refusals import Refusals
from kafkakv.log.kafka.settings import ClientConfig, open_client

__all__ = ["Reader"]

log = logging.getLogger("kafkakv.log.kafka")

_CONSUME_BATCH = 10_000  # messages taken from librdkafka per consume() call
_SLICE = 0.1  # longest single consume() while waiting, so close() is noticed
_FORWARD_LIMIT = 100_000  # a read this far ahead of the consumer seeks rather than skims
# A partition nobody has read lately whose buffer grows past either limit is unassigned: the
# consumer stops fetching it, and its next read seeks afresh. (Its records arrive with those
# of the partitions this thread does read: without this, the data topic a thread bootstrapped
# from would fill its memory with every later flush.)
_IDLE_RECORDS = 100_000
_IDLE_BYTES = 64 << 20

_EOF = KafkaError._PARTITION_EOF


class _Part:
    """The state of one assigned partition in one reader."""

    __slots__ = (
        "asked",
        "behind_since",
        "eof",
        "failure",
        "head",
        "known_end",
        "lo",
        "next",
        "records",
        "size",
        "used",
    )

    def __init__(self, offset: int) -> None:
        self.reset(offset)

    def reset(self, offset: int) -> None:
        # Delivered records not read yet are records[head:], holding `size` bytes of keys and
        # values: a list and an index, so that a read takes a whole run with one slice.
        self.records: list[Record] = []
        self.head = 0
        self.size = 0
        self.lo = offset  # records below this are not wanted (dropped as they arrive)
        self.next = offset  # one past the last offset the consumer delivered or reported
        self.eof = False  # the consumer reported the end at `next`, nothing arrived since
        self.failure: KafkaKVError | None = None
        self.known_end = -1  # the end offset asked of the broker when positioned here
        self.asked = -1  # the reader's call count when it asked that end
        self.used = 0  # the reader's call count when this partition was last read
        self.behind_since: float | None = None  # since when records known to exist are due

    def skip_below(self, offset: int) -> None:
        """Drop buffered records below ``offset``."""
        records, head = self.records, self.head
        while head < len(records) and cast(int, records[head].offset) < offset:
            r = records[head]
            self.size -= len(r.key or b"") + len(r.value or b"")
            head += 1
        self.head = head


class Reader:
    """One thread's consumer and its per-partition buffers. Not thread-safe by design."""

    def __init__(
        self,
        config: ClientConfig,
        timeout: float,
        bounds: Bounds,
        reached: Mapping[tuple[str, int], int] | None = None,
        refusals: Refusals | None = None,
    ) -> None:
        self.consumer = open_client(Consumer, config)
        self._refusals = refusals if refusals is not None else Refusals("")
        self.timeout = timeout
        self._bounds = bounds
        # How far the partitions are known to reach, per partition: this process's own
        # appends, and the ends its log reported. A read below that is not at the end, whatever
        # the consumer last reported (read your own writes, and never behind an end_offset).
        self._reached: Mapping[tuple[str, int], int] = reached if reached is not None else {}
        # Keyed as Message.topic()/partition() answer (typed Optional), so the per-message
        # lookup needs no conversion.
        self._parts: dict[tuple[str | None, int | None], _Part] = {}
        self._calls = 0  # read and wait_any calls so far
        self.closed = False
        # Held by the thread in read() or wait_any() while it uses the consumer. librdkafka
        # frees the consumer in close(): closed under a poll() of another thread, the poll
        # ran on freed memory (confluent-kafka-python issue 1797: a segfault).
        self._using = threading.RLock()
        self._consumer_closed = False
        self.nudge = Nudge()

    def close(self) -> None:
        """Close the consumer: at once when no thread uses it; otherwise the thread that does
        closes it when its call ends, within one wait slice (``_SLICE``), and its call raises
        ClosedError (wait_any returns nothing)."""
        self.closed = True
        if self._using.acquire(timeout=3 * _SLICE):  # the slice, plus what follows it
            try:
                self._close_consumer()
            finally:
                self._using.release()

    def _close_consumer(self) -> None:
        if not self._consumer_closed:
            self._consumer_closed = True
            # KafkaException or RuntimeError: already closed, or the cluster is gone.
            with contextlib.suppress(KafkaException, RuntimeError):
                self.consumer.close()

    def _closed_error(self) -> ClosedError:
        return ClosedError("the Kafka log was closed while this thread read from it")

    # -- positioning ----------------------------------------------------------------------
    def _position(self, topic: str, partition: int, offset: int, patience: float) -> _Part:
        """The partition's state, with the consumer at ``offset`` or about to deliver it
        (asking the partition's bounds, if need be, for at most ``patience`` seconds)."""
        key = (topic, partition)
        part = self._parts.get(key)
        if part is not None and part.lo <= offset <= part.next + _FORWARD_LIMIT:
            part.lo = offset
            part.skip_below(offset)
            part.used = self._calls
            return part
        low, high = self._bounds(topic, partition, patience)
        if offset < low:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {topic}[{partition}] is below its start offset {low}"
            )
        start = min(offset, high)  # Kafka refuses a position past the end
        tp = TopicPartition(topic, partition, start)
        if part is None:
            self.consumer.incremental_assign([tp])
            part = self._parts[key] = _Part(start)
        else:
            self._seek(tp)
            part.reset(start)
        part.lo = offset
        part.known_end = high
        part.used = part.asked = self._calls
        return part

    def _seek(self, tp: TopicPartition) -> None:
        try:
            self.consumer.seek(tp)
        except KafkaException:  # not fetching yet (just assigned): assign afresh
            self.consumer.incremental_unassign([TopicPartition(tp.topic, tp.partition)])
            self.consumer.incremental_assign([tp])

    # -- consuming ------------------------------------------------------------------------
    def _pump(self, timeout: float) -> None:
        """Take what the consumer has (waiting up to ``timeout``) into the buffers."""
        # consume() returns when it has the number asked for or at the timeout, whichever
        # comes first; poll() returns at the first message. Wait with poll, then take the rest.
        first = self.consumer.poll(timeout)
        if first is None:
            return
        messages = self.consumer.consume(_CONSUME_BATCH, 0)
        messages.insert(0, first)
        # Per message only what a Record needs: this loop is the cost of every Kafka read.
        # Messages come in runs of one partition; a run's bookkeeping is kept in locals and
        # stored once when the run ends.
        parts = self._parts
        part: _Part | None = None
        where: tuple[str | None, int | None] = (None, None)
        lo = nxt = size = 0
        append: Callable[[Record], None] = _discard
        for m in messages:
            partition = m.partition()
            topic = m.topic()
            if partition != where[1] or topic != where[0]:
                if part is not None:
                    part.next, part.size = nxt, size
                where = (topic, partition)
                part = parts.get(where)
                if part is None:
                    append = _discard
                    continue
                lo, nxt, size, append = part.lo, part.next, part.size, part.records.append
            elif part is None:
                continue
            err = m.error()
            if err is not None:
                part.next, part.size = nxt, size
                self._event(part, m, err)
                nxt = part.next
                continue
            offset = cast(int, m.offset())
            if offset < nxt:
                continue  # fetched before a seek
            nxt = offset + 1
            part.eof = False
            if offset < lo:
                continue
            key, value = m.key(), m.value()
            headers: list[tuple[str, bytes | None]] | None = m.headers()  # type: ignore[assignment]  # no cast() call per record
            size += (len(key) if key else 0) + (len(value) if value else 0)
            if headers:  # a null header value reads as empty bytes, as appends store it
                headers = [(name, b"" if raw is None else raw) for name, raw in headers]
            append(
                new_tuple(Record, (key, value, headers or (), m.timestamp()[1], partition, offset))
            )
        if part is not None:
            part.next, part.size = nxt, size
        for tp, idle in list(parts.items()):
            if self._calls - idle.used > 2 and (
                len(idle.records) - idle.head > _IDLE_RECORDS or idle.size > _IDLE_BYTES
            ):
                del parts[tp]
                name, number = cast(tuple[str, int], tp)
                self.consumer.incremental_unassign([TopicPartition(name, number)])
                log.debug("stopped fetching %s[%d]: not read lately", name, number)

    def _event(self, part: _Part, m: Message, err: KafkaError) -> None:
        code = err.code()
        if code == _EOF:
            end = m.offset()
            if end is not None and end >= part.next:
                part.next = end
                part.eof = True
        elif err.fatal() or error_class(code) is OffsetOutOfRangeError:
            # the next read raises it (no exception to chain: the consumer reports an event)
            part.failure = translate(f"reading {m.topic()}[{m.partition()}]", err)
        else:  # a broker restarting, a leader moving: librdkafka retries by itself
            log.debug("consumer: %s", err.str())

    # -- the Log operations ---------------------------------------------------------------
    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        max_bytes: int,
        patience: float | None = None,
    ) -> Batch:
        """Records of ``topic[partition]`` from ``offset``, waiting at most ``patience``
        seconds (default :attr:`timeout`) for an answer."""
        with self._using:
            try:
                if self.closed:
                    raise self._closed_error()
                wait = self.timeout if patience is None else patience
                return self._read(topic, partition, offset, max_records, max_bytes, wait)
            finally:
                if self.closed:  # close() ran meanwhile and left the consumer to this thread
                    self._close_consumer()

    def _read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        max_bytes: int,
        patience: float,
    ) -> Batch:
        self._calls += 1
        mark = self._refusals.mark()
        deadline = time.monotonic() + patience
        part = self._position(topic, partition, offset, patience)
        if (
            part.asked == self._calls
            and offset >= part.known_end
            and self._reached.get((topic, partition), -1) <= offset
        ):
            # Positioned just now, at or past the end its leader just gave: that is the end,
            # as of this call. (The consumer's own first report of it comes with its first
            # fetch, a few hundred milliseconds on: opening a map on Kafka waited that long
            # for each partition of its empty data topic.)
            return Batch([], offset)
        while True:
            self._refusals.check(mark)
            if part.failure is not None:
                failure, part.failure = part.failure, None
                del self._parts[(topic, partition)]
                self.consumer.incremental_unassign([TopicPartition(topic, partition)])
                raise failure
            if part.head < len(part.records):
                return self._take(part, max_records, max_bytes)
            if (part.eof or self._at_high_watermark(topic, partition, part)) and self._reached.get(
                (topic, partition), -1
            ) <= max(offset, part.next):
                self._pump(0)  # whatever arrived since the end was reported
                if part.head < len(part.records):
                    continue
                return Batch([], max(part.next, offset))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OperationTimeoutError(
                    f"reading {topic}[{partition}] at offset {offset}: no answer from Kafka "
                    f"within {round(patience, 2)} s"
                )
            if self.closed:
                raise self._closed_error()
            self._stalled(topic, partition, part)
            self._pump(min(remaining, _SLICE))

    def _at_high_watermark(self, topic: str, partition: int, part: _Part) -> bool:
        """True when the consumer has delivered up to the high watermark of its last fetch.

        The end-of-partition event comes with the fetch after the one that delivered the last
        records, up to ``fetch.wait.max.ms`` later; the watermark is known at once. (With a
        transaction open the readable end is lower, and the event is awaited.)
        """
        _, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        return high is not None and 0 <= high <= part.next

    @staticmethod
    def _take(part: _Part, max_records: int, max_bytes: int) -> Batch:
        records, head = part.records, part.head
        if len(records) - head <= max_records and part.size <= max_bytes:
            out = records[head:] if head else records  # the common case: take everything
            part.records, part.head, part.size = [], 0, 0
            part.lo = cast(int, out[-1].offset) + 1
            return Batch(out, part.next)
        stop, size = head, 0
        limit = min(len(records), head + max_records)
        while stop < limit:
            r = records[stop]
            bytes_ = len(r.key or b"") + len(r.value or b"")
            if stop > head and size + bytes_ > max_bytes:
                break
            size += bytes_
            stop += 1
        out = records[head:stop]
        part.size -= size
        if stop == len(records):
            part.records, part.head = [], 0
        elif stop > 4096 and stop * 2 > len(records):
            del records[:stop]  # keep the list from growing without end
            part.head = 0
        else:
            part.head = stop
        part.lo = cast(int, out[-1].offset) + 1
        after = cast(int, records[part.head].offset) if part.records else part.next
        return Batch(out, after)

    def wait_any(
        self, positions: dict[tuple[str, int], int], timeout: float | None
    ) -> set[tuple[str, int]]:
        with self._using:
            try:
                if self.closed:
                    return set()
                return self._wait_any(positions, timeout)
            finally:
                if self.closed:  # as in read()
                    self._close_consumer()

    def _wait_any(
        self, positions: dict[tuple[str, int], int], timeout: float | None
    ) -> set[tuple[str, int]]:
        self._calls += 1
        mark = self._refusals.mark()
        parts = {  # positioned with the reader's own patience: a wait ends empty, never raises
            tp: self._position(tp[0], tp[1], offset, self.timeout)
            for tp, offset in positions.items()
        }
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._refusals.check(mark)
            ready = {
                tp
                for tp, part in parts.items()
                if part.next > positions[tp] or part.known_end > positions[tp]
            }
            if ready:
                return ready
            if any(part.failure is not None for part in parts.values()):
                return {tp for tp, part in parts.items() if part.failure is not None}
            if deadline is None:
                wait = _SLICE
            else:
                wait = min(deadline - time.monotonic(), _SLICE)
                if wait <= 0:
                    return set()
            if self.closed:
                return set()
            for (topic, partition), part in parts.items():
                self._stalled(topic, partition, part)
            self._pump(wait)

    def _stalled(self, topic: str, partition: int, part: _Part) -> None:
        """Between slices of a wait: when records this process knows to exist (its own
        appends, an end offset reported) have been due for a while, ask the consumer for the
        topic's leaders (:mod:`.nudge`)."""
        if self._reached.get((topic, partition), -1) <= part.next:
            part.behind_since = None
        elif part.behind_since is None:
            part.behind_since = time.monotonic()
        else:
            self.nudge.stalled(self.consumer, topic, part.behind_since)


def _discard(_: Record) -> None:
    """Where records of a partition nobody asked about would go (they never get here)."""


Bounds = Callable[[str, int, float], tuple[int, int]]
"""``(topic, partition, timeout) -> (start offset, end offset)``, asked only when a reader
seeks; no answer within ``timeout`` seconds raises."""
