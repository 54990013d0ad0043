"""The topics a test made on a Kafka cluster are deleted once it has ended.

A broker's work for each produce grows with the partitions it holds: a follower's fetch goes
through every partition of its fetch session, and acks from every in-sync replica wait for
those fetches. On the 3-broker test cluster a put cost 12.3 ms of broker CPU (9.9 ms wall)
with 382 topics left by earlier tests, and 2.5 ms (3.2 ms wall) with none; a run of the suite
leaves thousands, so every Kafka test ran slower than the one before it, and the brokers were
the biggest consumer of the machine's two cores.

What is deleted: the topics that :meth:`KafkaLog.create_topic <kafkakv.log.kafka.KafkaLog.create_topic>`
created in this process while a test's own part ran (the test function and its function-scoped
fixtures). A topic made by a fixture of a wider scope is shared with later tests and stays; so
do topics that child processes make, and the topics of a map whose name kafkakv fixes
(:data:`SHARED_TOPICS`: the ingest jobs' positions): whichever test made one, every test that
runs a job uses it, on any worker and at the same time. Deleted after one test, it vanished
under another one's replica, which then read an empty map or waited for ops that were gone
(the family: a test's cleanup removing what it does not own alone).

The deletion is asked for after the test's teardown (its maps are closed by then), with the
creating log's client settings, by a client of its own that is destroyed before the next test
starts: its answer comes in ~60 ms, and is waited for at most :data:`_DELETE_TIMEOUT_S` (a
cluster the test stopped or cut off). Left running, that
client started its threads for the brokers it learned of, and connected, while the next test
ran: a test counting the process's threads and sockets saw them as its own (fresh run 39).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from kafkakv.log.kafka import KafkaLog
from kafkakv.map.topics import MapTopics
from kafkakv.pipeline.ingest import POSITIONS_MAP

__all__ = ["SHARED_TOPICS", "delete_made", "made_in_this_test"]

SHARED_TOPICS = frozenset(MapTopics.for_name(POSITIONS_MAP).names)
"""Topics named by kafkakv itself rather than by a test: never deleted (see the module doc)."""

_made: list[tuple[str, str]] = []  # (bootstrap, topic) made by the running test
_admin_configs: dict[str, dict[str, Any]] = {}  # bootstrap -> the creating log's admin settings
_wider_scopes: list[str] = []  # the scopes of fixtures being set up, wider than a function
_DELETE_TIMEOUT_S = 5.0


def made_in_this_test() -> list[str]:
    """The topics recorded so far for deletion after the running test."""
    return [topic for _, topic in _made]


def delete_made(wait: float = _DELETE_TIMEOUT_S) -> None:
    """Ask each cluster to delete the topics recorded (and forget them); wait up to ``wait``
    seconds in all for the answers, then destroy the deleting clients (their threads end)."""
    by_cluster: dict[str, list[str]] = {}
    for bootstrap, topic in _made:
        by_cluster.setdefault(bootstrap, []).append(topic)
    _made.clear()
    deadline = time.monotonic() + wait
    for bootstrap, topics in by_cluster.items():
        admin = AdminClient(_admin_configs[bootstrap])
        # (An operation timeout of 0 is answered with success and deletes nothing, on KRaft.)
        futures = admin.delete_topics(
            topics, operation_timeout=_DELETE_TIMEOUT_S, request_timeout=_DELETE_TIMEOUT_S
        )
        for future in futures.values():
            with contextlib.suppress(TimeoutError):  # a deletion not done is no failure
                future.exception(max(0.0, deadline - time.monotonic()))
        del admin, futures  # destroyed here: rd_kafka_destroy joins the client's threads


def _recording(
    create: Callable[[KafkaLog, str, int, Mapping[str, object] | None], None],
) -> Callable[..., None]:
    @functools.wraps(create)
    def create_topic(
        self: KafkaLog, name: str, partitions: int = 1, config: Mapping[str, object] | None = None
    ) -> None:
        create(self, name, partitions, config)
        if not _wider_scopes and name not in SHARED_TOPICS:
            bootstrap = self.settings.bootstrap
            _made.append((bootstrap, name))
            if bootstrap not in _admin_configs:
                admin = dict(self.settings.admin())
                admin["error_cb"] = _ignore  # a cluster a test stopped: nothing to say
                admin["log_level"] = 0
                _admin_configs[bootstrap] = admin

    return create_topic


def _ignore(error: Any) -> None:
    """librdkafka's error reports of the deleting client: a deletion not done is no failure."""


KafkaLog.create_topic = _recording(KafkaLog.create_topic)  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Iterator[None]:
    wide = fixturedef.scope != "function"
    if wide:
        _wider_scopes.append(fixturedef.scope)
    try:
        yield
    finally:
        if wide:
            _wider_scopes.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    delete_made()
