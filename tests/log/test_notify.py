"""The embedded log's wake-ups (kafkakv.log.embedded.notify): the waiting threads share one
inotify descriptor, one of them reading it at a time, with no thread of the log's own.

Appends come through a second EmbeddedLog object, which has a notifier of its own, as another
process's would: only inotify can wake the waiters.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafkakv.errors import ClosedError
from kafkakv.log import EmbeddedLog, Record


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[tuple[EmbeddedLog, EmbeddedLog]]:
    waiting = EmbeddedLog(str(tmp_path / "log"), background_cleaner=False)
    waiting.create_topic("t", 3)
    writing = EmbeddedLog(str(tmp_path / "log"), background_cleaner=False)
    yield waiting, writing
    writing.close()
    waiting.close()


def test_every_waiting_thread_wakes_on_an_append_by_another_log(
    logs: tuple[EmbeddedLog, EmbeddedLog],
) -> None:
    """Six threads wait, two per partition; the reading role passes from thread to thread as
    each leaves. Every one wakes well before its timeout, and the log runs no thread of its
    own for it."""
    waiting, writing = logs
    woke: dict[int, float] = {}
    started = threading.Barrier(7)

    def wait(i: int) -> None:
        started.wait()
        if waiting.wait("t", i % 3, 0, timeout=20):
            woke[i] = time.monotonic()

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    started.wait()
    time.sleep(0.2)  # all of them asleep
    assert not [t for t in threading.enumerate() if t.name == "kafkakv-notify"]
    for p in range(3):
        sent = time.monotonic()
        writing.append("t", p, [Record(b"k", b"v")])
        for thread in threads[p::3]:
            thread.join(5)
        assert {p, p + 3} <= woke.keys(), f"partition {p}: {sorted(woke)} woke"
        assert max(woke[p], woke[p + 3]) - sent < 2


def test_a_wait_wakes_soon_after_a_quiet_spell(logs: tuple[EmbeddedLog, EmbeddedLog]) -> None:
    """The first event after a quiet spell is not held back to gather others."""
    waiting, writing = logs
    delays = []
    for i in range(20):
        time.sleep(0.01)
        result: list[bool] = []
        thread = threading.Thread(target=_wait_into, args=(waiting, i, result))
        thread.start()
        time.sleep(0.005)
        sent = time.monotonic()
        writing.append("t", 0, [Record(b"k", b"v")])
        thread.join(10)
        assert result, "the wait timed out"
        delays.append(time.monotonic() - sent)
    assert sorted(delays)[len(delays) // 2] < 0.05, delays


def _wait_into(log: EmbeddedLog, offset: int, result: list[bool]) -> None:
    if log.wait("t", 0, offset, timeout=10):
        result.append(True)


def test_closing_the_log_ends_every_wait(logs: tuple[EmbeddedLog, EmbeddedLog]) -> None:
    waiting, _ = logs
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            waiting.wait("t", 0, 0, timeout=30)
        except ClosedError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    start = time.monotonic()
    waiting.close()
    for thread in threads:
        thread.join(5)
    assert not any(t.is_alive() for t in threads)
    assert time.monotonic() - start < 3
    assert len(errors) == 3


def test_closing_wakes_the_waiter_that_reads_events_at_once(tmp_path: Path) -> None:
    """close() waits for the waiter asleep in ``poll`` to leave; that waiter wakes close() as it
    goes, rather than close() finding out by its own periodic look (0.1 s)."""
    took = []
    for i in range(5):
        log = EmbeddedLog(str(tmp_path / f"log{i}"), background_cleaner=False)
        log.create_topic("t", 1)
        thread = threading.Thread(target=_wait_closed, args=(log,))
        thread.start()
        time.sleep(0.1)  # the one waiter is reading the descriptor, asleep in poll
        start = time.monotonic()
        log.close()
        took.append(time.monotonic() - start)
        thread.join(5)
        assert not thread.is_alive()
    assert sorted(took)[2] < 0.05, took


def _wait_closed(log: EmbeddedLog) -> None:
    with contextlib.suppress(ClosedError):
        log.wait("t", 0, 0, timeout=30)
