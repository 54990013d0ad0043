"""How much Python runs between a ``put`` in one process and the listener in another.

With updates a few milliseconds apart, that code runs with cold caches, and each Python
function called on the way costs microseconds (docs/benchmarks.md, "Where a cross-process
update's time goes"): the number of calls is most of the latency. These tests count the Python
functions called on each side and fail when a change makes either path longer than its
budget. A change that must add calls there should show in ``benchmarks/profile_visibility.py``
first, and then raise the budget here.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import kafkakv
from kafkakv.log.embedded import frame

pytestmark = pytest.mark.skipif(
    not frame.COMPILED, reason="the C module is not built (or KAFKAKV_PURE_PYTHON=1)"
)

# Python functions called, counted on the build that set them, plus a little room.
WRITER_BUDGET = 16  # m.put up to the compiled append: 14 (25, 20, 17 before 2026-11-29)
READER_BUDGET = 24  # the follower, from its wake-up in poll to the listener: 21 (61, 34, 28, 25)


def _name(frame_: FrameType) -> str:
    code = frame_.f_code
    return f"{Path(code.co_filename).name}:{code.co_name}"


def test_a_put_calls_few_python_functions_before_its_append(tmp_path: Path) -> None:
    db = kafkakv.connect(str(tmp_path / "db"), background_cleaner=False)
    try:
        m = db.map("m", value_codec="bytes")
        for _ in range(20):
            m.put("k", b"warm")
        calls: list[str] = []
        appended: list[bool] = []

        def profile(frame_: FrameType, event: str, arg: Any) -> None:
            if appended:
                return
            if event == "call":
                calls.append(_name(frame_))
            elif event == "c_call" and getattr(arg, "__name__", "") == "append_plain":
                appended.append(True)

        sys.setprofile(profile)
        try:
            m.put("k", b"v")
        finally:
            sys.setprofile(None)
        assert appended, "the put did not reach the compiled append"
        assert len(calls) <= WRITER_BUDGET, calls
    finally:
        db.close()


def test_an_update_reaches_a_listener_in_another_replica_through_few_python_functions(
    tmp_path: Path,
) -> None:
    """The reading replica has a log of its own, as another process would: only the log's
    notification wakes it."""
    path = str(tmp_path / "db")
    writer_db = kafkakv.connect(path, background_cleaner=False)
    reader_db = kafkakv.connect(path, background_cleaner=False)
    woken = threading.local()  # each thread's calls since its last poll that returned
    runs: list[list[str]] = []
    seen = threading.Event()

    def profile(frame_: FrameType, event: str, arg: Any) -> None:
        if event == "c_return" and getattr(arg, "__name__", "") == "poll":
            woken.calls = []
        elif event == "call" and getattr(woken, "calls", None) is not None:
            woken.calls.append(_name(frame_))

    def listener(key: Any, old: Any, new: Any, mine: bool) -> None:
        if not mine and getattr(woken, "calls", None) is not None:
            runs.append(woken.calls[:-1])  # this function's own call last
            woken.calls = None
            seen.set()

    try:
        writer = writer_db.map("m", value_codec="bytes")
        threading.setprofile(profile)  # before the reader's follower thread starts
        try:
            reader = reader_db.map("m", value_codec="bytes")
        finally:
            threading.setprofile(None)
        reader.add_listener(listener)
        for i in range(5):
            seen.clear()
            time.sleep(0.05)  # the reader idle, waiting in poll
            writer.put("k", b"%d" % i)
            assert seen.wait(10), f"update {i} never reached the listener"
        assert len(runs) == 5
        shortest = min(runs, key=len)
        assert len(shortest) <= READER_BUDGET, shortest
    finally:
        reader_db.close()
        writer_db.close()


def test_a_replicas_own_puts_do_not_wake_its_follower(tmp_path: Path) -> None:
    """Puts slower than the follower's grace (it waits again between them): the writer applies
    each itself, and before bells every one also woke the follower, which found nothing to do
    and took a core from the processes that did need waking. Another replica's put still wakes
    it at once."""
    path = str(tmp_path / "db")
    db = kafkakv.connect(path, background_cleaner=False)
    other_db = kafkakv.connect(path, background_cleaner=False)
    try:
        m = db.map("m", value_codec="bytes")
        other = other_db.map("m", value_codec="bytes")
        m.put("k", b"first")  # the bell exists
        notifier = db.log._notifier  # type: ignore[attr-defined]
        real = notifier._poller
        woken, asleep = [0], [0]

        class Counted:
            def poll(self, *args: Any) -> Any:
                asleep[0] += 1
                try:
                    events = real.poll(*args)
                finally:
                    asleep[0] -= 1
                woken[0] += bool(events)
                return events

        def counted_sleep() -> None:
            """Until the follower sleeps in the counted poll: one already asleep in the real one
            when it was swapped in would wake uncounted (seen on a loaded machine)."""
            deadline = time.monotonic() + 10
            while not asleep[0]:
                assert time.monotonic() < deadline, "the follower never went back to sleep"
                time.sleep(0.005)

        notifier._poller = Counted()
        counted_sleep()
        for i in range(15):
            time.sleep(0.02)  # past the follower's 5 ms grace: it is asleep in poll
            m.put("k", b"%d" % i)
        assert woken[0] == 0
        changed = threading.Event()
        m.add_listener(lambda key, old, new, mine: None if mine else changed.set())
        counted_sleep()
        other.put("k", b"from elsewhere")
        assert changed.wait(5)
        # Its bell rang: the follower's poll returns that event, though under load its slice
        # may have ended first and ready() found the put before it polled again.
        deadline = time.monotonic() + 5
        while not woken[0] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert woken[0] >= 1
    finally:
        other_db.close()
        db.close()
