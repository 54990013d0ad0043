"""The suite deletes the topics a test made on a Kafka cluster once it has ended
(tests/topic_cleanup.py): each produce's replication costs the brokers more with every
partition they hold."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import kafkakv
from kafkakv.log.kafka import KafkaLog
from kafkakv.pipeline.ingest import POSITIONS_MAP
from tests.conftest import KAFKA_TIMEOUT
from tests.threads import native_threads_and_sockets, thread_name
from tests.topic_cleanup import SHARED_TOPICS, delete_made, made_in_this_test
from tests.waiting import wait_for

_MODULE_TOPIC = f"cleanup-module-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def module_topic(kafka_cluster: Any) -> Iterator[str]:
    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:
        log.create_topic(_MODULE_TOPIC, 1)
    yield _MODULE_TOPIC


def test_a_topic_a_test_made_is_recorded_and_deleted(kafka_cluster: Any, module_topic: str) -> None:
    name = f"cleanup-{uuid.uuid4().hex[:8]}"
    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:
        log.create_topic(name, 2)
    # a module-scoped fixture's topic is shared with later tests: not recorded
    assert made_in_this_test() == [name]
    delete_made(wait=KAFKA_TIMEOUT)
    assert made_in_this_test() == []
    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:  # (knows of no creation)
        wait_for(lambda: name not in log.topics(), timeout=KAFKA_TIMEOUT, what="the deletion")
        assert module_topic in log.topics()


def test_the_deleting_client_has_ended_when_the_next_test_starts(kafka_cluster: Any) -> None:
    """What deletes a test's topics runs between tests, not into the next one: once
    :func:`delete_made` returns (as at each teardown), its client's threads and connections
    are gone, or ending. Left running, they were counted by the next test, which checks that
    its clients leave none (tests/kafka/test_reader.py, fresh run 39). Only librdkafka's
    threads are the client's: another thread of this worker may start meanwhile (a fresh
    run of session 17 counted one)."""
    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as log:
        log.create_topic(f"cleanup-{uuid.uuid4().hex[:8]}", 1)
    before = native_threads_and_sockets()
    delete_made()
    deadline = time.monotonic() + 5  # a thread may still be ending as destroy returns
    while (left := _clients(native_threads_and_sockets() - before)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not left, f"the deleting client left: {left}"


def _clients(found: set[str]) -> dict[str, str]:
    """The sockets and the librdkafka threads among ``found``, with their names."""
    named = {x: thread_name(x) for x in sorted(found)}
    return {x: name for x, name in named.items() if x.startswith("socket:") or "rdk:" in name}


def test_the_topics_kafkakv_names_itself_outlive_the_test_that_made_them(
    kafka_single: Any,
) -> None:
    """The ingest jobs' positions map has one name for every job: the test that happened to
    create its topics does not own them. Deleted at its end, they vanished under the replica
    of another test running a job at the same time (an empty map, or ops offsets never
    applied). The 1-broker cluster is used because no other test makes this map there: its
    topics are made here."""
    target = f"kafka://{kafka_single.bootstrap}"
    with kafkakv.connect(target, timeout=KAFKA_TIMEOUT) as db:
        fresh = not SHARED_TOPICS & set(db.log.topics())
        db.map(POSITIONS_MAP)["a-job"] = {"id": 7}
    assert fresh, "the positions map existed before this test: its cleanup is not exercised"
    assert made_in_this_test() == []
    delete_made(wait=KAFKA_TIMEOUT)
    with kafkakv.connect(target, timeout=KAFKA_TIMEOUT) as db:
        assert set(db.log.topics()) >= SHARED_TOPICS
        assert db.map(POSITIONS_MAP)["a-job"] == {"id": 7}
