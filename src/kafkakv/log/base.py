"""The Log interface: the contract every log backend (embedded, Kafka) fulfils.

A log is a set of topics; a topic has a fixed number of partitions; a partition is an ordered
sequence of records, each with a logical offset that never changes once assigned. The records of
one append get consecutive offsets, and later appends higher ones. Offsets may go unused between
appends (Kafka writes a transaction's commit marker at one), and compaction and retention remove
records, leaving gaps; nothing is ever renumbered.
"""

from __future__ import annotations

import mmap
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple, TypeVar

from kafkakv.errors import OperationTimeoutError, UnknownTopicError
from kafkakv.lifecycle import Closeable
from kafkakv.log.columns import Allocate, Columns, columns_of

__all__ = [
    "LATEST_BYTES",
    "RECORD_OVERHEAD",
    "Batch",
    "CleanResult",
    "EndMark",
    "Entry",
    "EntryBatch",
    "FailureCallback",
    "LatestBatch",
    "Log",
    "LogWriter",
    "OwnAppends",
    "Problem",
    "Record",
    "TopicPartition",
    "left",
    "new_tuple",
    "patiently",
    "records_of",
]

new_tuple = tuple.__new__
"""``new_tuple(Record, fields)`` builds a named tuple from a tuple of its fields in one C call,
without the Python-level constructor a ``Record(...)`` call runs: for hot paths."""

TopicPartition = tuple[str, int]
"""A ``(topic, partition)`` pair."""

_T = TypeVar("_T")


def left(deadline: float) -> float:
    """The seconds from now to ``deadline`` (``time.monotonic``), none if it has passed: the
    timeout of one call among several that share a deadline."""
    return max(0.0, deadline - time.monotonic())


def patiently(deadline: float, read: Callable[[], _T]) -> _T:
    """``read()``, again while it raises :class:`~kafkakv.errors.OperationTimeoutError` before
    ``deadline`` (``time.monotonic``). Reads take no timeout: a backend bounds each one by a
    slice of its own (KafkaLog's wait 2 s for an answer, so that a read never holds its
    caller, and the locks it holds, much past the caller's timeout); a caller with longer
    to go reads again."""
    while True:
        try:
            return read()
        except OperationTimeoutError:
            if time.monotonic() >= deadline:
                raise


LATEST_BYTES = 1 << 20
"""Bytes of records :meth:`Log.latest_columns` reads at once (whole batches, as many records
as they hold)."""

RECORD_OVERHEAD = 16
"""Per-record framing counted against ``max.message.bytes`` on top of key, value and headers,
as the embedded and memory logs count it (Kafka's framing is larger: see
:meth:`Log.record_room`)."""


class Record(NamedTuple):
    """One record of a partition.

    ``key`` and ``value`` are ``bytes`` or ``None`` (a ``None`` value is a tombstone: on a
    compacted topic it deletes the key). ``headers`` is a sequence of ``(str, bytes)`` pairs.
    ``timestamp`` is milliseconds since the epoch; ``None`` on append means "now".
    Records read back carry their ``partition`` and ``offset``; on append both are ignored.

    >>> Record(b"k", b"v").value
    b'v'
    """

    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()
    timestamp: int | None = None
    partition: int | None = None
    offset: int | None = None


def records_of(keys: Sequence[bytes | None], values: Sequence[bytes | None]) -> list[Record]:
    """``Record(key, value)`` for each pair, built without a Python-level call per record.

    >>> records_of([b"a", b"b"], [b"1", None])[1]
    Record(key=b'b', value=None, headers=(), timestamp=None, partition=None, offset=None)
    """
    n = len(keys)
    fields = zip(
        keys, values, repeat((), n), repeat(None, n), repeat(None, n), repeat(None, n), strict=True
    )
    return list(map(new_tuple, repeat(Record, n), fields))


class Batch(NamedTuple):
    """What :meth:`Log.read_batch` returns: records, and the offset to read from next."""

    records: list[Record]
    next_offset: int
    """One past the last record, or further when the backend knows that the offsets between
    hold nothing a reader will ever see (transaction markers, aborted or compacted records)."""


FailureCallback = Callable[[Record, BaseException], None]
"""``on_failure(record, error)`` of a pipelined :meth:`Log.send`: a record it could not store."""


Entry = tuple["bytes | None", "bytes | None", int]
"""A record as :meth:`Log.read_entries` gives it: ``(key, value, offset)``."""


