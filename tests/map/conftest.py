"""Fixtures of the map suite: every test runs on every log backend and every store."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kafkakv
from kafkakv.log import Log, MemoryLog
from kafkakv.log.kafka import KafkaLog
from kafkakv.map import ReplicaMap
from tests.conftest import KAFKA_TIMEOUT, LOG_BACKENDS, SHARED_LOG_BACKENDS

STORES = ["dict", "sorted", "lmdb"]

OpenMap = Callable[..., ReplicaMap[Any, Any]]


@pytest.fixture(params=LOG_BACKENDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """What ``kafkakv.connect`` takes to reach a fresh log of each backend."""
    if request.param == "embedded":
        yield str(tmp_path / "log")
    elif request.param == "memory":
        name = f"test-{uuid.uuid4().hex}"
        yield f"memory://{name}"
        MemoryLog.drop(name)
    elif request.param == "kafka":
        # a test that injects faults reaches its own cluster (tests/kafka_cluster.py)
        cluster = "kafka_faults" if "kafka_faults" in request.fixturenames else "kafka_cluster"
        yield "kafka://" + request.getfixturevalue(cluster).bootstrap
    else:
        raise AssertionError(f"unknown backend {request.param}")  # pragma: no cover


embedded_only = pytest.mark.parametrize("target", ["embedded"], indirect=True)
"""For tests about what only the embedded log has: files (locks, damage, durability) or
retention that runs by itself. What they check on Kafka is covered by tests/kafka (aborted
transactions, markers, killed flushers)."""

local_logs = pytest.mark.parametrize("target", ["embedded", "memory"], indirect=True)
"""For tests that drive the log's compaction themselves, which Kafka's brokers do not let a
client do (they run their cleaner on their own schedule)."""

shared_logs = pytest.mark.parametrize("target", SHARED_LOG_BACKENDS, indirect=True)
"""For tests whose workers are other processes, which a memory log cannot reach."""


def compact_if_possible(log: Log, topic: str) -> None:
    """Compact ``topic`` now where the log can; on Kafka the brokers decide when. Tests that
    call this must hold whether or not compaction ran."""
    if not isinstance(log, KafkaLog):
        log.compact(topic)


def log_options(target: str) -> dict[str, Any]:
    """What ``kafkakv.connect`` gets besides the target in the map suite."""
    return {"timeout": KAFKA_TIMEOUT} if target.startswith("kafka://") else {}


@pytest.fixture(params=STORES)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def map_name() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def open_map(target: str, store_kind: str, map_name: str, tmp_path: Path) -> Iterator[OpenMap]:
    """``open_map(**options)`` opens one more replica of the test's map, each with its own
    database object (as another process would); all are closed at the end. ``log=`` wraps
    that database's log in a test double (``log=lambda inner: SlowLog(inner)``)."""
    dbs: list[kafkakv.Database] = []
    counter = itertools.count()

    def open_one(
        name: str | None = None, *, log: Callable[[Log], Log] | None = None, **options: Any
    ) -> ReplicaMap[Any, Any]:
        db = kafkakv.connect(target, **log_options(target))
        dbs.append(db)
        if log is not None:
            db = kafkakv.connect(log(db.log))  # closed before the database whose log it wraps
            dbs.append(db)
        options.setdefault("store", store_kind)
        if options["store"] == "lmdb":
            options.setdefault("store_path", str(tmp_path / f"store-{next(counter)}"))
        return db.map(name or map_name, **options)

    yield open_one
    for db in reversed(dbs):
        db.close()
