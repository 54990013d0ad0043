"""The Follower loop (kafkakv.log.follow) on a real embedded log: what arrives is handed over
promptly, idle and stop bounds hold, a log that cannot answer is waited out, a closed log is
an error unless stopping."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from kafkakv.errors import ClosedError, LogUnavailableError
from kafkakv.log import EmbeddedLog, Log, Record
from kafkakv.log.base import TopicPartition as Partition
from kafkakv.log.follow import Follower
from tests.doubles import ForwardingLog


class Handed(list[list[Partition]]):
    """A handle that notes each hand-over."""

    def __call__(self, ready: Sequence[Partition]) -> bool:
        self.append(list(ready))
        return True


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EmbeddedLog]:
    with EmbeddedLog(tmp_path / "log") as lg:
        lg.create_topic("t", partitions=3)
        yield lg


def test_records_appended_elsewhere_are_handed_over_as_they_arrive(log: EmbeddedLog) -> None:
    positions = {("t", p): 0 for p in range(3)}
    seen: list[tuple[int, bytes | None]] = []
    stop = threading.Event()

    def handle(ready: Sequence[Partition]) -> bool:
        found = False
        for topic, p in ready:
            for record in log.read(topic, p, positions[(topic, p)]):
                seen.append((p, record.value))
                positions[(topic, p)] = (record.offset or 0) + 1
                found = True
        if len(seen) == 3:
            stop.set()
        return found

    follower = Follower(log, "test", wait_slice=5.0)
    thread = threading.Thread(target=follower.run, args=(lambda: positions, handle, stop.is_set))
    thread.start()
    started = time.monotonic()
    for p in (2, 0, 1):
        log.append("t", p, [Record(b"k", f"v{p}".encode())])
        time.sleep(0.05)
    thread.join(10)
    # Woken by each append, not by the 5 s slice.
    assert not thread.is_alive() and time.monotonic() - started < 4
    assert sorted(seen) == [(0, b"v0"), (1, b"v1"), (2, b"v2")]


def test_idle_timeout_and_stop_end_the_loop(log: EmbeddedLog) -> None:
    follower = Follower(log, "test", wait_slice=5.0)
    started = time.monotonic()
    follower.run(lambda: {("t", 0): 0}, lambda ready: False, lambda: False, idle_timeout=0.3)
    assert 0.25 < time.monotonic() - started < 3
    follower.run(lambda: {("t", 0): 0}, lambda ready: False, lambda: True)  # stopped: at once


def test_also_ready_partitions_are_handed_over_without_waiting(log: EmbeddedLog) -> None:
    handed = Handed()
    follower = Follower(log, "test", wait_slice=5.0)
    started = time.monotonic()
    follower.run(
        lambda: {("t", 0): 0},
        handed,
        lambda: bool(handed),
        also_ready=lambda: [("t", 1)],
    )
    assert handed == [[("t", 1)]] and time.monotonic() - started < 2


class _Flaky(ForwardingLog):
    """A log that cannot answer the first ``failures`` waits."""

    def __init__(self, inner: Log, failures: int = 2) -> None:
        super().__init__(inner)
        self.failures = failures

    def wait_any(self, positions: Mapping[Partition, int], timeout: float | None) -> set[Partition]:
        if self.failures:
            self.failures -= 1
            raise LogUnavailableError("brokers down (a test)")
        return super().wait_any(positions, timeout)


def test_a_log_that_cannot_answer_is_waited_out(tmp_path: Path) -> None:
    with _Flaky(EmbeddedLog(tmp_path / "log")) as lg:
        lg.create_topic("t", partitions=1)
        lg.append("t", 0, [Record(b"k", b"v")])
        handed = Handed()
        follower = Follower(lg, "test", retry_pause=0.01)
        follower.run(lambda: {("t", 0): 0}, handed, lambda: bool(handed))
        assert lg.failures == 0 and handed == [[("t", 0)]]


def test_a_log_closed_under_a_running_follower_raises(tmp_path: Path) -> None:
    lg = EmbeddedLog(tmp_path / "log")
    lg.create_topic("t", partitions=1)
    lg.close()
    follower = Follower(lg, "test")
    with pytest.raises(ClosedError):
        follower.run(lambda: {("t", 0): 0}, lambda ready: True, lambda: False)
    answers = iter([False, True])  # running, then stopping by the time the error arrives
    follower.run(lambda: {("t", 0): 0}, lambda ready: True, lambda: next(answers))
