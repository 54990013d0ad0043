"""Bells (kafkakv.log.embedded.bell): an append wakes the waiters of every other open log through
the appending log's bell, and its own log's waiters in the process, except those deaf to it.
No process is woken by the kernel for its own appends."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkakv.log import EmbeddedLog, Record
from kafkakv.log.embedded.bell import BELLS

ONE = [Record(b"k", b"v")]


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[tuple[EmbeddedLog, EmbeddedLog]]:
    a = EmbeddedLog(str(tmp_path / "log"), background_cleaner=False)
    a.create_topic("t", 2)
    b = EmbeddedLog(str(tmp_path / "log"), background_cleaner=False)
    yield a, b
    b.close()
    a.close()


class _CountedPoll:
    """The notifier's ``poll``, counting the returns with events: the kernel's wake-ups."""

    def __init__(self, real: Any) -> None:
        self.real, self.woken = real, 0

    def poll(self, *args: Any) -> Any:
        events = self.real.poll(*args)
        if events:
            self.woken += 1
        return events

    def register(self, *args: Any) -> None:
        self.real.register(*args)


def _counted(log: EmbeddedLog) -> _CountedPoll:
    notifier = log._notifier
    counted = _CountedPoll(notifier._poller)
    notifier._poller = counted  # type: ignore[assignment]
    return counted


def _bells(tmp_path: Path, p: int = 0) -> list[str]:
    return sorted(os.listdir(tmp_path / "log" / "topics" / "t" / str(p) / BELLS))


def _timed_wait(wait: Any, positions: dict[tuple[str, int], int], timeout: float) -> list[Any]:
    """Start ``wait(positions, timeout)`` in a thread; the list gets (result, seconds taken)."""
    out: list[Any] = []

    def run() -> None:
        start = time.monotonic()
        out.append(wait(positions, timeout))
        out.append(time.monotonic() - start)

    thread = threading.Thread(target=run)
    thread.start()
    out.append(thread)
    time.sleep(0.1)  # asleep in poll by now
    return out


def _result(waiting: list[Any]) -> tuple[Any, float]:
    waiting[0].join(10)
    assert not waiting[0].is_alive()
    return waiting[1], waiting[2]


def test_no_waiter_is_woken_by_appends_of_the_one_it_is_deaf_to(
    logs: tuple[EmbeddedLog, EmbeddedLog],
) -> None:
    """A replica's follower waits deaf to its writers: twenty of their appends, 20 ms apart,
    wake its thread not once (before bells, the head's watch woke it for each), and its wait
    ends by its timeout, having found them."""
    a, _ = logs
    a.append("t", 0, ONE)  # the bell exists, as after a replica's first update
    counted = _counted(a)
    own = a.own_appends("replica")
    waiting = _timed_wait(own.wait_any, {("t", 0): 1}, 0.8)
    for _ in range(20):
        own.append("t", 0, ONE)
        time.sleep(0.02)
    found, took = _result(waiting)
    assert found == {("t", 0)}
    assert took >= 0.75
    assert counted.woken == 0


def test_a_deaf_waiter_wakes_at_once_for_every_other_append(
    logs: tuple[EmbeddedLog, EmbeddedLog],
) -> None:
    """Deaf to one origin only: an append by another log, by its own log for another origin,
    or with no origin ends the wait within milliseconds."""
    a, b = logs
    own = a.own_appends("replica")
    appends: list[Callable[[], object]] = [
        lambda: b.append("t", 0, ONE),
        lambda: a.own_appends("someone else").append("t", 0, ONE),
        lambda: a.append("t", 0, ONE),
        lambda: a.own_appends("someone else").send("t", 0, ONE),
    ]
    for i, append in enumerate(appends):
        waiting = _timed_wait(own.wait_any, {("t", 0): i}, 5)
        append()
        found, took = _result(waiting)
        assert found == {("t", 0)}, i
        assert took < 0.5, (i, took)


def test_a_waiter_that_hears_all_wakes_for_its_own_logs_appends(
    logs: tuple[EmbeddedLog, EmbeddedLog],
) -> None:
    """Log.wait and wait_any keep their contract in the appending process: woken at once by an
    append of their own log, whatever its origin, on the partition they wait for only."""
    a, _ = logs
    waiting = _timed_wait(a.wait_any, {("t", 0): 0}, 5)
    a.own_appends("replica").append("t", 0, ONE)
    found, took = _result(waiting)
    assert found == {("t", 0)} and took < 0.5
    counted = _counted(a)
    waiting = _timed_wait(a.wait_any, {("t", 0): 1}, 0.5)
    a.append("t", 1, ONE)  # another partition: nobody on partition 0 is poked
    found, took = _result(waiting)
    assert found == set() and took >= 0.45
    assert counted.woken == 0


def test_a_bell_made_while_a_log_waits_is_heard_from_its_first_ring(
    tmp_path: Path, logs: tuple[EmbeddedLog, EmbeddedLog]
) -> None:
    """The waiter watches the bells directory: a log that appears and appends after the wait
    began wakes it at once, as does one whose bell was there before."""
    a, b = logs
    waiting = _timed_wait(a.wait_any, {("t", 0): 0}, 5)
    assert _bells(tmp_path) == []
    b.append("t", 0, ONE)  # makes b's bell, then rings it
    found, took = _result(waiting)
    assert found == {("t", 0)} and took < 0.5
    assert _bells(tmp_path) == [b._token]
    waiting = _timed_wait(a.wait_any, {("t", 0): 1}, 5)
    b.append("t", 0, ONE)
    found, took = _result(waiting)
    assert found == {("t", 0)} and took < 0.5
    assert a._notifier.watches() == (1, 1)  # p0's directory, and b's bell; never its own


def test_closing_a_log_removes_its_bells(tmp_path: Path) -> None:
    a = EmbeddedLog(str(tmp_path / "log"), background_cleaner=False)
    a.create_topic("t", 2)
    a.append("t", 0, ONE)
    a.append("t", 1, ONE)
    assert _bells(tmp_path, 0) == _bells(tmp_path, 1) == [a._token]
    a.close()
    assert _bells(tmp_path, 0) == _bells(tmp_path, 1) == []


def _append_and_die(path: str) -> None:
    log = EmbeddedLog(path, background_cleaner=False)
    log.append("t", 0, ONE)
    os._exit(0)  # no close: the bell stays, its lock goes with the process


def test_the_bell_of_a_process_that_died_is_removed_by_the_next_log_to_make_one(
    tmp_path: Path,
) -> None:
    a = EmbeddedLog(str(tmp_path / "log"), background_cleaner=False)
    a.create_topic("t", 1)
    a.append("t", 0, ONE)
    proc = mp.get_context("spawn").Process(target=_append_and_die, args=(str(tmp_path / "log"),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert len(_bells(tmp_path)) == 2  # a's, and the dead one's
    b = EmbeddedLog(str(tmp_path / "log"), background_cleaner=False)
    b.append("t", 0, ONE)  # makes its bell: the dead one goes, a's (held) stays
    assert _bells(tmp_path) == sorted([a._token, b._token])
    b.close()
    a.close()


def test_where_bells_cannot_be_made_waiters_watch_the_head(tmp_path: Path) -> None:
    """A file where the bells directory should be: no bell can be made or watched. Appends
    still wake the other log's waiters at once (through the head, as before bells)."""
    a = EmbeddedLog(str(tmp_path / "log"), background_cleaner=False)
    a.create_topic("t", 1)
    (tmp_path / "log" / "topics" / "t" / "0" / BELLS).write_bytes(b"")
    b = EmbeddedLog(str(tmp_path / "log"), background_cleaner=False)
    try:
        for i in range(3):
            waiting = _timed_wait(a.wait_any, {("t", 0): i}, 5)
            b.append("t", 0, ONE)
            found, took = _result(waiting)
            assert found == {("t", 0)} and took < 0.5, i
        assert a._notifier.watches() == (0, 0)
    finally:
        b.close()
        a.close()
