"""OpFuture keeps every promise of concurrent.futures.Future while creating its condition
variable only when something waits."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from kafkakv.map import OpFuture


def test_completed_before_anyone_looks() -> None:
    f = OpFuture()
    f.set_result(3)
    assert f.done() and f.result(timeout=0) == 3 and f.exception() is None
    g = OpFuture()
    g.set_exception(KeyError("k"))
    with pytest.raises(KeyError):
        g.result(timeout=0)
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(4)


def test_a_waiting_thread_is_woken() -> None:
    f = OpFuture()
    threading.Timer(0.05, f.set_result, args=("late",)).start()
    start = time.monotonic()
    assert f.result(timeout=5) == "late" and time.monotonic() - start < 4
    g = OpFuture()
    with pytest.raises(concurrent.futures.TimeoutError):
        g.result(timeout=0.05)


def test_callbacks_wait_and_as_completed() -> None:
    futures = [OpFuture() for _ in range(5)]
    seen: list[object] = []
    futures[0].add_done_callback(lambda f: seen.append(f.result()))
    for i, f in enumerate(futures):
        threading.Timer(0.01 * i, f.set_result, args=(i,)).start()
    done, pending = concurrent.futures.wait(futures, timeout=5)
    assert len(done) == 5 and not pending
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures)) == [0, 1, 2, 3, 4]
    assert seen == [0]


def test_resolve_ignores_a_cancelled_future_and_asyncio_awaits() -> None:
    f = OpFuture()
    assert f.cancel() and f.cancelled()
    f.resolve("ignored")  # no error: the owner gave up on it
    g = OpFuture()

    async def main() -> object:
        asyncio.get_running_loop().call_later(0.01, g.resolve, "awaited")
        return await g

    assert asyncio.run(main()) == "awaited"


def test_many_threads_race_completion_and_waiting() -> None:
    for _ in range(200):
        f = OpFuture()
        got: list[object] = []
        waiter = threading.Thread(target=lambda f=f, got=got: got.append(f.result(timeout=5)))
        waiter.start()
        f.resolve(1)
        waiter.join(5)
        assert got == [1]
