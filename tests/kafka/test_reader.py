"""The Kafka reader's buffers: a partition this thread stopped reading does not grow without
bound while the thread reads others, and reading it again later still returns the right
records."""

from __future__ import annotations

import uuid

import pytest

from kafkakv.dev import Cluster
from kafkakv.log import Record
from kafkakv.log.kafka import KafkaLog, reader
from tests.conftest import KAFKA_TIMEOUT

pytestmark = pytest.mark.kafka


def test_a_partition_not_read_lately_stops_being_buffered(
    kafka_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "_IDLE_RECORDS", 50)
    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:
        idle, busy = f"t-{uuid.uuid4().hex[:10]}", f"t-{uuid.uuid4().hex[:10]}"
        log.create_topic(idle, 1)
        log.create_topic(busy, 1)
        log.send(idle, 0, [Record(b"i%d" % i, b"%d" % i) for i in range(10)])
        assert len(log.read(idle, 0, 0)) == 10  # this thread's reader now fetches `idle`
        log.send(idle, 0, [Record(b"i%d" % i, b"%d" % i) for i in range(10, 510)])
        position = 0
        for n in range(20):  # keep reading `busy` only: its pumps bring `idle`'s records too
            log.append(busy, 0, [Record(b"b", b"%d" % n)])
            got = log.read(busy, 0, position)
            position = (got[-1].offset or 0) + 1
        buffered = log._reader()._parts  # this thread's per-partition buffers
        assert (idle, 0) not in buffered, "the idle partition is still fetched and buffered"
        assert (busy, 0) in buffered
        again: list[Record] = []
        at = 10
        while len(again) < 500:  # read again from where this thread stopped: seeks afresh
            batch = log.read(idle, 0, at, max_records=1000)
            assert batch, f"nothing at offset {at}"
            again += batch
            at = (batch[-1].offset or 0) + 1
        assert [r.value for r in again] == [b"%d" % i for i in range(10, 510)]
