"""What the memory log does beyond the Log contract: named spaces shared by handles and by
``kafkakv.connect``, compaction's rules, waiters woken by close, lock waits that time out."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import kafkakv
from kafkakv.errors import ClosedError, ConfigError, OperationTimeoutError
from kafkakv.log import MemoryLog, Record
from tests.records import offset_of


@pytest.fixture
def name() -> Iterator[str]:
    """A space name unique to the test, dropped afterwards."""
    unique = f"test-{uuid.uuid4().hex[:12]}"
    yield unique
    MemoryLog.drop(unique)


def test_handles_of_one_name_share_a_space_that_outlives_them(name: str) -> None:
    with MemoryLog(name) as a:
        a.create_topic("t", 2)
        a.append("t", 1, [Record(b"k", b"v")])
        with MemoryLog(name) as b:
            assert b.topics() == ["t"] and b.end_offset("t", 1) == 1
    with MemoryLog(name) as again, MemoryLog() as other:
        assert again.read("t", 1, 0)[0].value == b"v"
        assert other.topics() == []  # an unnamed log has a space of its own
    assert MemoryLog.drop(name) and not MemoryLog.drop(name)
    with MemoryLog(name) as fresh:
        assert fresh.topics() == []


def test_connect_opens_named_memory_logs_and_commands_refuse_them(name: str) -> None:
    with kafkakv.connect(f"memory://{name}") as db:
        db.map("m")["k"] = 1
    with kafkakv.connect(f"memory://{name}") as db:
        assert dict(db.map("m")) == {"k": 1} and isinstance(db.log, MemoryLog)
    with kafkakv.connect("memory://") as db:
        assert db.log.topics() == []
    with pytest.raises(ConfigError, match="its options are none"):
        kafkakv.connect(f"memory://{name}", fsync="always")
    with pytest.raises(ConfigError, match="lives inside one Python process"):
        kafkakv.db.check_target(f"memory://{name}")
    with pytest.raises(ConfigError, match="non-empty str"):
        MemoryLog("")


def test_compaction_keeps_the_latest_record_per_key_at_its_offset() -> None:
    with MemoryLog() as log:
        log.create_topic("c", 1, {"cleanup.policy": "compact", "delete.retention.ms": 0})
        log.append("c", 0, [Record(b"a", b"1"), Record(b"b", b"1"), Record(b"a", b"2")])
        log.append("c", 0, [Record(b"b", None), Record(b"c", b"1")])
        (result,) = log.compact("c")
        assert (result.records_in, result.records_out) == (5, 3)
        kept = [(offset_of(r), r.key, r.value) for r in log.read("c", 0, 0)]
        assert kept == [(2, b"a", b"2"), (3, b"b", None), (4, b"c", b"1")]
        assert log.read("c", 0, 1)[0].offset == 2  # a read in a gap starts at the next record
        assert (log.start_offset("c", 0), log.end_offset("c", 0)) == (0, 5)
        # The tombstone survived its first cleaning; with delete.retention.ms=0 the next
        # cleaning drops it.
        log.compact("c")
        assert [r.key for r in log.read("c", 0, 0)] == [b"a", b"c"]
        assert log.check() == []
        log.create_topic("d", 1)
        with pytest.raises(ConfigError, match="not compacted"):
            log.compact("d")


def test_records_younger_than_the_compaction_lag_stay() -> None:
    with MemoryLog() as log:
        log.create_topic("c", 1, {"cleanup.policy": "compact", "min.compaction.lag.ms": 60_000})
        old = int(time.time() * 1000) - 120_000
        log.append("c", 0, [Record(b"a", b"1", timestamp=old), Record(b"a", b"2", timestamp=old)])
        log.append("c", 0, [Record(b"a", b"3"), Record(b"a", b"4", timestamp=old)])
        log.compact("c")
        # The first young record bounds the cleanable part: it and all after it stay.
        assert [r.value for r in log.read("c", 0, 0)] == [b"2", b"3", b"4"]


def test_closing_a_handle_wakes_its_waiters_and_leaves_others_waiting(name: str) -> None:
    log, other = MemoryLog(name), MemoryLog(name)
    log.create_topic("t", 1)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            log.wait("t", 0, 0, timeout=30)
        except BaseException as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)
    log.close()
    waiter.join(5)
    assert not waiter.is_alive() and isinstance(raised[0], ClosedError)
    assert other.wait("t", 0, 0, timeout=0.05) is False  # the space and its other handles go on
    other.close()


def test_an_append_waits_for_the_lock_no_longer_than_its_timeout() -> None:
    with MemoryLog() as log:
        log.create_topic("t", 1)
        with log._locked(None):  # another thread in the middle of its work, for the test
            failed: list[BaseException] = []
            appender = threading.Thread(
                target=lambda: failed.extend(_raised(log, timeout=0.1)), name="appender"
            )
            appender.start()
            appender.join(5)
        assert [type(e) for e in failed] == [OperationTimeoutError]
        assert log.end_offset("t", 0) == 0


def _raised(log: MemoryLog, timeout: float) -> list[BaseException]:
    try:
        log.append("t", 0, [Record(b"k", b"v")], timeout=timeout)
    except BaseException as exc:
        return [exc]
    return []
