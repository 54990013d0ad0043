"""Fixtures of the map suite: every test runs on every log backend and every store."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kafkakv
from kafkakv.log import Log
from kafkakv.log.kafka import KafkaLog
from kafkakv.map import ReplicaMap
from tests.conftest import KAFKA_TIMEOUT, LOG_BACKENDS

STORES = ["dict", "sorted", "lmdb"]

OpenMap = Callable[..., ReplicaMap[Any, Any]]


@pytest.fixture(params=LOG_BACKENDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """What ``kafkakv.connect`` takes to reach a fresh log of each backend."""
    if request.param == "embedded":
        return str(tmp_path / "log")
    if request.param == "kafka":
        return "kafka://" + request.getfixturevalue("kafka_cluster").bootstrap
    raise AssertionError(f"unknown backend {request.param}")  # pragma: no cover


embedded_only = pytest.mark.parametrize("target", ["embedded"], indirect=True)
"""For tests that drive the log's compaction or retention themselves, which only the embedded
log lets a client do (Kafka's brokers run their cleaner on their own schedule). What they check
on Kafka is covered by tests/kafka (aborted transactions, markers, killed flushers)."""


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
    database object (as another process would); all are closed at the end."""
    dbs: list[kafkakv.Database] = []
    counter = itertools.count()

    def open_one(name: str | None = None, **options: Any) -> ReplicaMap[Any, Any]:
        db = kafkakv.connect(target, **log_options(target))
        dbs.append(db)
        options.setdefault("store", store_kind)
        if options["store"] == "lmdb":
            options.setdefault("store_path", str(tmp_path / f"store-{next(counter)}"))
        return db.map(name or map_name, **options)

    yield open_one
    for db in dbs:
        db.close()
