"""The 3-broker session cluster: metadata, a round trip, and what survives which failure."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer

from kafkakv.dev import Cluster, DevCluster
from kafkakv.dev.errors import ClusterError
from kafkakv.dev.probe import port_is_free
from tests.kafka_cluster import create_topic, port_offset, unique_topic

pytestmark = pytest.mark.kafka

_PRODUCE_FAILURES = {
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError._MSG_TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
}


def _produce(cluster: Cluster, topic: str, value: bytes, timeout_ms: int) -> KafkaError | None:
    """Produce one record (acks=all, idempotent); the delivery error, or None when stored."""
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": timeout_ms,
        }
    )
    outcome: list[KafkaError | None] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        outcome.append(err)

    producer.produce(topic, value=value, key=b"k", on_delivery=delivered)
    producer.flush(timeout_ms / 1000 + 10)
    assert outcome, "no delivery report"
    return outcome[0]


def _consume(cluster: Cluster, topic: str, count: int, timeout: float = 30.0) -> list[Message]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": unique_topic("g"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg)
        consumer.commit(asynchronous=False)  # the offsets topic (RF 3) works too
    finally:
        consumer.close()
    return got


def test_all_three_brokers_are_in_the_metadata(
    kafka_faults: Cluster, request: pytest.FixtureRequest
) -> None:
    if not isinstance(kafka_faults, DevCluster):
        pytest.skip("checks the harness cluster's own ports")
    offset = port_offset(request.config)
    ports = [11092 + offset, 21092 + offset, 31092 + offset]
    assert kafka_faults.bootstrap == ",".join(f"127.0.0.1:{p}" for p in ports)
    brokers = kafka_faults.admin().list_topics(timeout=10).brokers
    # confluent-kafka's BrokerMetadata declares host as None (its __init__ sets it so).
    assert {b.id: (b.host, b.port) for b in brokers.values()} == {  # type: ignore[comparison-overlap]
        1: ("127.0.0.1", ports[0]),
        2: ("127.0.0.1", ports[1]),
        3: ("127.0.0.1", ports[2]),
    }


def test_produce_and_consume_round_trip(kafka_faults: Cluster) -> None:
    topic = unique_topic()
    create_topic(kafka_faults, topic, partitions=3)
    for i in range(10):
        assert _produce(kafka_faults, topic, f"v{i}".encode(), 30_000) is None
    values = sorted(m.value() or b"" for m in _consume(kafka_faults, topic, 10))
    assert values == sorted(f"v{i}".encode() for i in range(10))
    replicas = {p: len(m.replicas) for p, m in kafka_faults.partitions(topic).items()}
    assert replicas == {0: 3, 1: 3, 2: 3}


@contextmanager
def _restart_afterwards(cluster: Cluster) -> Iterator[list[int]]:
    """Collect killed node ids; start any still down on the way out (healthy for later tests)."""
    killed: list[int] = []
    try:
        yield killed
    finally:
        for node_id in killed:
            if not cluster.is_running(node_id):
                cluster.start_node(node_id)


def test_leader_failover_then_min_insync_refuses_then_recovery(kafka_faults: Cluster) -> None:
    cluster = kafka_faults
    topic = unique_topic()
    create_topic(cluster, topic, replication=3, config={"min.insync.replicas": "2"})
    assert _produce(cluster, topic, b"before", 30_000) is None
    with _restart_afterwards(cluster) as killed:
        first = cluster.leader(topic, 0)
        cluster.kill(first)
        killed.append(first)
        assert not cluster.is_running(first)
        second_leader = cluster.wait_leader(topic, 0, exclude={first}, timeout=30)
        assert _produce(cluster, topic, b"one down", 30_000) is None

        [follower] = {1, 2, 3} - {first, second_leader}
        cluster.kill(follower)
        killed.append(follower)
        err = _produce(cluster, topic, b"two down", 5_000)
        assert err is not None and err.code() in _PRODUCE_FAILURES, err

        for node_id in killed:
            cluster.start_node(node_id)
        assert all(cluster.is_running(n) for n in (1, 2, 3))
        cluster.wait_in_sync(topic, timeout=60)
        assert _produce(cluster, topic, b"all back", 30_000) is None
    isr = cluster.partitions(topic)[0].isrs
    assert sorted(isr) == [1, 2, 3]
    # "two down" timed out, yet the leader had appended it: once the ISR grew back it was
    # committed like any other record. A timed-out acks=all write is "unknown", not "lost".
    values = [m.value() for m in _consume(cluster, topic, 4, timeout=15)]
    assert values[:2] == [b"before", b"one down"] and values[-1] == b"all back"


def test_graceful_stop_and_start_of_one_node(kafka_faults: Cluster) -> None:
    with _restart_afterwards(kafka_faults) as stopped:
        kafka_faults.stop_node(3)
        stopped.append(3)
        assert not kafka_faults.is_running(3)
        kafka_faults.start_node(3)
        assert kafka_faults.is_running(3)
    assert 3 in kafka_faults.admin().list_topics(timeout=10).brokers


def test_single_broker_fixture_uses_replication_factor_one(kafka_single: Cluster) -> None:
    topic = unique_topic()
    create_topic(kafka_single, topic, partitions=2)
    assert _produce(kafka_single, topic, b"x", 30_000) is None
    assert {len(p.replicas) for p in kafka_single.partitions(topic).values()} == {1}


def test_ports_in_use_are_refused_before_anything_starts(
    kafka_faults: Cluster, tmp_path: Path
) -> None:
    if not isinstance(kafka_faults, DevCluster):
        pytest.skip("needs the harness cluster holding its ports")
    taken = kafka_faults.layout.base_port
    other = DevCluster(1, base_port=taken, state_dir=tmp_path)
    with pytest.raises(ClusterError, match=rf"{taken}.*in use"):
        other.start()
    assert not other.is_running(1)


def _free_base_port() -> int:
    """A port below Linux's ephemeral range that is free, with the next one free too."""
    start = random.randrange(11000, 15000, 2)
    for port in range(start, start + 1000, 2):
        if port_is_free(port) and port_is_free(port + 1):
            return port
    raise AssertionError("no two free ports in a row")


def test_a_broker_that_cannot_start_is_named_with_its_output(tmp_path: Path) -> None:
    base = _free_base_port()
    cluster = DevCluster(1, base_port=base, state_dir=tmp_path, jvm_options=["-Xmx1k"])
    with pytest.raises(ClusterError) as caught:
        cluster.start(timeout=60)
    message = str(caught.value)
    assert "broker node 1" in message and "exited" in message
    assert "heap" in message.lower()  # the JVM's own complaint, from node-1/stdout.log
    assert not cluster.is_running(1)
