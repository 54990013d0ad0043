"""The Kafka reader's buffers: a partition this thread stopped reading does not grow without
bound while the thread reads others, and reading it again later still returns the right
records."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import TopicPartition

from kafkakv.dev import Cluster
from kafkakv.log import Record
from kafkakv.log.kafka import KafkaLog, reader
from tests.conftest import KAFKA_TIMEOUT
from tests.threads import native_threads_and_sockets, thread_name
from tests.waiting import wait_for

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


def test_a_read_never_reports_the_end_before_an_end_offset_the_log_gave(
    kafka_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another client's transaction commits and this log's end_offset sees it, while this
    # thread's consumer, which reported the end before, has not fetched the new records yet:
    # its fetching is paused until the read starts (on a loaded machine its thread was starved
    # so). The read waits for them rather than report the end: a deep check that rebuilt a
    # map from its data topic took an older flush point so, in a fresh-clone run.
    with (
        KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log,
        KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as other,
    ):
        topic = f"t-{uuid.uuid4().hex[:10]}"
        log.create_topic(topic, 1)
        at = log.end_offset(topic, 0)
        assert log.read(topic, 0, at) == []  # this thread's consumer reported the end
        consumer, tp = log._reader().consumer, TopicPartition(topic, 0)
        consumer.pause([tp])  # (resume() waits for a poll() of another thread to end)
        writer = other.writer(f"w-{uuid.uuid4().hex[:8]}")
        try:
            writer.append({(topic, 0): [Record(b"k", b"v")]})
        finally:
            writer.close()
        assert log.end_offset(topic, 0) > at
        pump = reader.Reader._pump

        def fetch_from_now_on(self: reader.Reader, timeout: float) -> None:
            consumer.resume([tp])
            monkeypatch.setattr(reader.Reader, "_pump", pump)
            pump(self, timeout)

        monkeypatch.setattr(reader.Reader, "_pump", fetch_from_now_on)
        got = log.read(topic, 0, at)
        assert [r.value for r in got] == [b"v"], "the read reported the end before end_offset"


_READ_WHILE_CLOSING = """
import sys, threading, time
from kafkakv.errors import ClosedError
from kafkakv.log import Record
from kafkakv.log.kafka import KafkaLog

bootstrap, topic, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
wrong = []

def read(log, kind, start):
    start.wait()
    try:
        while True:
            if kind == 0:
                assert len(log.read(topic, 0, 0, max_records=10)) == 10
            else:
                log.wait_any({(topic, 0): 10**6}, 0.05)  # nothing there: waits a slice
                log._check_open()
    except ClosedError:
        return
    except BaseException as exc:
        wrong.append(repr(exc))

with KafkaLog(bootstrap, timeout=timeout) as log:
    log.create_topic(topic, 1)
    log.send(topic, 0, [Record(b"k", b"%d" % i) for i in range(100)])
for round_ in range(8):
    log = KafkaLog(bootstrap, timeout=timeout)
    start = threading.Barrier(4)
    threads = [threading.Thread(target=read, args=(log, k % 2, start)) for k in range(3)]
    for t in threads:
        t.start()
    start.wait()
    time.sleep(0.3 + 0.05 * round_)  # every reader has its consumer by now, most are polling
    log.close()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a reader did not end"
print("wrong:", wrong)
sys.exit(1 if wrong else 0)
"""


def test_closing_the_log_under_threads_that_read_ends_their_reads_and_never_crashes(
    kafka_cluster: Cluster,
) -> None:
    """Threads read and wait on a Kafka log while another thread closes it. Each call answers
    or raises ClosedError, and the process lives: librdkafka frees a consumer in close(), and
    one closed under another thread's poll() crashed the process (confluent-kafka-python
    issue 1797). Run in a child process, so that a crash fails this test alone."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _READ_WHILE_CLOSING,
            kafka_cluster.bootstrap,
            topic,
            str(KAFKA_TIMEOUT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])


def test_close_leaves_no_client_running_while_the_log_object_lives(kafka_cluster: Cluster) -> None:
    """After close() nothing of the log's librdkafka clients runs on, although the caller
    still holds the log and its writer: before, the producers and the admin client kept
    their threads and connections (retrying a stopped cluster for good) until the garbage
    collector, or the interpreter's exit, destroyed them."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    before = native_threads_and_sockets()
    log = KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT)
    log.create_topic(topic, 1)
    log.append(topic, 0, [Record(b"k", b"v")])
    log.send(topic, 0, [Record(b"k", b"s")], on_failure=lambda *failed: None)
    wait_for(lambda: len(log.read(topic, 0, 0)) == 2, 10, "the sent record is readable")
    writer = log.writer(f"w-{uuid.uuid4().hex[:8]}")
    writer.append({(topic, 0): [Record(b"k", b"w")]})
    opened = native_threads_and_sockets() - before
    assert len(opened) > 10, opened  # the clients' threads and connections
    writer.close()
    log.close()
    deadline = time.monotonic() + 5  # the log's own threads end within a poll slice
    while (left := opened & native_threads_and_sockets()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"still running after close(): { {x: thread_name(x) for x in left} }"
    assert log is not None and writer is not None  # both still held here