class OwnAppends(NamedTuple):
    """What :meth:`Log.own_appends` gives: the log's ``append``, ``send`` and ``wait_any``,
    called as the log's are, for an applier of its own appends."""

    append: Callable[..., int]
    send: Callable[..., None]
    wait_any: Callable[[Mapping[TopicPartition, int], float | None], set[TopicPartition]]


class EntryBatch(NamedTuple):
    """What :meth:`Log.read_entries` returns: entries, and the offset to read from next (as
    :attr:`Batch.next_offset`)."""

    entries: list[Entry]
    next_offset: int


class LatestBatch(NamedTuple):
    """What :meth:`Log.read_latest` returns: the last value of each key among the records
    read, and the offset to read from next (as :attr:`Batch.next_offset`)."""

    values: dict[bytes | None, bytes | None]
    next_offset: int


class EndMark(NamedTuple):
    """What :meth:`Log.end_mark` returns: a partition's end offset and the bytes that showed
    it, as they stand in a shared mapping that every append rewrites."""

    end: int
    mapping: mmap.mmap  # the embedded log's head file, mapped
    raw: bytes  # the mapping's first len(raw) bytes when end was read


@dataclass(frozen=True, slots=True)
class Problem:
    """One inconsistency found by :meth:`Log.check`."""

    topic: str
    partition: int | None
    where: str
    message: str

    def __str__(self) -> str:
        part = "" if self.partition is None else f"-{self.partition}"
        return f"{self.topic}{part} {self.where}: {self.message}"


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What one compaction pass over a partition did (zeros when it had nothing to do)."""

    segments_in: int = 0
    segments_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    records_in: int = 0
    records_out: int = 0


class LogWriter(Closeable):
    """A fenced, transactional writer obtained from :meth:`Log.writer`.

    Each :meth:`append` is one atomic batch that may span topics and partitions: after any
    crash, either every record of it is visible or none is. Opening another writer with the same
    transactional id fences this one: its next :meth:`append`, and every one after it, raises
    :class:`~kafkakv.errors.FencedError` (:class:`~kafkakv.errors.ClosedError` once it is
    closed).
    """

    @property
    @abstractmethod
    def transactional_id(self) -> str:
        """The id this writer was opened with."""

    @abstractmethod
    def append(
        self,
        batches: Mapping[TopicPartition, Sequence[Record]],
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int]:
        """Append all ``batches`` atomically; return the first offset written per partition.

        Give last the partition whose readers should wait least: a log may hold its records
        back until the others are stored (Kafka does; its ``read_committed`` readers stop at
        an open transaction's first record in the partition).

        Raises :class:`~kafkakv.errors.FencedError` when a newer writer took over the id, and
        :class:`~kafkakv.errors.OperationTimeoutError` as :meth:`Log.append` for ``timeout``.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the writer. Idempotent."""


class Log(Closeable):
    """A partitioned, keyed log. Every method raises :class:`~kafkakv.errors.ClosedError`
    after :meth:`close`, :class:`~kafkakv.errors.UnknownTopicError` for a missing topic and
    :class:`~kafkakv.errors.UnknownPartitionError` for a partition outside the topic.
    """

    # -- topics ---------------------------------------------------------------------------
    @abstractmethod
    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, object] | None = None
    ) -> None:
        """Create a topic with Kafka's config names and meanings.

        Raises :class:`~kafkakv.errors.TopicExistsError` if it exists and
        :class:`~kafkakv.errors.ConfigError` for an unknown name or a bad value.
        """

    @abstractmethod
    def topics(self) -> list[str]:
        """Names of all topics, sorted."""

    def new_topic_replication(self) -> int:
        """How many copies of each partition a topic created here gets (1 on one machine)."""
        return 1

    @abstractmethod
    def partitions(self, topic: str) -> int:
        """Number of partitions of ``topic``."""

    def topic_partitions(self) -> dict[str, int]:
        """Every topic of :meth:`topics` with its number of partitions. This default asks
        each topic in turn and leaves out one deleted meanwhile; a backend that can answers
        from one listing (Kafka: one metadata request, so no topic can vanish between)."""
        counts = {}
        for topic in self.topics():
            try:
                counts[topic] = self.partitions(topic)
            except UnknownTopicError:  # deleted since it was listed
                continue
        return counts

    @abstractmethod
    def topic_config(self, topic: str) -> dict[str, str]:
        """Every config entry of ``topic`` (defaults filled in), as Kafka's strings."""

    def record_room(self, topic: str) -> int:
        """The most bytes of key, value and headers that one record of ``topic`` may hold:
        its ``max.message.bytes`` less this log's framing of a record. An :meth:`append` of a
        record that size is stored; a byte more is refused with
        :class:`~kafkakv.errors.RecordTooLargeError`, nothing of its batch stored. What callers
        that cut data into records (a map's batches, a pipeline's rows) size them by."""
        return int(self.topic_config(topic)["max.message.bytes"]) - RECORD_OVERHEAD

    # -- records --------------------------------------------------------------------------
    @abstractmethod
    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        timeout: float | None = None,
    ) -> int:
        """Append ``records`` as one atomic batch; return the offset of the first one.

        Raises :class:`~kafkakv.errors.InvalidRecordError` (a ``TypeError``) for fields of the
        wrong type and :class:`~kafkakv.errors.RecordTooLargeError` for a record over the
        topic's ``max.message.bytes``; nothing is appended then.

        ``timeout`` bounds how long the call waits for other writers (seconds; None: the
        log's own setting, such as EmbeddedLog's ``lock_timeout``). When it runs out the call
        raises :class:`~kafkakv.errors.OperationTimeoutError` (the embedded log's
        :class:`~kafkakv.errors.LockTimeoutError` names the lock and the process holding it)
        and nothing is appended.
        """

    def send(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        on_failure: FailureCallback | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Append ``records`` in order, as :meth:`append` does, without the atomicity.

        For bulk streams whose records stand alone (a map's updates): a backend may split them
        over several writes, and a failure may leave some of them appended. Raises as
        :meth:`append` for records that are invalid, before any is stored.

        Without ``on_failure``, returns once every record is stored and raises any failure,
        but only once every other record is settled: stored or failed, none still on its way.
        With it, a backend that writes over a network may return once the records are on
        their way (pipelined, as Kafka's producer does); each record it then fails to store
        is passed to ``on_failure(record, error)``, once, from another thread, and records
        after it may still be stored. A backend that stores synchronously (the default,
        :meth:`append`) raises instead. Either way, a record is readable only once stored.
        ``timeout`` bounds each wait for other writers, as for :meth:`append`.
        """
        if timeout is None:
            self.append(topic, partition, records)  # as before: overrides without timeout work
        else:
            self.append(topic, partition, records, timeout=timeout)

    def frames_columns(self) -> bool:
        """Whether :meth:`send_columns` frames the rows straight from the buffers, with no
        record object per row; a writer that holds Arrow columns then prefers it. False:
        it makes the records (this default), which a writer may as well make itself."""
        return False

    def send_columns(
        self, topic: str, partition: int, columns: Columns, *, timeout: float | None = None
    ) -> None:
        """Append the rows of ``columns`` as records ``(key, value)``, in order, as :meth:`send`
        does without ``on_failure``; no rows append nothing. ``columns.apart`` must be empty.

        For writers whose rows are Arrow columns already (a Spark write task's): a backend
        may frame the rows straight from the buffers, with no record object per row (the
        embedded log does, in C). This default makes the records and calls :meth:`send`.

        >>> from kafkakv.log import MemoryLog
        >>> from kafkakv.log.columns import columns_of
        >>> with MemoryLog() as log:
        ...     log.create_topic("t")
        ...     log.send_columns("t", 0, columns_of({b"a": b"1", b"b": b"2"}, ()))
        ...     [(r.key, r.value) for r in log.read("t", 0, 0)]
        [(b'a', b'1'), (b'b', b'2')]
        """
        if columns.apart:
            raise ValueError("send_columns(): the rows to send are in the columns, none apart")
        if columns.length:
            records = [new_tuple(Record, (k, v, (), None, None, None)) for k, v in columns.pairs()]
            self.send(topic, partition, records, timeout=timeout)

    @abstractmethod
    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> list[Record]:
        """Records at or after ``offset``, in offset order; empty at the end of the log.

        Returns at most ``max_records``, and stops after ``max_bytes`` of stored data (at least
        one record is returned when any exists). Raises
        :class:`~kafkakv.errors.OffsetOutOfRangeError` below :meth:`start_offset`.
        """

    def read_batch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> Batch:
        """Like :meth:`read`, and also where to read next.

        A reader that keeps its position with ``next_offset`` steps over offsets that hold no
        visible record, such as the commit markers of transactions at the end of a Kafka
        partition, instead of asking for them again. Backends that write no such markers
        return one past the last record (``offset`` when nothing was read).
        """
        records = self.read(topic, partition, offset, max_records=max_records, max_bytes=max_bytes)
        last = records[-1].offset if records else None
        return Batch(records, offset if last is None else last + 1)

    def read_within(
        self,
        topic: str,
        partition: int,
        offset: int,
        timeout: float,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> Batch:
        """:meth:`read_batch`, waiting at most ``timeout`` seconds for an answer: for a caller
        whose own deadline is nearer than the log's patience with a read (KafkaLog's 2 s).

        Raises :class:`~kafkakv.errors.OperationTimeoutError` when no answer came in time, and
        as :meth:`read`. A log that answers from local storage answers at once (this default).
        """
        return self.read_batch(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )

    def read_entries(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> EntryBatch:
        """Like :meth:`read_batch`, each record as a ``(key, value, offset)`` entry only.

        For readers that need nothing else (a directory loading a topic): a backend may build
        the entries without a :class:`Record` per record. Raises as :meth:`read`.
        """
        records, next_offset = self.read_batch(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )
        return EntryBatch([(r.key, r.value, r.offset or 0) for r in records], next_offset)

    def read_latest(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> LatestBatch:
        """The records :meth:`read_batch` would return, as one dict: each key (``None`` for
        records without one) to the value of its last record among them (``None`` for a
        tombstone), as compaction would leave them; and where to read next.

        For readers that need only what a stretch of a partition adds up to (a replica
        loading its data topic): a backend may build the dict straight from what it stores,
        with no record or entry per record. Offsets are not kept; a reader that needs one
        reads the stretch again with :meth:`read_entries`. The dict is empty only when no
        record was read. Costs as :meth:`read_batch`, plus a dict insert per record. Raises
        as :meth:`read`.

        >>> from kafkakv.log import MemoryLog
        >>> with MemoryLog() as log:
        ...     log.create_topic("t")
        ...     first = log.append("t", 0, [Record(b"a", b"1"), Record(b"b", b"2")])
        ...     first = log.append("t", 0, [Record(b"a", None)])
        ...     log.read_latest("t", 0, 0)
        LatestBatch(values={b'a': None, b'b': b'2'}, next_offset=3)
        """
        records, next_offset = self.read_batch(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )
        return LatestBatch({r[0]: r[1] for r in records}, next_offset)

    def latest_columns(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        apart: Sequence[bytes] = (),
        allocate: Allocate | None = None,
    ) -> Columns:
        """The last value of each key of ``partition`` from ``offset`` to its end, as compaction
        would leave it, in two columns (see :class:`~kafkakv.log.columns.Columns`): keys whose
        last record is a tombstone are left out, as are records without a key; the keys in
        ``apart`` are set aside with their values. The columns are written into new bytes, or
        into the buffers ``allocate(size)`` gives (see :data:`~kafkakv.log.columns.Allocate`).
        Reads as a loader does, until a read finds nothing.

        For readers that hand a partition's state to Arrow: a backend may build the columns
        straight from what it stores (the embedded log does, in C, with no object per
        record). This default builds them from :meth:`read_latest`. Raises as :meth:`read`.

        >>> from kafkakv.log import MemoryLog
        >>> with MemoryLog() as log:
        ...     log.create_topic("t")
        ...     first = log.append("t", 0, [Record(b"a", b"1"), Record(b"b", b"2")])
        ...     first = log.append("t", 0, [Record(b"a", None), Record(b"c", b"3")])
        ...     log.latest_columns("t", 0, 0, apart=[b"c"]).pairs()
        [(b'b', b'2')]
        """
        latest: dict[bytes | None, bytes | None] = {}
        while True:
            values, offset = self.read_latest(
                topic, partition, offset, max_records=1 << 62, max_bytes=LATEST_BYTES
            )
            if not values:
                return columns_of(latest, apart, allocate)
            latest.update(values)

    @abstractmethod
    def start_offset(self, topic: str, partition: int) -> int:
        """The first offset still stored (retention may have removed earlier ones)."""

    @abstractmethod
    def end_offset(self, topic: str, partition: int, *, timeout: float | None = None) -> int:
        """The offset the next appended record will get (one past the last record).

        ``timeout`` bounds the wait for the answer, where there is one to wait for (seconds;
        None: the log's own setting); when it runs out the call raises
        :class:`~kafkakv.errors.OperationTimeoutError`."""

    def end_mark(self, topic: str, partition: int) -> EndMark | None:
        """The end offset with where it is published in shared memory, for a reader that
        checks it often (a linearizable map's reads): while the first ``len(raw)`` bytes of
        ``mapping`` still equal ``raw``, nothing was appended and the end offset is still
        ``end``. None where the log has no such mapping (the default; Kafka)."""
        return None

    #: True when :meth:`end_offset` is at or past every append that completed anywhere before
    #: the call (one authoritative copy, as the embedded log's head file). A map can then use
    #: it as a read barrier without appending anything. False where an answer may come from a
    #: stale copy (a deposed Kafka leader): barriers are then appended records.
    end_offset_is_linearizable: bool = False

    #: True when :meth:`send` returns with the records stored (it appends synchronously, as
    #: the default does), so they are readable at once; False for a log that pipelines them
    #: over a network (Kafka). A map's sender applies its own batches right after sending
    #: them when this holds.
    stores_on_send: bool = True

    #: True when the log stamps a record appended without a timestamp with this machine's
    #: wall clock as it stores it (the embedded and memory logs: every process that appends
    #: runs here, and they all read one kernel clock). False for Kafka, where the producing
    #: client stamps it (``message.timestamp.type=CreateTime``) or the leader broker
    #: (``LogAppendTime``). A map with expiry reads the log's clock directly where it holds.
    clock_is_local: bool = True

    #: True when :meth:`append` stores its records at consecutive offsets, the first at the
    #: offset it returns, with no other writer's record between them (one lock around the
    #: whole batch, as the embedded and memory logs take). A map then applies a batch it
    #: appended from what it sent. False where another producer's records may land inside a
    #: batch (a Kafka transaction of several produce requests): the batch is read back.
    appends_contiguously: bool = False

    #: True when the log keeps its files private to their owner (the embedded log's
    #: ``private=True``): stores a map opens on disk next to it are then created private too.
    private: bool = False

    @abstractmethod
    def wait(self, topic: str, partition: int, offset: int, timeout: float | None) -> bool:
        """Block until a record at or after ``offset`` exists, whoever appended it.

        Returns ``True`` as soon as ``end_offset > offset``, ``False`` when ``timeout`` seconds
        pass first (``None`` waits without limit).
        """

    @abstractmethod
    def wait_any(
        self, positions: Mapping[TopicPartition, int], timeout: float | None
    ) -> set[TopicPartition]:
        """Block until any partition named has a record at or after its offset.

        ``positions`` maps (topic, partition) to an offset, as for :meth:`wait`. Returns the
        partitions that have one (``end_offset > offset``) as soon as there is one, an empty
        set when ``timeout`` seconds pass first. This is how one thread follows many
        partitions without polling.
        """

    def own_appends(self, applier: object) -> OwnAppends:
        """The log's ``append``, ``send`` and ``wait_any`` for ``applier``, which applies what
        it appends through them itself (a replica applies its own updates): its waits through
        this ``wait_any`` need not wake for those appends, which they would only find applied.
        Such a wait still returns by its timeout, and wakes for every other append at once.

        The default is the log's own methods: every append wakes every wait, never wrong. The
        embedded log wakes no process for its own appends then (see
        :mod:`kafkakv.log.embedded.bell`).
        """
        return OwnAppends(self.append, self.send, self.wait_any)

    @abstractmethod
    def writer(self, transactional_id: str, *, timeout: float | None = None) -> LogWriter:
        """Open a fenced transactional writer; fences any earlier writer with the same id.

        ``timeout`` bounds the waits for other writers of the id, as for :meth:`append`.
        """

    # -- maintenance ----------------------------------------------------------------------
    @abstractmethod
    def compact(self, topic: str, partition: int | None = None) -> list[CleanResult]:
        """Run the log cleaner now on one partition or all partitions of ``topic``.

        Returns one result per partition cleaned. A backend whose cleaner runs elsewhere (a
        Kafka broker) raises :class:`~kafkakv.errors.UnsupportedOperationError`.
        """

    @abstractmethod
    def check(self) -> list[Problem]:
        """Verify the stored log and return every problem found (empty when sound)."""

    # -- lifecycle ------------------------------------------------------------------------
    @abstractmethod
    def close(self) -> None:
        """Release every resource. Idempotent."""
