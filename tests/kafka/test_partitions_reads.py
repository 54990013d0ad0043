"""A read whose caller has less time than the log's patience waits no longer than the caller:
``Log.read_within`` on Kafka, from a client host cut off from the partition's leader.

A map's sync call reads its own update back until its deadline; each read waited up to
``READ_PATIENCE_S`` (2 s) whatever the call had left, so a call could return that much past
its timeout. Hosts that cannot be made FAIL it (``host_network``).
"""

from __future__ import annotations

import time

import pytest

from kafkakv.dev import DevCluster
from kafkakv.dev.hosts import Hosts
from kafkakv.errors import OperationTimeoutError
from kafkakv.log import Record
from kafkakv.log.kafka import KafkaLog
from kafkakv.log.kafka.log import READ_PATIENCE_S
from tests.kafka_cluster import broker_host, create_topic, unique_topic

pytestmark = pytest.mark.slow

WITHIN_S = 0.5
"""What the caller has left."""


def test_a_read_within_a_deadline_gives_up_at_the_deadline_not_after_the_logs_patience(
    hosts_cluster: DevCluster, host_network: Hosts
) -> None:
    topic = unique_topic("within")
    create_topic(hosts_cluster, topic)
    leader = hosts_cluster.leader(topic, 0)

    def on_c1() -> float:
        with KafkaLog(hosts_cluster.bootstrap, timeout=30.0) as log:
            log.append(topic, 0, [Record(b"k", b"v")])  # this log knows offset 0 exists
            cut = host_network.cut("c1", broker_host(leader))
            try:
                started = time.monotonic()
                with pytest.raises(OperationTimeoutError, match=r"within 0\.\d+ s"):
                    log.read_within(topic, 0, 0, WITHIN_S)  # a reader that never fetched
                return time.monotonic() - started
            finally:
                cut.heal()

    took = host_network.call("c1", on_c1, timeout=120)
    assert took < WITHIN_S + 0.5 < READ_PATIENCE_S, f"the read took {took:.2f} s"
