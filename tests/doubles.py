"""Bases for test doubles of the log: forward everything, override only what the test changes.

A double written against :class:`~kafkakv.log.Log` directly has to restate every method, and
each restated signature can drift from the interface unnoticed (a ``send`` without
``on_failure`` breaks ``put_async`` only once a map calls it that way). Extending
:class:`ForwardingLog` instead, a double restates nothing but what it changes;
tests/test_doubles.py checks that the bases forward every method of the interface with its
exact signature, so a method added to ``Log`` cannot be forgotten here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kafkakv.log.base import (
    Batch,
    CleanResult,
    EndMark,
    EntryBatch,
    FailureCallback,
    LatestBatch,
    Log,
    LogWriter,
    OwnAppends,
    Problem,
    Record,
    TopicPartition,
)
from kafkakv.log.columns import Allocate, Columns

__all__ = ["ForwardingLog", "ForwardingLogWriter"]


class ForwardingLogWriter(LogWriter):
    """A transactional writer that forwards every call to ``inner``."""

    def __init__(self, inner: LogWriter) -> None:
        self.inner = inner

    @property
    def transactional_id(self) -> str:
        return self.inner.transactional_id

    def append(
        self,
        batches: Mapping[TopicPartition, Sequence[Record]],
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int]:
        return self.inner.append(batches, timeout=timeout)

    def close(self) -> None:
        self.inner.close()


class ForwardingLog(Log):
    """A log that forwards every call to ``inner``, and takes its class-level facts
    (``end_offset_is_linearizable``, ``appends_contiguously``, ``private``, ``stores_on_send``,
    ``clock_is_local``). Closing it closes ``inner``."""

    def __init__(self, inner: Log) -> None:
        self.inner = inner
        self.end_offset_is_linearizable = inner.end_offset_is_linearizable
        self.appends_contiguously = inner.appends_contiguously
        self.private = inner.private
        self.stores_on_send = inner.stores_on_send
        self.clock_is_local = inner.clock_is_local

    # -- topics ---------------------------------------------------------------------------
    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, object] | None = None
    ) -> None:
        self.inner.create_topic(name, partitions, config)

    def topics(self) -> list[str]:
        return self.inner.topics()

    def new_topic_replication(self) -> int:
        return self.inner.new_topic_replication()

    def partitions(self, topic: str) -> int:
        return self.inner.partitions(topic)

    def topic_partitions(self) -> dict[str, int]:
        return self.inner.topic_partitions()

    def topic_config(self, topic: str) -> dict[str, str]:
        return self.inner.topic_config(topic)

    def record_room(self, topic: str) -> int:
        return self.inner.record_room(topic)

    # -- records --------------------------------------------------------------------------
    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        timeout: float | None = None,
    ) -> int:
        return self.inner.append(topic, partition, records, timeout=timeout)

    def send(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        on_failure: FailureCallback | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        self.inner.send(topic, partition, records, on_failure, timeout=timeout)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> list[Record]:
        return self.inner.read(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )

    def read_batch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> Batch:
        return self.inner.read_batch(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )

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
        # Through this double's own read_batch, not the inner log's read_within: a double
        # that overrides read_batch sees every read the engine makes, deadline or not.
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
        return self.inner.read_entries(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )

    def read_latest(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> LatestBatch:
        return self.inner.read_latest(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )

    def latest_columns(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        apart: Sequence[bytes] = (),
        allocate: Allocate | None = None,
    ) -> Columns:
        return self.inner.latest_columns(topic, partition, offset, apart=apart, allocate=allocate)

    def frames_columns(self) -> bool:
        return self.inner.frames_columns()

    def send_columns(
        self, topic: str, partition: int, columns: Columns, *, timeout: float | None = None
    ) -> None:
        self.inner.send_columns(topic, partition, columns, timeout=timeout)

    def start_offset(self, topic: str, partition: int) -> int:
        return self.inner.start_offset(topic, partition)

    def end_offset(self, topic: str, partition: int, *, timeout: float | None = None) -> int:
        return self.inner.end_offset(topic, partition, timeout=timeout)

    def end_mark(self, topic: str, partition: int) -> EndMark | None:
        # A double that changes end offsets (slows them, counts them) gives no mark, so every
        # barrier of a map over it still asks its end_offset.
        if type(self).end_offset is not ForwardingLog.end_offset:
            return None
        return self.inner.end_mark(topic, partition)

    def wait(self, topic: str, partition: int, offset: int, timeout: float | None) -> bool:
        return self.inner.wait(topic, partition, offset, timeout)

    def wait_any(
        self, positions: Mapping[TopicPartition, int], timeout: float | None
    ) -> set[TopicPartition]:
        return self.inner.wait_any(positions, timeout)

    def own_appends(self, applier: object) -> OwnAppends:
        # This log's own calls, not the inner log's: a subclass's append or wait_any (a slow
        # one, a flaky one) then sees a replica's appends too. Every append wakes every wait.
        return OwnAppends(self.append, self.send, self.wait_any)

    def writer(self, transactional_id: str, *, timeout: float | None = None) -> LogWriter:
        return self.inner.writer(transactional_id, timeout=timeout)

    # -- maintenance ----------------------------------------------------------------------
    def compact(self, topic: str, partition: int | None = None) -> list[CleanResult]:
        return self.inner.compact(topic, partition)

    def check(self) -> list[Problem]:
        return self.inner.check()

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        self.inner.close()
