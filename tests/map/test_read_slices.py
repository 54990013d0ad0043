"""A read of the log may give up within its own slice (KafkaLog's reads wait 2 s for an answer,
so that no read holds a replica's lock much past a caller's timeout): the map tries again
while the call it serves has time left. Opening a map failed on the first read that gave up
(on a busy cluster, a replica opened right after another created the topics)."""

from __future__ import annotations

import threading

from kafkakv.errors import OperationTimeoutError
from kafkakv.log.base import Batch, LatestBatch, Log, Record
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
