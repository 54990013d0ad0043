"""The question a stalled wait asks its client (kafkakv.log.kafka.nudge): when, how often,
and that a client which cannot answer holds the wait no longer than PATIENCE_S.

The client is a real librdkafka producer whose bootstrap server does not listen, so every
question fails; tests/kafka/test_partitions.py shows what the questions do for a failover."""

from __future__ import annotations

import logging
import time

from confluent_kafka import Producer

from kafkakv.log.kafka.nudge import AFTER_S, EVERY_S, PATIENCE_S, Nudge


def _unanswered() -> Producer:
    quiet = logging.getLogger("tests.nudge.librdkafka")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    return Producer({"bootstrap.servers": "127.0.0.1:9", "logger": quiet})


def test_a_wait_asks_once_it_is_old_enough_then_at_most_every_interval() -> None:
    client, nudge = _unanswered(), Nudge()
    began = time.monotonic()
    nudge.stalled(client, "t", began)
    assert nudge.asked == 0  # a young wait asks nothing
    old = began - AFTER_S
    start = time.monotonic()
    nudge.stalled(client, "t", old)
    took = time.monotonic() - start
    assert nudge.asked == 1
    assert took < PATIENCE_S + 0.5, f"an unanswered question held the wait {took:.2f} s"
    nudge.stalled(client, "t", old)
    assert nudge.asked == 1  # within EVERY_S of the last question
    time.sleep(EVERY_S - (time.monotonic() - start) + 0.05)
    nudge.stalled(client, "t", old)
    assert nudge.asked == 2


def test_clients_sharing_a_nudge_share_its_rate() -> None:
    nudge = Nudge()
    old = time.monotonic() - AFTER_S
    nudge.stalled(_unanswered(), "a", old)
    nudge.stalled(_unanswered(), "b", old)
    assert nudge.asked == 1
