"""Asking a client for a topic's leaders again when it has stalled on a leader that moved.

When a partition's leader is cut off and Kafka elects another, each librdkafka client of a
process finds the new leader on its own, and one step of that is slow: once its request to the
old leader times out, a metadata answer names the new leader, but the old broker, dropped from
the cluster's list (KRaft fences it), is decommissioned in the same moment, and the partition
falls back to no leader. The client asks again only at its next topic scan, once a second.
Measured on the dev cluster with the ops leader's host isolated
(``tests/kafka/test_partitions.py``, librdkafka 2.16): the producer and the follower's consumer
each lost about 1 s there, one after the other; calls succeeded again 1.2 to 3.6 s after the
election, and once 5.2 s under a loaded CI run.

An answer to a metadata request the application makes sets the leaders at once. So a wait on
records this process knows exist (its own append, not yet acknowledged; records below an end
this log saw) that lasts longer than a healthy cluster takes (:data:`AFTER_S`) asks its
client for the topic's metadata, at most every :data:`EVERY_S`. The wait goes on as before:
the question only shortens it. A healthy cluster, or a wait for records nobody wrote, never
gets one. (The log's metadata client, which nothing assigned, asks again between the slices
of its own waits, in ``KafkaLog._bounds``.)
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Protocol

from confluent_kafka import KafkaException

__all__ = ["AFTER_S", "EVERY_S", "Nudge"]

AFTER_S = 0.5
"""How long a wait on records known to exist lasts before the client is asked."""
EVERY_S = 0.5
"""The shortest time between two questions of one :class:`Nudge`."""
PATIENCE_S = 0.25
"""How long one question may hold the waiting thread: it may go to a broker that is cut off
and not yet known to be, and the wait it interrupts must go on."""


class _AsksMetadata(Protocol):
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object: ...


class Nudge:
    """The rate of questions to one client (or to clients that share one); thread-safe."""

    def __init__(self) -> None:
        self._last = float("-inf")
        self._lock = threading.Lock()
        self.asked = 0
        """Questions asked so far."""

    def stalled(self, client: _AsksMetadata, topic: str, since: float) -> None:
        """Called between the slices of a wait on records of ``topic`` known to exist, which
        began at ``since`` (``time.monotonic``): asks ``client`` for the topic's metadata
        once the wait is :data:`AFTER_S` old, and again at most every :data:`EVERY_S`."""
        now = time.monotonic()
        with self._lock:
            if now - since < AFTER_S or now - self._last < EVERY_S:
                return
            self._last = now
            self.asked += 1
        # An answer sets the client's leaders even when it comes after the timeout; a failure
        # changes nothing, and the wait goes on.
        with contextlib.suppress(KafkaException, RuntimeError):
            client.list_topics(topic, timeout=PATIENCE_S)
