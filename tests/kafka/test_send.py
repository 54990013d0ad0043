"""KafkaLog's pipelined send: records the brokers refuse reach ``on_failure``, each once, with
a clear error, and a map's async updates fail with that error instead of hanging.

The brokers are made to refuse by shrinking a topic's ``max.message.bytes`` after the client
has looked it up (as an operator might): the client's own check passes, the broker says no.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import cast

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

import kafkakv
from kafkakv.dev import Cluster
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


# -- batches queued with one produce_batch call ----------------------------------------------


def _read_all(log: KafkaLog, topic: str, count: int) -> list[Record]:
    """The first ``count`` records of ``topic[0]``, waiting up to 20 s for them."""
    records: list[Record] = []
    deadline = time.monotonic() + 20
    while len(records) < count:
        after = cast(int, records[-1].offset) + 1 if records else 0
        readable = log.wait(topic, 0, after, max(0.0, deadline - time.monotonic()))
        assert readable, f"{len(records)} of {count} records readable"
        records.extend(log.read(topic, 0, after))
    return records


def test_a_full_local_queue_holds_a_batch_back_without_reordering_it(
    kafka_single: Cluster,
) -> None:
    # librdkafka queues at most 50 records here: each batch of 500 fills the queue many times.
    config = {"queue.buffering.max.messages": "50"}
    with KafkaLog(kafka_single.bootstrap, timeout=20, config=config) as log:
        topic = f"t-{uuid.uuid4().hex[:12]}"
        log.create_topic(topic, 1)
        failed: list[BaseException] = []
        sent = [Record(b"k%d" % i, b"v%d" % i) for i in range(2000)]
        for start in range(0, len(sent), 500):
            log.send(topic, 0, sent[start : start + 500], lambda _, e: failed.append(e))
        got = _read_all(log, topic, len(sent))
        assert not failed
        assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in sent]
        assert [r.offset for r in got] == list(range(len(sent)))


def test_records_the_client_refuses_fail_alone(kafka_single: Cluster) -> None:
    # The client's own message.max.bytes is below the topic's max.message.bytes: kafkakv's
    # check passes two oversized records, librdkafka refuses them when they are queued.
    with KafkaLog(kafka_single.bootstrap, timeout=20, config={"message.max.bytes": 4000}) as log:
        topic = f"t-{uuid.uuid4().hex[:12]}"
        log.create_topic(topic, 1)
        big = {5, 12}
        sent = [Record(b"k%d" % i, b"x" * (6000 if i in big else 10)) for i in range(20)]
        failed: list[tuple[Record, BaseException]] = []
        log.send(topic, 0, sent, lambda r, e: failed.append((r, e)))
        assert [r.key for r, _ in failed] == [b"k5", b"k12"]  # reported before send returned
        assert all(isinstance(e, RecordTooLargeError) for _, e in failed)
        stored = [r for i, r in enumerate(sent) if i not in big]
        got = _read_all(log, topic, len(stored))
        assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in stored]

        # Waiting for acknowledgements: the refusal is raised.
        with pytest.raises(RecordTooLargeError):
            log.send(topic, 0, sent[:13])

        # In a transaction: nothing of it becomes visible, and the writer goes on working.
        end = log.end_offset(topic, 0)
        writer = log.writer(f"w-{uuid.uuid4().hex[:8]}")
        try:
            with pytest.raises(RecordTooLargeError):
                writer.append({(topic, 0): sent})
            small = [Record(b"after%d" % i, b"y") for i in range(10)]
            first = writer.append({(topic, 0): small})[(topic, 0)]
        finally:
            writer.close()
        assert first >= end  # the aborted records were purged or sit behind an abort marker
        after = log.read(topic, 0, end)
        assert [r.key for r in after] == [r.key for r in small]


def test_a_send_that_raises_has_settled_every_other_record_first(kafka_single: Cluster) -> None:
    # A refused record fails the call; the others were queued, and when the call raises each
    # is stored already (or failed): none lands after the caller saw the error (found in CI:
    # an end offset read right after the error was passed by records still on their way).
    with KafkaLog(kafka_single.bootstrap, timeout=20, config={"message.max.bytes": 4000}) as log:
        topic = f"t-{uuid.uuid4().hex[:12]}"
        log.create_topic(topic, 1)
        for rows in (1, 40, 3000):  # record by record, and produce_batch
            before = log.end_offset(topic, 0)
            sent = [Record(b"big", b"x" * 6000)] + [Record(b"k%d" % i, b"v") for i in range(rows)]
            with pytest.raises(RecordTooLargeError):
                log.send(topic, 0, sent)
            assert log.end_offset(topic, 0) == before + rows


# -- transactions: the last partition waits for the others ------------------------------------


def test_a_transaction_writes_its_last_partition_once_the_others_are_stored(
    kafka_single: Cluster,
) -> None:
    # A read_committed reader of a partition stops at the first record of a transaction open
    # there. The map's flush writes many data records and one FLUSHED mark on the ops
    # partition that every replica reads: the mark must not sit there, holding the replicas
    # back, while the data records are still being delivered. The data topic keeps the
    # brokers' append time, so the mark's creation time shows when it was produced.
    with KafkaLog(kafka_single.bootstrap, timeout=20) as log:
        data, ops = f"d-{uuid.uuid4().hex[:12]}", f"o-{uuid.uuid4().hex[:12]}"
        log.create_topic(ops, 1)
        new = NewTopic(data, 1, 1, config={"message.timestamp.type": "LogAppendTime"})
        kafka_single.admin().create_topics([new])[data].result(10)
        rows = [Record(b"k%d" % i, b"v" * 100) for i in range(30_000)]  # many requests
        writer = log.writer(f"w-{uuid.uuid4().hex[:8]}")
        try:
            firsts = writer.append({(data, 0): rows, (ops, 0): [Record(None, b"mark")]})
        finally:
            writer.close()
        stored = _read_all(log, data, len(rows))
        (mark,) = log.read(ops, 0, firsts[(ops, 0)], max_records=1)
        assert mark.value == b"mark"
        appended = max(cast(int, r.timestamp) for r in stored)
        assert cast(int, mark.timestamp) >= appended, (
            f"the mark was made {appended - cast(int, mark.timestamp)} ms before the last "
            "data record was stored"
        )


def test_batches_longer_than_one_produce_call_keep_their_order(
    kafka_single: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kafkakv.log.kafka import log as kafka_log

    monkeypatch.setattr(kafka_log, "_BATCH_MAX", 16)  # 250 records: 16 produce_batch calls
    with KafkaLog(kafka_single.bootstrap, timeout=20) as log:
        topic = f"t-{uuid.uuid4().hex[:12]}"
        log.create_topic(topic, 1)
        sent = [Record(b"k%d" % i, b"v%d" % i) for i in range(250)]
        failed: list[BaseException] = []
        log.send(topic, 0, sent, lambda _, e: failed.append(e))
        log.send(topic, 0, sent)  # and waiting for the acknowledgements
        got = _read_all(log, topic, 2 * len(sent))
        assert not failed
        assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in sent * 2]


def test_a_record_the_brokers_refuse_inside_a_transaction_fails_it_whole(
    kafka_single: Cluster,
) -> None:
    # A writer learns of most records' delivery only from the commit: a refused record in the
    # middle of a partition's batch must still abort the transaction with a typed error, and
    # the writer go on.
    with KafkaLog(kafka_single.bootstrap, timeout=20) as log:
        data, ops = f"d-{uuid.uuid4().hex[:12]}", f"o-{uuid.uuid4().hex[:12]}"
        for topic in (data, ops):
            log.create_topic(topic, 1)
            log.send(topic, 0, [Record(b"first", b"x")])  # the topic config is now cached
        _shrink_max_message_bytes(kafka_single, data, 1000)
        writer = log.writer(f"w-{uuid.uuid4().hex[:8]}")
        try:
            rows = [Record(b"k%d" % i, b"x" * (5000 if i == 7 else 10)) for i in range(20)]
            with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes"):
                writer.append({(data, 0): rows, (ops, 0): [Record(None, b"mark")]})
            firsts = writer.append({(data, 0): rows[:7], (ops, 0): [Record(None, b"mark")]})
        finally:
            writer.close()
        assert [r.key for r in log.read(data, 0, 0)] == [b"first"] + [r.key for r in rows[:7]]
        assert [r.value for r in log.read(ops, 0, 0)] == [b"x", b"mark"]
        assert firsts[(data, 0)] >= 1 and firsts[(ops, 0)] >= 1
        assert log.read(data, 0, firsts[(data, 0)], max_records=1)[0].key == b"k0"


def test_the_room_of_a_record_is_the_clients_message_max_bytes_where_that_is_lower(
    kafka_single: Cluster,
) -> None:
    """``record_room`` counts librdkafka's own limit: a record of that size is stored, and
    one byte more is refused (by librdkafka, which the topic's limit does not stop)."""
    with KafkaLog(kafka_single.bootstrap, timeout=20, config={"message.max.bytes": 4000}) as log:
        topic = f"t-{uuid.uuid4().hex[:12]}"
        log.create_topic(topic, 1)
        room = log.record_room(topic)
        assert room == 4000 - 36  # what librdkafka counts besides key and value
        log.append(topic, 0, [Record(b"k", b"x" * (room - 1))])
        with pytest.raises(RecordTooLargeError):
            log.append(topic, 0, [Record(b"k", b"x" * room)])
        assert log.end_offset(topic, 0) == 1
