"""The update waiter: outcomes resolved by another thread reach the loop, many at once with
one wake-up; a wait past its deadline fails with TimeoutError; a done future is settled at
once."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from kafkakv.serve.waiting import SWEEP_S, UpdateWaiter


def test_outcomes_from_another_thread_reach_the_loop() -> None:
    async def main() -> list[Any]:
        waiter = UpdateWaiter(asyncio.get_running_loop(), timeout=5)
        updates: list[Future[Any]] = [Future() for _ in range(200)]
        waits = [waiter.wait(u) for u in updates]

        def resolve() -> None:
            for i, u in enumerate(updates):
                if i == 7:
                    u.set_exception(KeyError("seven"))
                else:
                    u.set_result(i)

        threading.Thread(target=resolve).start()
        return await asyncio.gather(*waits, return_exceptions=True)

    outcomes = asyncio.run(main())
    assert isinstance(outcomes[7], KeyError)
    assert [o for i, o in enumerate(outcomes) if i != 7] == [i for i in range(200) if i != 7]


def test_a_wait_fails_at_its_deadline_and_a_done_future_settles_at_once() -> None:
    async def main() -> float:
        waiter = UpdateWaiter(asyncio.get_running_loop(), timeout=0.2)
        done: Future[Any] = Future()
        done.set_result("now")
        assert await waiter.wait(done) == "now"
        never: Future[Any] = Future()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await waiter.wait(never)
        late = time.monotonic() - started
        never.set_result("late")  # resolved after the deadline: nobody is told, nothing breaks
        await asyncio.sleep(SWEEP_S * 2)
        return late

    late = asyncio.run(main())
    assert 0.2 <= late < 0.2 + 5 * SWEEP_S
