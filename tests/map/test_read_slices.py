"""A read of the log may give up within its own slice (KafkaLog's reads wait 2 s for an answer,
so that no read holds a replica's lock much past a caller's timeout): the map tries again
while the call it serves has time left. Opening a map failed on the first read that gave up
(on a busy cluster, a replica opened right after another created the topics)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import pytest

from kafkakv.errors import OperationTimeoutError
from kafkakv.log.base import Batch, LatestBatch, Log, Record, TopicPartition
from tests.doubles import ForwardingLog
from tests.map.conftest import OpenMap


class GivingUpReads(ForwardingLog):
    """Every read gives up (OperationTimeoutError) while ``refusals`` is above zero."""

    def __init__(self, inner: Log, refusals: int) -> None:
        super().__init__(inner)
        self.refusals = refusals
        self.refused = 0
        self._lock = threading.Lock()

    def _give_up(self) -> None:
        with self._lock:
            if self.refusals > 0:
                self.refusals -= 1
                self.refused += 1
                raise OperationTimeoutError("no answer within the read's slice")

    def read(self, topic: str, partition: int, offset: int, **kw: int) -> list[Record]:
        self._give_up()
        return super().read(topic, partition, offset, **kw)

    def read_batch(self, topic: str, partition: int, offset: int, **kw: int) -> Batch:
        self._give_up()
        return super().read_batch(topic, partition, offset, **kw)

    def read_latest(self, topic: str, partition: int, offset: int, **kw: int) -> LatestBatch:
        self._give_up()
        return super().read_latest(topic, partition, offset, **kw)


def test_opening_and_updating_go_on_past_reads_that_give_up(open_map: OpenMap) -> None:
    writer = open_map(partitions=1)
    writer.put_all({f"k{i}": i for i in range(50)})
    writer.flush()
    writer["after-flush"] = 1
    doubles: list[GivingUpReads] = []

    def giving_up(inner: Log) -> Log:
        doubles.append(GivingUpReads(inner, refusals=3))
        return doubles[-1]

    reader = open_map(partitions=1, log=giving_up)  # its bootstrap reads give up 3 times
    assert len(reader) == 51 and doubles[0].refused == 3
    doubles[0].refusals = 2  # and so do the reads of a put that waits to be applied
    writer["later"] = 2
    reader["mine"] = 3
    assert reader["later"] == 2 and doubles[0].refused == 5


class SlowGivingUpReads(ForwardingLog):
    """While ``slow``, a read of the ops topic waits for an answer that does not come, as
    KafkaLog's does: ``PATIENCE_S`` for ``read_batch``, what the caller has left (at most
    that) for ``read_within``; then it gives up."""

    PATIENCE_S = 2.0

    def __init__(self, inner: Log) -> None:
        super().__init__(inner)
        self.slow = threading.Event()

    def _no_answer(self, topic: str, wait: float) -> None:
        if self.slow.is_set() and topic.endswith("_ops"):
            time.sleep(wait)
            raise OperationTimeoutError(f"no answer within {wait:.2f} s")

    def wait_any(
        self, positions: Mapping[TopicPartition, int], timeout: float | None
    ) -> set[TopicPartition]:
        if self.slow.is_set():  # nothing arrives: the follower stays behind
            time.sleep(0.05 if timeout is None else min(timeout, 0.05))
            return set()
        return super().wait_any(positions, timeout)

    def read_batch(self, topic: str, partition: int, offset: int, **kw: int) -> Batch:
        self._no_answer(topic, self.PATIENCE_S)
        return super().read_batch(topic, partition, offset, **kw)

    def read_within(
        self, topic: str, partition: int, offset: int, timeout: float, **kw: int
    ) -> Batch:
        self._no_answer(topic, max(0.0, min(timeout, self.PATIENCE_S)))
        return super().read_within(topic, partition, offset, timeout, **kw)


def test_an_update_that_must_read_back_gives_up_at_its_timeout_not_a_read_later(
    open_map: OpenMap,
) -> None:
    """A sync update whose replica is behind reads the log up to its own record; a read begun
    just before the deadline waited the log's whole patience (2 s) past it."""
    writer = open_map(partitions=1)
    doubles: list[SlowGivingUpReads] = []

    def slow(inner: Log) -> Log:
        doubles.append(SlowGivingUpReads(inner))
        return doubles[-1]

    reader = open_map(partitions=1, log=slow, timeout=0.5)
    doubles[0].slow.set()
    writer["before"] = 1  # the reader is behind: its put cannot apply its own record at once
    started = time.monotonic()
    with pytest.raises(OperationTimeoutError):
        reader["mine"] = 2
    took = time.monotonic() - started
    assert took < 0.5 + 0.5 < SlowGivingUpReads.PATIENCE_S, f"the put took {took:.2f} s"
