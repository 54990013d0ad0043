"""The directory contract, on every log backend: loading to the end, following, the mapping
API, transforms, errors, listeners, partitions, lifecycle and metrics."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

import kafkakv
from kafkakv import DirectoryRecord
from kafkakv.directory import DirectoryState
from kafkakv.errors import (
    ClosedError,
    ConfigError,
    OperationTimeoutError,
    UnknownTopicError,
)
from tests.directory.conftest import sample, terminal_rows
from tests.waiting import wait_for


def test_loads_everything_present_at_start(
    db: kafkakv.Database,
    make_topic: Any,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = make_topic()
    topic.write(terminal_rows(300))
    topic.put("T0000007", {"acquirerId": "changed"})  # a later row wins
    topic.write([(b"T0000008", None)])  # a tombstone deletes
    with caplog.at_level(logging.INFO, logger="kafkakv.directory"):
        d = db.directory(topic.name, metrics=registry)
    ready_lines = [r.getMessage() for r in caplog.records if "ready" in r.getMessage()]
    assert len(ready_lines) == 1, ready_lines
    assert f"directory {topic.name} ready: 299 keys from 302 records" in ready_lines[0]
    assert ready_lines[0].endswith(" s, 0 errors")
    assert d.ready and d.state is DirectoryState.READY
    assert len(d) == 299
    assert d["T0000007"] == {"acquirerId": "changed"}
    assert d["T0000001"]["acquirerId"] == "A001"
    assert "T0000008" not in d and d.get("T0000008") is None and d.get("x", 5) == 5
    with pytest.raises(KeyError):
        d["T0000008"]
    assert sorted(d) == sorted(k for k, _ in d.items())
    assert dict(d.items()) == {k: d[k] for k in d}
    assert len(list(d.values())) == 299
    assert d.records_applied == 302 and d.error_count == 0
    assert d.positions() == d.end_offsets() == {0: db.log.end_offset(topic.name, 0)}
    assert d.ready_seconds is not None and d.ready_seconds > 0
    labels = {"directory": topic.name, "topic": topic.name}
    assert sample(registry, "kafkakv_directory_ready", **labels) == 1
    assert sample(registry, "kafkakv_directory_records_total", **labels) == 302
    assert sample(registry, "kafkakv_directory_entries", **labels) == 299
    assert sample(registry, "kafkakv_directory_lag", **labels, partition="0") == 0


def test_empty_topic_is_ready_at_once(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic(partitions=3)
    d = db.directory(topic.name, metrics=registry)
    assert d.ready and len(d) == 0 and list(d) == []
    assert d.positions() == {0: 0, 1: 0, 2: 0}


def test_follows_new_records_and_calls_listeners_in_order(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    topic.put("a", 1)
    d = db.directory(topic.name, metrics=registry)
    seen: list[tuple[Any, Any, Any]] = []

    def broken(key: Any, old: Any, new: Any) -> None:
        raise RuntimeError("a listener bug")

    d.add_listener(broken)  # logged, and the directory goes on
    d.add_listener(lambda k, o, n: seen.append((k, o, n)))
    topic.put("a", 2)
    topic.put("b", {"x": 1})
    topic.put("a", None)
    topic.put("a", None)  # deleting an absent key changes nothing: no call
    topic.put("b", {"x": 1})  # the same value again: no change, no call
    topic.put("c", 3)
    # Listeners run after their batch is applied: "c" may be readable a moment before.
    wait_for(lambda: len(seen) >= 4)
    assert seen == [("a", 1, 2), ("b", None, {"x": 1}), ("a", 2, None), ("c", None, 3)]
    assert dict(d.items()) == {"b": {"x": 1}, "c": 3}
    d.remove_listener(broken)
    with pytest.raises(ValueError):
        d.remove_listener(broken)
    labels = {"directory": topic.name, "topic": topic.name}
    wait_for(lambda: sample(registry, "kafkakv_directory_entries", **labels) == 2)


def test_transform_maps_rows_and_inactive_rows_delete(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    seen: list[DirectoryRecord] = []

    def terminal_to_acquirer(record: DirectoryRecord) -> tuple[str, str | None] | None:
        seen.append(record)
        row = record.value
        if row.get("skip"):
            return None  # deletes the record's own key
        return row["terminalId"], row["acquirerId"] if row["isActive"] else None

    def row(i: int, acquirer: str, active: bool = True) -> tuple[bytes, bytes]:
        value = {"terminalId": f"t{i}", "acquirerId": acquirer, "isActive": active}
        return str(i).encode(), orjson.dumps(value)

    topic.write([row(1, "a1"), row(2, "a2"), row(3, "a3"), row(2, "a2", active=False)])
    topic.write([(b"9", b'{"skip": true}')])
    d = db.directory(topic.name, transform=terminal_to_acquirer, metrics=registry)
    assert dict(d.items()) == {"t1": "a1", "t3": "a3"}
    assert [(r.key, r.partition, r.offset) for r in seen[:2]] == [("1", 0, 0), ("2", 0, 1)]
    topic.write([row(3, "a3", active=False), row(4, "a4")])
    wait_for(lambda: "t4" in d)
    assert dict(d.items()) == {"t1": "a1", "t4": "a4"}
    assert d.error_count == 0


def test_bad_records_are_recorded_skipped_and_counted(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    topic.write([(b"good", b"1"), (b"bad", b"{not json"), (b"\xff\xfe", b"2"), (b"ok", b"3")])

    def transform(record: DirectoryRecord) -> tuple[Any, Any]:
        if record.value == 3:
            raise ValueError("three is not allowed")
        return record.key, record.value

    d = db.directory(topic.name, transform=transform, metrics=registry)
    assert dict(d.items()) == {"good": 1}
    errors = d.errors()
    assert [(e.partition, e.offset, e.key) for e in errors] == [
        (0, 1, b"bad"),
        (0, 2, b"\xff\xfe"),
        (0, 3, b"ok"),
    ]
    assert errors[0].error.startswith("JSONDecodeError")
    assert errors[1].error.startswith("UnicodeDecodeError")
    assert "three is not allowed" in errors[2].error
    assert "Traceback" in errors[2].traceback and "transform" in errors[2].traceback
    labels = {"directory": topic.name, "topic": topic.name}
    assert sample(registry, "kafkakv_directory_errors_total", **labels) == 3
    topic.write([(b"later", b"4"), (b"worse", b"[")])  # and it keeps following
    wait_for(lambda: d.error_count == 4)
    assert d["later"] == 4 and d.errors()[-1].key == b"worse"


def test_errors_kept_are_bounded(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    topic.write([(f"k{i}".encode(), b"?") for i in range(30)])
    d = db.directory(topic.name, max_errors=10, metrics=registry)
    assert d.error_count == 30 and len(d) == 0
    assert [e.offset for e in d.errors()] == list(range(20, 30))


def test_partition_subset_holds_only_those_partitions(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic(partitions=3)
    for p in range(3):
        topic.write([(f"p{p}-{i}".encode(), str(p).encode()) for i in range(5)], partition=p)
    d = db.directory(topic.name, partitions=[2, 0], metrics=registry)
    assert d.partitions == (0, 2)
    assert sorted(d) == sorted(f"p{p}-{i}" for p in (0, 2) for i in range(5))
    assert set(d.positions()) == {0, 2}
    with pytest.raises(ConfigError, match="partitions"):
        db.directory(topic.name, partitions=[3], metrics=registry)
    with pytest.raises(ConfigError, match="partitions"):
        db.directory(topic.name, partitions=[], metrics=registry)


def test_bad_options_raise_typed_errors(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    with pytest.raises(UnknownTopicError):
        db.directory("no-such-topic-here", metrics=registry)
    with pytest.raises(ConfigError, match="codec"):
        db.directory(topic.name, value_codec="yaml", metrics=registry)
    with pytest.raises(ConfigError, match="store"):
        db.directory(topic.name, store="nowhere", metrics=registry)
    with pytest.raises(ConfigError, match="path"):
        db.directory(topic.name, store="lmdb", metrics=registry)
    with pytest.raises(ConfigError, match="callable"):
        db.directory(topic.name, transform="upper", metrics=registry)  # type: ignore[arg-type]
    first = db.directory(topic.name, metrics=registry)
    with pytest.raises(ConfigError, match="already reports"):
        db.directory(topic.name, metrics=registry)
    second = db.directory(topic.name, name="second", metrics=registry)
    assert second.ready and first.ready


def held_back(release: threading.Event, seconds: float) -> Any:
    """A transform that waits for ``release`` (at most ``seconds``) before each row."""

    def transform(record: DirectoryRecord) -> tuple[Any, Any]:
        release.wait(seconds)
        return record.key, record.value

    return transform


def test_non_blocking_start_and_wait_ready_timeout(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    topic.write(terminal_rows(20))
    release = threading.Event()
    slow = held_back(release, 10)
    d = db.directory(topic.name, transform=slow, start=False, metrics=registry)
    assert (d.state, d.ready) == (DirectoryState.NEW, False)
    with pytest.raises(ConfigError, match="not started"):
        d.wait_ready(0.1)
    began = time.monotonic()
    d.start()
    d.start()  # idempotent
    assert time.monotonic() - began < 0.5  # returns at once: loading is in the background
    with pytest.raises(OperationTimeoutError, match=r"not ready after 0\.2 s"):
        d.wait_ready(0.2)
    assert not d.ready and d.state is DirectoryState.LOADING
    release.set()
    d.wait_ready(20)
    assert d.ready and len(d) == 20


def test_blocking_open_times_out_and_closes(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    topic.write(terminal_rows(3))
    release = threading.Event()
    stuck = held_back(release, 5)
    with pytest.raises(OperationTimeoutError):
        db.directory(topic.name, transform=stuck, timeout=0.3, metrics=registry)
    release.set()
    # The timed-out directory was closed: its name is free again.
    assert db.directory(topic.name, metrics=registry).ready


def test_close_makes_reads_raise_and_database_close_closes_it(
    dlog: Any, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    topic.put("a", 1)
    db = kafkakv.connect(dlog)
    d = db.directory(topic.name, metrics=registry)
    other = db.directory(topic.name, name="other", metrics=registry)
    d.close()
    d.close()  # idempotent
    for read in (lambda: d["a"], lambda: d.get("a"), lambda: len(d), lambda: list(d)):
        with pytest.raises(ClosedError):
            read()
    with pytest.raises(ClosedError):
        d.wait_ready(1)
    with pytest.raises(ClosedError):
        d.start()
    assert (
        sample(registry, "kafkakv_directory_ready", directory=topic.name, topic=topic.name) is None
    )
    assert other["a"] == 1
    with db.directory(topic.name, name="scoped", metrics=registry) as scoped:
        assert scoped["a"] == 1
    assert scoped.state is DirectoryState.CLOSED
    with pytest.raises(ClosedError):
        "a" in scoped  # noqa: B015
    db.close()
    assert other.state is DirectoryState.CLOSED
    with pytest.raises(ClosedError):
        other.get("a")
    with pytest.raises(ClosedError):
        db.directory(topic.name, metrics=registry)


def test_reads_from_many_threads_while_following(
    db: kafkakv.Database, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    topic.write([(f"k{i}".encode(), b"0") for i in range(200)])
    d = db.directory(topic.name, metrics=registry)
    failures: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                pairs = dict(d.items())
                assert len(pairs) == 200  # updates only: never a key missing
                assert all(isinstance(v, int) for v in pairs.values())
                assert d.get("k5") is not None and "k7" in d and len(d) == 200
                assert sum(1 for _ in d) == 200
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for round_ in range(1, 6):
        topic.write([(f"k{i}".encode(), str(round_).encode()) for i in range(200)])
    wait_for(lambda: all(v == 5 for v in d.values()))
    stop.set()
    for t in threads:
        t.join(10)
    assert not failures, failures[0]


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_a_log_that_fails_under_it_stops_following_and_keeps_serving(
    dlog: Any, make_topic: Any, registry: CollectorRegistry
) -> None:
    topic = make_topic()
    topic.put("a", 1)
    db = kafkakv.connect(dlog)
    d = db.directory(topic.name, metrics=registry)
    late = db.directory(topic.name, name="late", start=False, metrics=registry)
    dlog.close()
    wait_for(lambda: d.state is DirectoryState.FAILED)
    assert isinstance(d.failure, ClosedError) and d["a"] == 1 and d.ready
    late.start()
    with pytest.raises(ClosedError):
        late.wait_ready(10)
    assert late.state is DirectoryState.FAILED and not late.ready
    db.close()
