"""MemoryLog: a log held in this process's memory, for tests and throwaway work.

A real backend: it passes the Log contract suite, so everything above the log (maps,
directories) runs on it unchanged, only without disk or servers. What it keeps:

- topics with Kafka's configs, checked as the other backends check them;
- per partition, the records in offset order; an append takes the next offsets, with no gaps
  (no transaction markers here), and a read finds its first record by bisection;
- compaction on demand (:meth:`MemoryLog.compact`): the latest record of each key survives,
  offsets are never renumbered, a tombstone survives its first cleaning and goes at the one
  after ``delete.retention.ms``, records younger than ``min.compaction.lag.ms`` (and all after
  the first of them) stay;
- fenced transactional writers, whose batches appear atomically in every partition.

Retention (``retention.ms``, ``retention.bytes``) never runs: nothing is removed but by
:meth:`~MemoryLog.compact`, so :meth:`~MemoryLog.start_offset` is always 0.

Every handle on one *space* (the topics, records and writer epochs) sees the same log, as every
:class:`~kafkakv.log.EmbeddedLog` on one directory does. ``MemoryLog()`` has a space of its own;
``MemoryLog("name")`` joins the space of that name in this process, created on first use and
kept, like a directory, after its handles close, until :meth:`MemoryLog.drop`.
``kafkakv.connect("memory://name")`` opens such a handle. A space belongs to its process: a
child made by ``fork`` gets a copy, not a share.

One lock per space guards everything and is held only for work in memory, never across a wait;
waiters sleep on its condition, which every append notifies.
"""

from __future__ import annotations

