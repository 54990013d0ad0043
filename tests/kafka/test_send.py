"""KafkaLog's pipelined send: records the brokers refuse reach ``on_failure``, each once, with
a clear error, and a map's async updates fail with that error instead of hanging.

The brokers are made to refuse by shrinking a topic's ``max.message.bytes`` after the client
has looked it up (as an operator might): the client's own check passes, the broker says no.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

import kafkakv
from kafkakv.devcluster import Cluster
from kafkakv.errors import RecordTooLargeError
from kafkakv.log import Record
from kafkakv.log.kafka import KafkaLog

pytestmark = pytest.mark.kafka


def _shrink_max_message_bytes(cluster: Cluster, topic: str, limit: int) -> None:
    entry = ConfigEntry(
        "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    cluster.admin().incremental_alter_configs([resource])[resource].result(10)


def test_records_the_brokers_refuse_are_reported_once_each(kafka_single: Cluster) -> None:
    with KafkaLog(kafka_single.bootstrap, timeout=10) as log:
        topic = f"t-{uuid.uuid4().hex[:12]}"
        log.create_topic(topic, 1)
        log.send(topic, 0, [Record(b"small", b"x")])  # stored; the topic config is now cached
        _shrink_max_message_bytes(kafka_single, topic, 1000)
        failed: list[tuple[Record, BaseException]] = []
        all_in = threading.Event()

        def on_failure(record: Record, error: BaseException) -> None:
            failed.append((record, error))
            if len(failed) == 3:
                all_in.set()

        sent = [Record(b"k%d" % i, bytes([i]) * 5000) for i in range(3)]
        log.send(topic, 0, sent, on_failure)  # returns before the brokers answer
        assert all_in.wait(20), f"only {len(failed)} of 3 failures reported"
        assert sorted((r.key, r.value) for r, _ in failed) == [(r.key, r.value) for r in sent]
        for _, error in failed:
            assert isinstance(error, RecordTooLargeError)
            assert "max.message.bytes" in str(error)
        assert [r.key for r in log.read(topic, 0, 0)] == [b"small"]  # nothing else stored


def test_async_updates_fail_with_the_brokers_error(kafka_single: Cluster) -> None:
    name = f"m-{uuid.uuid4().hex[:8]}"
    with kafkakv.connect(f"kafka://{kafka_single.bootstrap}", timeout=10) as db:
        m = db.map(name, value_codec="bytes")
        m["before"] = b"ok"
        _shrink_max_message_bytes(kafka_single, f"{name}_ops", 1000)
        futures = [m.put_async(f"k{i}", b"x" * 5000) for i in range(5)]
        for future in futures:
            with pytest.raises(RecordTooLargeError):
                future.result(timeout=20)
        assert dict(m) == {"before": b"ok"}
        m.put_async("small", b"y").result(timeout=20)  # the map goes on working
        assert m["small"] == b"y"
