"""The map protocol checks that the shared map suite runs on the embedded log only (they drive
compaction or retention themselves), done the Kafka way on the 3-broker cluster: the ops a
replica needs are removed with the admin API's ``delete_records`` (what retention does), and
the offset gaps come from transaction markers and an aborted transaction."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition

import kafkakv
from kafkakv.dev import Cluster
from kafkakv.errors import DataLossError
from kafkakv.log.partitioner import partition_for
from kafkakv.store import LmdbStore
from tests.conftest import KAFKA_TIMEOUT
from tests.map.test_map_protocol import _CountingStore
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka


@pytest.fixture
def name() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def url(kafka_cluster: Cluster) -> str:
    return f"kafka://{kafka_cluster.bootstrap}"


@pytest.fixture
def db(url: str) -> Iterator[kafkakv.Database]:
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as database:
        yield database


def _delete_ops_before(cluster: Cluster, topic: str, offset: int) -> None:
    """Remove ``topic``[0] below ``offset``, as retention would."""
    futures = cluster.admin().delete_records([TopicPartition(topic, 0, offset)])
    for future in futures.values():
        future.result(KAFKA_TIMEOUT)


def test_removed_ops_before_a_flush_raise_data_loss(
    kafka_cluster: Cluster, url: str, db: kafkakv.Database, name: str
) -> None:
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as writer_db:
        m = writer_db.map(name, flush_period=10**6)  # never flushes by itself
        for i in range(100):
            m[f"k{i % 20}"] = i
        ops = f"{name}_ops"
        _delete_ops_before(kafka_cluster, ops, 50)
        assert db.log.start_offset(ops, 0) == 50
        with pytest.raises(DataLossError, match=ops):
            db.map(name)
        m["after"] = 1  # the live replica is unaffected
        m.flush()  # and once a flush covers the ops, new replicas start again
        assert db.map(name) == m


def test_persistent_store_reloads_when_its_ops_are_gone(
    kafka_cluster: Cluster, url: str, db: kafkakv.Database, name: str, tmp_path: Path
) -> None:
    path = str(tmp_path / "persistent")
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as first:
        kept = first.map(name, store="lmdb", store_path=path, flush_period=50)
        kept.update({f"k{i}": i for i in range(100)})
    other = db.map(name)
    for i in range(0, 100, 3):
        del other[f"k{i}"]  # keys the closed store still holds
    for i in range(120):
        other[f"n{i % 30}"] = i
    other.flush()
    ops = f"{name}_ops"
    with LmdbStore(path) as closed:
        applied = closed.positions()[0].applied
    _delete_ops_before(kafka_cluster, ops, db.log.end_offset(ops, 0) - 5)
    assert db.log.start_offset(ops, 0) > applied
    counting = _CountingStore(LmdbStore(path))
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as again_db:
        again = again_db.map(name, store=counting)
        assert counting.dropped == [0], "the ops it needed are gone: reloaded from the data topic"
        assert again == other and not any(f"k{i}" in again for i in range(0, 100, 3))
        assert again.check() == []


def test_bootstrap_steps_over_commit_markers_and_aborted_records(
    kafka_cluster: Cluster, url: str, db: kafkakv.Database, name: str
) -> None:
    m = db.map(name, flush_period=10**6)
    for i in range(40):
        m.update({f"k{j}": i for j in range(5)})
        m.flush()  # 40 transactions: a commit marker after each
    # A transaction that aborts, at the end of the data topic: its records take offsets that
    # no read_committed reader will ever see, followed by the abort marker.
    producer = Producer(
        {"bootstrap.servers": kafka_cluster.bootstrap, "transactional.id": f"{name}-aborted"}
    )
    producer.init_transactions(KAFKA_TIMEOUT)
    before = db.log.end_offset(name, 0)
    producer.begin_transaction()
    for j in range(5):
        producer.produce(name, key=f"k{j}".encode(), value=b"-1", partition=0)
    producer.flush(KAFKA_TIMEOUT)
    producer.abort_transaction(KAFKA_TIMEOUT)
    # The abort marker is written after abort_transaction returns; the end moves past it then.
    wait_for(lambda: db.log.end_offset(name, 0) >= before + 6, KAFKA_TIMEOUT, "abort marker")
    end = db.log.end_offset(name, 0)
    stored = len(db.log.read(name, 0, 0, max_records=10_000))
    assert end - stored >= 41, "markers and aborted records hold offsets"
    began = time.monotonic()
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as fresh_db:
        fresh = fresh_db.map(name, timeout=10)
        assert time.monotonic() - began < 5
        assert fresh == m == {f"k{j}": 39 for j in range(5)}


def test_a_map_whose_data_topic_starts_with_an_aborted_transaction_opens(
    kafka_cluster: Cluster, url: str, db: kafkakv.Database, name: str
) -> None:
    """Opening a map reads the first record of its data topic (a settings record, when the
    map has one). An aborted transaction there holds offsets no reader sees: the open steps
    over them rather than wait for a record at the start offset until its timeout."""
    db.map(name)  # the topics, nothing written yet
    producer = Producer(
        {"bootstrap.servers": kafka_cluster.bootstrap, "transactional.id": f"{name}-zombie"}
    )
    producer.init_transactions(KAFKA_TIMEOUT)
    producer.begin_transaction()
    producer.produce(name, key=b"k", value=b"-1", partition=0)
    producer.flush(KAFKA_TIMEOUT)
    producer.abort_transaction(KAFKA_TIMEOUT)
    wait_for(lambda: db.log.end_offset(name, 0) >= 2, KAFKA_TIMEOUT, "abort marker")
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as writer_db:
        writer_db.map(name)["a"] = 1
    began = time.monotonic()
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as fresh_db:
        fresh = fresh_db.map(name, timeout=10)
        assert time.monotonic() - began < 5
        assert fresh == {"a": 1} and fresh.creation_options["hash_tags"] is False


def test_a_null_header_value_another_client_wrote_reads_as_empty_bytes(
    kafka_cluster: Cluster, url: str, db: kafkakv.Database, name: str
) -> None:
    """Kafka lets a header have no value; a Record's header values are bytes, as every append
    stores them (None as b""). A null version header on a map's data record stopped the
    bootstrap of every replica with versions (a TypeError in reading the headers)."""
    db.map(name, versions=True)["a"] = 1  # the topics, and a value flushed later
    partitions = db.log.partitions(name)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap})
    headers: list[tuple[str, str | bytes | None]] = [("kafkakv.version", None), ("note", None)]
    target = partition_for(b"k", partitions)
    producer.produce(name, key=b"k", value=b"2", partition=target, headers=headers)
    producer.flush(KAFKA_TIMEOUT)
    records = []
    for p in range(partitions):
        records += db.log.read(name, p, 0, max_records=100)
    assert [r.headers for r in records if r.key == b"k"] == [
        [("kafkakv.version", b""), ("note", b"")]
    ]
    with kafkakv.connect(url, timeout=KAFKA_TIMEOUT) as fresh_db:
        fresh = fresh_db.map(name, versions=True)
        assert fresh["k"] == 2 and fresh["a"] == 1