import contextlib
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from kafkakv.errors import (
    ClosedError,
    ConfigError,
    FencedError,
    InvalidRecordError,
    OperationTimeoutError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from kafkakv.log.base import CleanResult, Log, LogWriter, Problem, Record, TopicPartition
from kafkakv.log.config import TopicConfig, parse_topic_config, validate_topic_name
from kafkakv.log.records import RECORD_OVERHEAD, CheckedRecord, check_batch

__all__ = ["MemoryLog", "MemoryLogWriter"]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _size(record: Record) -> int:
    """The bytes a record counts for against ``max_bytes`` and in :class:`CleanResult`."""
    headers = sum(len(name) + len(value) for name, value in record.headers)
    return RECORD_OVERHEAD + len(record.key or b"") + len(record.value or b"") + headers


def _seconds(timeout: float | None) -> float | None:
    """A timeout as :class:`threading.Condition` takes it: None waits without limit (so does
    anything past ``TIMEOUT_MAX``); a negative or NaN timeout is 0."""
    if timeout is None or timeout >= threading.TIMEOUT_MAX:
        return None
    return timeout if timeout >= 0 else 0.0  # NaN fails both comparisons: 0


@dataclass(eq=False)
class _Partition:
    """The records of one partition, in offset order, with their offsets alongside."""

    topic: str
    number: int
    config: TopicConfig
    records: list[Record] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    next_offset: int = 0
    horizons: dict[int, int] = field(default_factory=dict)
    """Tombstone offset -> when (ms) a cleaning may drop it: stamped at its first cleaning."""

    def store(self, rows: Sequence[CheckedRecord], now: int) -> int:
        """Append checked records at the next offsets; return the first one."""
        first = self.next_offset
        for i, (key, value, headers, ts) in enumerate(rows):
            stamp = now if ts is None else ts
            self.records.append(
                Record(key, value, tuple(headers or ()), stamp, self.number, first + i)
            )
        self.offsets.extend(range(first, first + len(rows)))
        self.next_offset = first + len(rows)
        return first

    def read(self, offset: int, max_records: int, max_bytes: int) -> list[Record]:
        """Records from ``offset``: at most ``max_records``, stopping before ``max_bytes`` is
        passed, but at least one when any exists. O(log n + records returned)."""
        start = bisect_left(self.offsets, offset)
        out: list[Record] = []
        size = 0
        for record in self.records[start : start + max_records]:
            size += _size(record)
            if out and size > max_bytes:
                break
            out.append(record)
        return out

    def compact(self, now: int) -> CleanResult:
        """Keep the latest record of each key in the cleanable prefix (see the module)."""
        lag = self.config.min_compaction_lag_ms
        bound = len(self.records)
        if lag > 0:
            young = (i for i, r in enumerate(self.records) if (r.timestamp or 0) > now - lag)
            bound = next(young, bound)
        cleanable = self.records[:bound]
        latest = {r.key: r.offset for r in cleanable}
        kept: list[Record] = []
        for r in cleanable:
            if latest[r.key] != r.offset or r.offset is None:
                continue
            if r.value is None:
                horizon = self.horizons.get(r.offset)
                if horizon is None:  # its first cleaning: it stays, and may go after this
                    self.horizons[r.offset] = now + self.config.delete_retention_ms
                elif horizon <= now:
                    continue
            kept.append(r)
        self.records[:bound] = kept
        self.offsets[:bound] = [r.offset for r in kept if r.offset is not None]
        present = set(self.offsets)
        self.horizons = {o: h for o, h in self.horizons.items() if o in present}
        return CleanResult(
            records_in=len(cleanable),
            records_out=len(kept),
            bytes_in=sum(map(_size, cleanable)),
            bytes_out=sum(map(_size, kept)),
        )

    def check(self) -> list[Problem]:
        """Every broken invariant: offsets increasing, listed alongside, below the end."""
        problems: list[Problem] = []

        def problem(where: str, message: str) -> None:
            problems.append(Problem(self.topic, self.number, where, message))

        if self.offsets != [r.offset for r in self.records]:
            problem("offsets", "the offset list does not match the records")
        previous = -1
        for r in self.records:
            if r.offset is None or r.offset <= previous:
                problem(f"offset {r.offset}", f"does not follow offset {previous}")
            elif r.partition != self.number:
                problem(f"offset {r.offset}", f"says it is in partition {r.partition}")
            previous = r.offset if r.offset is not None else previous
        if previous >= self.next_offset:
            problem("end", f"a record at {previous}, at or past the end {self.next_offset}")
        return problems


class _Space:
    """What every handle of one memory log shares: topics, records and writer epochs."""

    def __init__(self) -> None:
        self.changed = threading.Condition(threading.Lock())
        """The one lock of the space; notified on every append and every handle's close."""
        self.topics: dict[str, tuple[TopicConfig, list[_Partition]]] = {}
        self.epochs: dict[str, int] = {}


_named: dict[str, _Space] = {}
_named_lock = threading.Lock()


class MemoryLog(Log):
    """A log in this process's memory: a space of its own, or the space ``name`` shares with
    every other handle of that name (see the module). Closing a handle keeps the space.

    Costs: an append O(records), a read O(log n + records), a compaction O(n) of the
    partition; everything under one lock, which :meth:`wait` releases while it sleeps.

    >>> with MemoryLog() as log:
    ...     log.create_topic("events", partitions=2)
    ...     log.append("events", 1, [Record(b"k", b"hello"), Record(b"k", b"again")])
    ...     [(r.offset, r.value) for r in log.read("events", 1, 0)]
    0
    [(0, b'hello'), (1, b'again')]
    >>> a, b = MemoryLog("doc"), MemoryLog("doc")
    >>> a.create_topic("shared")
    >>> b.topics()
    ['shared']
    >>> a.close(); b.close(); MemoryLog.drop("doc")
    True
    """

    end_offset_is_linearizable = True  # one copy, in this process
    appends_contiguously = True  # a batch is stored under the log's lock

    def __init__(self, name: str | None = None) -> None:
        if name is None:
            space = _Space()
        else:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"a memory log's name must be a non-empty str, not {name!r}")
            with _named_lock:
                space = _named.setdefault(name, _Space())
        self.name = name
        self._space = space
        self._closed = False

    @staticmethod
    def drop(name: str) -> bool:
        """Forget the space ``name``: later handles of that name start empty. Handles open on
        it keep working on the old one. True when there was such a space."""
        with _named_lock:
            return _named.pop(name, None) is not None

    # -- helpers ----------------------------------------------------------------------
    def _where(self) -> str:
        return "the memory log" if self.name is None else f"memory log {self.name!r}"

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self._where()} is closed (this handle)")

    def _topic(self, topic: str) -> tuple[TopicConfig, list[_Partition]]:
        # Topics are never removed or changed once created: a lookup needs no lock.
        self._check_open()
        found = self._space.topics.get(topic) if isinstance(topic, str) else None
        if found is None:
            raise UnknownTopicError(f"no topic {topic!r} in {self._where()}")
        return found

    def _partition(self, topic: str, partition: int) -> _Partition:
        _config, parts = self._topic(topic)
        if type(partition) is not int or not 0 <= partition < len(parts):
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0..{len(parts) - 1}; "
                f"there is no partition {partition!r}"
            )
        return parts[partition]

    @contextlib.contextmanager
    def _locked(self, timeout: float | None) -> Iterator[None]:
        """Hold the space's lock, waiting at most ``timeout`` seconds (None: no limit) for it;
        then raise :class:`OperationTimeoutError`. Checks this handle is still open."""
        wait = _seconds(timeout)
        if not self._space.changed.acquire(timeout=-1 if wait is None else wait):
            raise OperationTimeoutError(f"{self._where()} stayed locked for {timeout} s")
        try:
            self._check_open()
            yield
        finally:
            self._space.changed.release()

    def _checked(self, part: _Partition, records: Sequence[Record]) -> list[CheckedRecord]:
        return check_batch(
            records,
            max_message_bytes=part.config.max_message_bytes,
            null_keys=not part.config.compact,
        )

    # -- topics -----------------------------------------------------------------------
    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, object] | None = None
    ) -> None:
        self._check_open()
        validate_topic_name(name)
        if type(partitions) is not int or not 1 <= partitions <= 100_000:
            raise ConfigError(f"partitions must be an int from 1 to 100000, not {partitions!r}")
        cfg = parse_topic_config(config)
        with self._locked(None):
            if name in self._space.topics:
                raise TopicExistsError(f"topic {name!r} already exists in {self._where()}")
            parts = [_Partition(name, p, cfg) for p in range(partitions)]
            self._space.topics[name] = (cfg, parts)

    def topics(self) -> list[str]:
        self._check_open()
        with self._locked(None):
            return sorted(self._space.topics)

    def partitions(self, topic: str) -> int:
        return len(self._topic(topic)[1])

    def topic_config(self, topic: str) -> dict[str, str]:
        return self._topic(topic)[0].to_kafka()

    # -- records ----------------------------------------------------------------------
    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        timeout: float | None = None,
    ) -> int:
        """See :meth:`Log.append`. Checks the records before taking the lock."""
        part = self._partition(topic, partition)
        rows = self._checked(part, records)
        with self._locked(timeout):
            first = part.store(rows, _now_ms())
            self._space.changed.notify_all()
        return first

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> list[Record]:
        part = self._partition(topic, partition)
        if type(offset) is not int or offset < 0:
            raise ConfigError(f"offset must be an int >= 0, not {offset!r}")
        if max_records < 1:
            raise ConfigError(f"max_records must be >= 1, not {max_records!r}")
        with self._locked(None):
            return part.read(offset, max_records, max_bytes)

    def start_offset(self, topic: str, partition: int) -> int:
        self._partition(topic, partition)
        return 0  # no retention: nothing is removed from the front but by compaction

    def end_offset(self, topic: str, partition: int, *, timeout: float | None = None) -> int:
        return self._partition(topic, partition).next_offset

    def wait(self, topic: str, partition: int, offset: int, timeout: float | None) -> bool:
        """See :meth:`Log.wait`. Sleeps on the space's condition; raises
        :class:`ClosedError` when this handle is closed meanwhile."""
        return bool(self.wait_any({(topic, partition): offset}, timeout))

    def wait_any(
        self, positions: Mapping[TopicPartition, int], timeout: float | None
    ) -> set[TopicPartition]:
        """See :meth:`Log.wait_any`. Sleeps on the space's condition."""
        watched = [(tp, self._partition(*tp), offset) for tp, offset in positions.items()]

        def ready() -> set[TopicPartition]:
            return {tp for tp, part, offset in watched if part.next_offset > offset}

        with self._space.changed:
            self._space.changed.wait_for(lambda: self._closed or ready(), _seconds(timeout))
            self._check_open()
            return ready()

    def writer(self, transactional_id: str, *, timeout: float | None = None) -> MemoryLogWriter:
        """See :meth:`Log.writer`: takes the id's next epoch, which fences earlier writers."""
        self._check_open()
        if not isinstance(transactional_id, str) or not transactional_id:
            raise ConfigError("a transactional id must be a non-empty str")
        with self._locked(timeout):
            epoch = self._space.epochs.get(transactional_id, 0) + 1
            self._space.epochs[transactional_id] = epoch
        return MemoryLogWriter(self, transactional_id, epoch)

    # -- maintenance ------------------------------------------------------------------
    def compact(self, topic: str, partition: int | None = None) -> list[CleanResult]:
        """Compact now (see the module). A memory log has no segments, so the results count
        records and bytes only. Raises :class:`ConfigError` when the topic is not compacted."""
        config, parts = self._topic(topic)
        if not config.compact:
            policy = ",".join(sorted(config.cleanup_policy))
            raise ConfigError(f"topic {topic!r} has cleanup.policy={policy}; it is not compacted")
        chosen = parts if partition is None else [self._partition(topic, partition)]
        with self._locked(None):
            now = _now_ms()
            return [part.compact(now) for part in chosen]

    def check(self) -> list[Problem]:
        """See :meth:`Log.check`: the order of offsets in every partition. O(records)."""
        with self._locked(None):
            return [
                problem
                for name in sorted(self._space.topics)
                for part in self._space.topics[name][1]
                for problem in part.check()
            ]

    # -- lifecycle --------------------------------------------------------------------
    def close(self) -> None:
        """Close this handle (the space stays) and wake its waiters, which raise
        :class:`ClosedError`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._space.changed:
            self._space.changed.notify_all()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"MemoryLog({self.name!r}, {state})"


class MemoryLogWriter(LogWriter):
    """A fenced transactional writer of a :class:`MemoryLog`: each :meth:`append` stores every
    batch under the space's lock at once, so no reader sees part of it."""

    def __init__(self, log: MemoryLog, transactional_id: str, epoch: int) -> None:
        self._log = log
        self._id = transactional_id
        self._epoch = epoch
        self._closed = False
        # Why, once a newer writer took the id: every later append fails so.
        self._fenced: str | None = None

    @property
    def transactional_id(self) -> str:
        return self._id

    def append(
        self,
        batches: Mapping[TopicPartition, Sequence[Record]],
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int]:
        """See :meth:`LogWriter.append`. Checks every record before taking the lock; raises
        :class:`FencedError` when a newer writer took the id, then on every later append."""
        if self._closed:
            raise ClosedError(f"transactional writer {self._id!r} is closed")
        if self._fenced is not None:
            raise FencedError(self._fenced)
        if not batches:  # as an append of no record: refused on every log
            raise InvalidRecordError("a writer append needs at least one partition")
        log = self._log
        checked = []
        for (topic, number), records in batches.items():
            part = log._partition(topic, number)
            checked.append(((topic, number), part, log._checked(part, records)))
        with log._locked(timeout):
            current = log._space.epochs.get(self._id, 0)
            if current != self._epoch:
                self._fenced = (
                    f"transactional writer {self._id!r} (epoch {self._epoch}) was fenced by a "
                    f"newer writer (epoch {current})"
                )
                raise FencedError(self._fenced)
            now = _now_ms()
            firsts = {tp: part.store(rows, now) for tp, part, rows in checked}
            log._space.changed.notify_all()
        return firsts

    def close(self) -> None:
        self._closed = True
