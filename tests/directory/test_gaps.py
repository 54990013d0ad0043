"""Readiness never hangs on offsets that hold nothing to read: transaction markers, aborted
transactions, compacted records, transactions still open."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

import kafkakv
from kafkakv.dev import Cluster
from kafkakv.log import Batch, EntryBatch, Log, MemoryLog, Record
from tests.conftest import KAFKA_TIMEOUT
from tests.directory.conftest import sample, terminal_rows
from tests.doubles import ForwardingLog
from tests.waiting import wait_for


def test_a_committed_transaction_at_the_end(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    """On Kafka the transaction's commit marker takes the last offset: a loader that waits
    to see a record at end - 1 would never be ready."""
    topic = make_topic(partitions=2)
    topic.write(terminal_rows(10))
    with db.log.writer(f"w-{uuid.uuid4().hex[:8]}") as writer:
        writer.append(
            {
                (topic.name, 0): [Record(b"tx-a", b"1"), Record(b"tx-b", b"2")],
                (topic.name, 1): [Record(b"tx-c", b"3")],
            }
        )
    ends = {p: db.log.end_offset(topic.name, p) for p in (0, 1)}
    d = db.directory(topic.name, metrics=registry, timeout=30)
    assert len(d) == 13 and d["tx-a"] == 1 and d["tx-c"] == 3
    assert d.positions() == ends == d.end_offsets()
    labels = {"directory": topic.name, "topic": topic.name}
    for p in (0, 1):
        assert sample(registry, "kafkakv_directory_lag", **labels, partition=str(p)) == 0
    topic.put("after", 4)  # and following steps over the markers too
    wait_for(lambda: "after" in d)


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_compacted_offsets(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic(config={"cleanup.policy": "compact", "segment.bytes": "2048"})
    for round_ in range(20):
        topic.write([(f"k{i}".encode(), str(round_).encode()) for i in range(10)])
    topic.write([(b"k3", None)])
    results = db.log.compact(topic.name)
    assert sum(r.records_in - r.records_out for r in results) > 100  # gaps exist now
    d = db.directory(topic.name, metrics=registry, timeout=30)
    assert dict(d.items()) == {f"k{i}": 19 for i in range(10) if i != 3}
    assert d.positions() == {0: db.log.end_offset(topic.name, 0)}
    assert d.records_applied < 201


@pytest.mark.parametrize("backend", ["kafka"], indirect=True)
def test_aborted_and_open_transactions(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry, kafka_cluster: Cluster
) -> None:
    """Aborted records and their abort marker are never read; an open transaction's records
    are not awaited (the end offset is the last stable offset) and appear once committed."""
    topic = make_topic()
    topic.write([(b"plain", b"1")])
    producer = Producer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "transactional.id": f"conn-{topic.name}",
        }
    )
    producer.init_transactions(KAFKA_TIMEOUT)
    producer.begin_transaction()
    producer.produce(topic.name, b"2", b"aborted", 0)
    producer.produce(topic.name, b"3", b"plain", 0)
    producer.flush(KAFKA_TIMEOUT)
    producer.abort_transaction(KAFKA_TIMEOUT)
    # The abort marker is written after abort_transaction returns; until then the last stable
    # offset stays at the aborted records, and that is what a directory would wait for.
    wait_for(lambda: db.log.end_offset(topic.name, 0) == 4)
    d = db.directory(topic.name, metrics=registry, timeout=30)
    assert dict(d.items()) == {"plain": 1}
    assert d.positions() == {0: db.log.end_offset(topic.name, 0)}

    producer.begin_transaction()  # open, not committed: nothing to wait for
    producer.produce(topic.name, b"4", b"pending", 0)
    producer.flush(KAFKA_TIMEOUT)
    later = db.directory(topic.name, name="later", metrics=registry, timeout=30)
    assert dict(later.items()) == {"plain": 1}
    producer.commit_transaction(KAFKA_TIMEOUT)
    wait_for(lambda: "pending" in later and "pending" in d)
    assert later["pending"] == 4


class LaggingLog(ForwardingLog):
    """A log whose first reads find nothing yet, as a Kafka consumer does whose last fetch is
    older than the end offset a directory captured."""

    def __init__(self, inner: Log, lagging_reads: int) -> None:
        super().__init__(inner)
        self.lagging_reads = lagging_reads

    def read_batch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> Batch:
        if self.lagging_reads > 0:
            self.lagging_reads -= 1
            return Batch([], offset)
        return super().read_batch(
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
        if self.lagging_reads > 0:
            self.lagging_reads -= 1
            return EntryBatch([], offset)
        return super().read_entries(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )


def test_an_empty_read_below_the_target_is_not_the_end(registry: CollectorRegistry) -> None:
    with LaggingLog(MemoryLog(), lagging_reads=0) as lg:
        lg.create_topic("rows", 1, {"cleanup.policy": "compact"})
        lg.append("rows", 0, [Record(k, v) for k, v in terminal_rows(50)])
        lg.lagging_reads = 3
        db = kafkakv.connect(lg)
        d = db.directory("rows", metrics=registry, timeout=10)
        assert len(d) == 50 and lg.lagging_reads == 0
        assert d.positions() == {0: 50}
        db.close()
