"""Fixtures of the directory suite: every test runs on every log backend, and topics are
written the way other producers write them (raw confluent-kafka on Kafka, ``log.append`` on
the embedded log)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

import kafkakv
from kafkakv.log import Log, Record
from kafkakv.log.kafka import KafkaLog
from tests.conftest import LOG_BACKENDS, open_log


class TopicWriter:
    """A topic of the test's log, and a producer that is not kafkakv's map."""

    def __init__(self, log: Log, name: str, bootstrap: str | None) -> None:
        self.log = log
        self.name = name
        self._producer = (
            None
            if bootstrap is None
            else Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        )

    def write(self, rows: Iterable[tuple[bytes | None, bytes | None]], partition: int = 0) -> None:
        """Append ``(key, value)`` rows to ``partition``; returns once all are stored."""
        rows = list(rows)
        if self._producer is None:
            self.log.append(self.name, partition, [Record(k, v) for k, v in rows])
            return
        failures: list[object] = []

        def report(err: object, _msg: object) -> None:
            if err is not None:
                failures.append(err)

        for k, v in rows:
            self._producer.produce(self.name, v, k, partition, on_delivery=report)
        assert self._producer.flush(30) == 0, "records still undelivered after 30 s"
        assert not failures, failures

    def put(self, key: str, value: Any, partition: int = 0) -> None:
        self.write([(key.encode(), None if value is None else orjson.dumps(value))], partition)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)


@pytest.fixture(params=LOG_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def dlog(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[Log]:
    lg = open_log(request, backend, tmp_path / "log")
    try:
        yield lg
    finally:
        lg.close()


@pytest.fixture
def registry() -> CollectorRegistry:
    """A registry of the test's own: series of other tests never mix in."""
    return CollectorRegistry()


@pytest.fixture
def db(dlog: Log) -> Iterator[kafkakv.Database]:
    database = kafkakv.connect(dlog)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def make_topic(request: pytest.FixtureRequest, dlog: Log) -> Iterator[Any]:
    """``make_topic(partitions=1, config=None)``: a new compacted topic and its writer."""
    writers: list[TopicWriter] = []

    def make(partitions: int = 1, config: dict[str, str] | None = None) -> TopicWriter:
        name = f"d-{uuid.uuid4().hex[:12]}"
        dlog.create_topic(name, partitions, config or {"cleanup.policy": "compact"})
        bootstrap = None
        if isinstance(dlog, KafkaLog):
            bootstrap = request.getfixturevalue("kafka_cluster").bootstrap
        writer = TopicWriter(dlog, name, bootstrap)
        writers.append(writer)
        return writer

    yield make
    for writer in writers:
        writer.close()


def sample(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


def terminal_rows(n: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    """The seed's table: terminal id -> a JSON row of 6 fields."""
    return [
        (
            f"T{i:07d}".encode(),
            orjson.dumps(
                {
                    "id": i,
                    "terminalId": f"T{i:07d}",
                    "acquirerId": f"A{i % 97:03d}",
                    "isActive": True,
                    "updatedDate": "2024-01-01 11:11:11.000",
                    "version": 1,
                }
            ),
        )
        for i in range(start, start + n)
    ]
