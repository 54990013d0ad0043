"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from kafkakv.log import EmbeddedLog, Log, MemoryLog
from kafkakv.log.kafka import KafkaLog

# A shell that starts a command in the background without job control (`cmd &` in a script)
# starts it with SIGINT ignored, and child processes inherit that: the tests that press
# Ctrl-C on a CLI child would then wait for an exit that never comes. Start from the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Hypothesis's deadline fails an example that takes over 200 ms: a limit on time, which a
# loaded 2-core machine running the suite on several workers breaks with no bug (an
# example of tests/pipeline/test_partitions.py took 521 ms). No test relies on it: off for all.
settings.register_profile("kafkakv", deadline=None)
settings.load_profile("kafkakv")

pytest_plugins = [
    "tests.parallel",
    "tests.kafka_cluster",
    "tests.pipeline_fixtures",
    "tests.topic_cleanup",
]

LOG_BACKENDS = ["embedded", "memory", "kafka"]
"""Every Log backend the contract suite runs on. ``kafka`` is the 3-broker test cluster."""

SHARED_LOG_BACKENDS = ["embedded", "kafka"]
"""The backends other processes reach too: for tests that spawn workers or run commands. A
memory log lives inside the test's process only."""

LONG = os.environ.get("KAFKAKV_TEST_LONG") == "1"
"""The long form of the stress tests (``KAFKAKV_TEST_LONG=1``, run by hand): more updates and
processes than the bounded form that every run of the suite uses."""


def bounded(ci: int, long: int) -> int:
    """``ci`` in the suite's bounded form of a stress test, ``long`` in its long form."""
    return long if LONG else ci


KAFKA_TIMEOUT = 20.0
"""The Kafka log's timeout in tests: long enough for a broker that restarts, short enough that
a test which breaks something fails in seconds rather than minutes."""


def open_log(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Log:
    """A fresh log of ``backend``; the Kafka one starts the session's cluster on first use."""
    if backend == "embedded":
        return EmbeddedLog(tmp_path, background_cleaner=False)
    if backend == "memory":
        return MemoryLog()
    if backend == "kafka":
        cluster = request.getfixturevalue("kafka_cluster")
        return KafkaLog(cluster.bootstrap, timeout=KAFKA_TIMEOUT)
    raise AssertionError(f"unknown backend {backend}")


@pytest.fixture(params=LOG_BACKENDS)
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    """A fresh, open log of each backend."""
    lg = open_log(request, request.param, tmp_path)
    try:
        yield lg
    finally:
        lg.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests parametrized with the Kafka backend use the cluster: mark them ``kafka``."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "kafka" in callspec.params.values():
            item.add_marker(pytest.mark.kafka)


@pytest.fixture
def topic() -> str:
    """A topic name unique to the test."""
    return f"t-{uuid.uuid4().hex[:12]}"
