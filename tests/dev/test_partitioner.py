"""A key written by the Java client lands where kafkakv.log.partitioner says it does."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafkakv.dev import Cluster, fetch_kafka, find_java
from kafkakv.log.partitioner import partition_for
from tests.kafka_cluster import create_topic, unique_topic

pytestmark = pytest.mark.kafka

PROGRAM = Path(__file__).with_name("KeyedProducer.java")
KEYS = 200
PARTITIONS = 7


def _read_all(cluster: Cluster, topic: str, count: int, timeout: float = 30.0) -> dict[bytes, int]:
    """key → partition of the first ``count`` records of ``topic`` (every partition, from 0)."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": unique_topic("g"),
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    found: dict[bytes, int] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(found) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            key, partition = msg.key(), msg.partition()
            assert key is not None and partition is not None
            found[key] = partition
    finally:
        consumer.close()
    return found


def test_java_default_partitioner_agrees_with_partition_for(kafka_cluster: Cluster) -> None:
    topic = unique_topic("java")
    create_topic(kafka_cluster, topic, partitions=PARTITIONS)
    jars = fetch_kafka()
    run = subprocess.run(
        [
            find_java(),
            "-cp",
            jars.classpath,
            str(PROGRAM),
            kafka_cluster.bootstrap,
            topic,
            str(KEYS),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    java_says = {line.split()[0].encode(): int(line.split()[1]) for line in run.stdout.splitlines()}
    assert len(java_says) == KEYS

    stored = _read_all(kafka_cluster, topic, KEYS)
    assert stored == java_says  # what the program printed is what the brokers hold
    assert len(set(stored.values())) == PARTITIONS  # 200 keys reach every partition
    wrong = {k: p for k, p in stored.items() if partition_for(k, PARTITIONS) != p}
    assert not wrong, f"partition_for disagrees with the Java client on {wrong}"
