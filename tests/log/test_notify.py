"""The embedded log's wake-ups (kafkakv.log.embedded.notify): the waiting threads share one
inotify descriptor, one of them reading it at a time, with no thread of the log's own.

Appends come through a second EmbeddedLog object, which has a notifier of its own, as another
process's would: only inotify, through that log's bell, can wake the waiters. The bells
(kafkakv.log.embedded.bell) are tested last: an append wakes the waiters of every other open
log through the appending log's bell, and its own log's waiters in the process, except those
deaf to it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkakv.errors import ClosedError
from kafkakv.log import EmbeddedLog, Record
from kafkakv.log.embedded import notify
from kafkakv.log.embedded.bell import BELLS

ONE = [Record(b"k", b"v")]


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


def test_closing_wakes_the_waiter_that_reads_events_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() waits for the waiter asleep in ``poll`` to leave; that waiter wakes close() as it
    goes, rather than close() finding out by its own periodic look, here stretched to 5 s so
    that a loaded machine's delays cannot pass for it (or hide it)."""
    monkeypatch.setattr(notify, "_CLOSE_LOOK_S", 5.0)
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
    assert max(took) < 2.5, took


def _wait_closed(log: EmbeddedLog) -> None:
    with contextlib.suppress(ClosedError):
        log.wait("t", 0, 0, timeout=30)


@pytest.mark.parametrize("appender", ["another log", "the same log"])
def test_no_waiter_misses_a_wake_up_while_the_reading_role_passes_around(
    logs: tuple[EmbeddedLog, EmbeddedLog], appender: str
) -> None:
    """Eight threads wait in turns on three partitions, with timeouts from 1 ms to 2 s that hand
    the reading role on at random moments, while another log (its bell wakes them) or their
    own (it pokes them) appends to random partitions at random intervals. An append ends, well within its 1 s re-check, the wait of every thread
    waiting for it: the one reading the descriptor and those asleep on the condition. (A
    waiter that missed its wake-up would find the record only at its next look, up to 1 s on.)
    ``KAFKAKV_SEED=<n>`` replays a run's choices."""
    waiting, writing = logs
    if appender == "the same log":
        writing = waiting
    seed = int(os.environ.get("KAFKAKV_SEED") or random.randrange(1 << 32))
    print(f"seed: {seed} (replay with KAFKAKV_SEED={seed})")
    rng = random.Random(seed)
    stop = time.monotonic() + 3
    lock = threading.Lock()
    ends = [0, 0, 0]  # each partition's end offset, as appended so far
    appended: dict[tuple[int, int], float] = {}  # (partition, offset) -> when appended
    late: list[str] = []
    woken = [0]

    def waiter(i: int) -> None:
        local = random.Random(seed + i)
        while time.monotonic() < stop:
            p = local.randrange(3)
            with lock:
                offset = ends[p]
            timeout = local.choice((0.001, 0.01, 0.05, 2.0))
            start = time.monotonic()
            if not waiting.wait("t", p, offset, timeout=timeout):
                continue
            done = time.monotonic()
            with lock:
                at = appended.get((p, offset))
                woken[0] += 1
            if at is not None and at > start and done - at > 0.4:
                late.append(f"thread {i}: {p}/{offset} woke {done - at:.3f} s after its append")

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    while time.monotonic() < stop - 0.5:
        p = rng.randrange(3)
        writing.append("t", p, [Record(b"k", b"v")])
        with lock:
            appended[(p, ends[p])] = time.monotonic()
            ends[p] += 1
        time.sleep(rng.choice((0, 0.0002, 0.002, 0.02)))
    for thread in threads:
        thread.join(10)
    assert not any(t.is_alive() for t in threads)
    assert not late, late[:5]
    assert sum(ends) > 50 and woken[0] > 50, (ends, woken)


def test_closing_the_log_ends_every_wait_any_with_closed_error(tmp_path: Path) -> None:
    """Waiters of ``wait_any`` asleep when the log closes raise ClosedError: none of them looks
    at a head file that close() is releasing meanwhile (an OSError or ValueError then)."""
    positions = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    for i in range(20):  # a close race: about one close in twenty lost it before the fix
        log = EmbeddedLog(str(tmp_path / f"log{i}"), background_cleaner=False)
        log.create_topic("t", 3)
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=_wait_any_into, args=(log, positions, errors))
            for _ in range(24)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.1)
        log.close()
        for thread in threads:
            thread.join(5)
        assert not any(t.is_alive() for t in threads)
        others = [e for e in errors if type(e) is not ClosedError]
        assert len(errors) == 24 and not others, (len(errors), others[:3])


def _wait_any_into(
    log: EmbeddedLog, positions: dict[tuple[str, int], int], errors: list[BaseException]
) -> None:
    try:
        log.wait_any(positions, 30)
    except Exception as exc:
        errors.append(exc)


# -- bells: no process is woken by the kernel for its own appends ---------------------------
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
    """Start ``wait(positions, timeout)`` in a thread; the list gets (result, seconds taken,
    when it ended)."""
    out: list[Any] = []

    def run() -> None:
        start = time.monotonic()
        out.append(wait(positions, timeout))
        ended = time.monotonic()
        out.extend((ended - start, ended))

    thread = threading.Thread(target=run)
    thread.start()
    out.append(thread)
    time.sleep(0.1)  # asleep in poll by now
    return out


def _result(waiting: list[Any], since: float | None = None) -> tuple[Any, float]:
    """The wait's result and the seconds it took; with ``since`` (a :func:`time.monotonic`
    value: when the append that should wake it returned), the seconds from then to its end
    instead: the wake's own latency, without the test's sleep and append, which under load
    took most of half a second (a wake within 0.5 s of the wait's start failed at 0.506)."""
    waiting[0].join(10)
    assert not waiting[0].is_alive()
    return waiting[1], waiting[2] if since is None else waiting[3] - since


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
        found, took = _result(waiting, since=time.monotonic())
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
    found, took = _result(waiting, since=time.monotonic())
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
    found, took = _result(waiting, since=time.monotonic())
    assert found == {("t", 0)} and took < 0.5
    assert _bells(tmp_path) == [b._token]
    waiting = _timed_wait(a.wait_any, {("t", 0): 1}, 5)
    b.append("t", 0, ONE)
    found, took = _result(waiting, since=time.monotonic())
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
            found, took = _result(waiting, since=time.monotonic())
            assert found == {("t", 0)} and took < 0.5, i
        assert a._notifier.watches() == (0, 0)
    finally:
        b.close()
        a.close()
