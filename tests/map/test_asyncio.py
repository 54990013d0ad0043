"""The awaitable forms of the calls that wait: opening, sync, linearizable reads, snapshots,
transactions and closing. Each must give what the blocking call gives and leave the event loop
running meanwhile, which a ticker task on the same loop measures while the log is made slow.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import kafkakv
from kafkakv.log import Log, Record
from tests.doubles import ForwardingLog
from tests.map.conftest import log_options, shared_logs

T = TypeVar("T")

SLOW = 0.3  # seconds each end-offset look-up of the slow log takes


class SlowEndLog(ForwardingLog):
    """A log whose end offsets take SLOW seconds to learn, and whose appends SLOW seconds to
    land (a far broker): a barrier waits for one or the other (the embedded log's barriers
    read the end offset, Kafka's append a barrier record)."""

    def end_offset(self, topic: str, partition: int, *, timeout: float | None = None) -> int:
        time.sleep(SLOW)
        return self.inner.end_offset(topic, partition, timeout=timeout)

    def append(
        self, topic: str, partition: int, records: Sequence[Record], *, timeout: float | None = None
    ) -> int:
        time.sleep(SLOW)
        return self.inner.append(topic, partition, records, timeout=timeout)


async def _ticking(work: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """``work()``'s result and how many 10 ms ticks another task made meanwhile."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        return await work(), ticks
    finally:
        ticker.cancel()


@shared_logs
def test_opening_syncing_reading_and_closing_leave_the_loop_running(
    target: str, map_name: str
) -> None:
    options = log_options(target)
    with kafkakv.connect(target, **options) as db:
        db.map(map_name).put_all({f"k{i}": i for i in range(2000)})
    inner = kafkakv.connect(target, **options).log
    slow: Log = SlowEndLog(inner)

    ticks: dict[str, int] = {}

    async def main() -> tuple[Any, int, bool]:
        db = await kafkakv.connect_async(slow)
        m, ticks["open"] = await _ticking(
            lambda: db.map_async(map_name, consistency="linearizable")
        )
        writer = await db.map_async(map_name)
        await writer.put_async("fresh", 1)
        got, ticks["get"] = await _ticking(lambda: m.get_async("fresh"))
        _, ticks["sync"] = await _ticking(lambda: m.sync_async())
        snap, ticks["snapshot"] = await _ticking(m.snapshot_async)
        done = await writer.transaction_async(expect={"fresh": 1}, put={"fresh": 2})
        _, ticks["open versioned"] = await _ticking(
            lambda: db.map_async(map_name + "-v", versions=True)
        )
        _, ticks["close"] = await _ticking(lambda: db.close_async())
        return got, len(snap.items), done

    try:
        got, count, done = asyncio.run(main())
    finally:
        inner.close()
    assert (got, count, done) == (1, 2001, True)
    # Each call waited for a slow end offset (or several) while the loop ticked on.
    slow_ones = {k: v for k, v in ticks.items() if k != "close"}
    assert all(n >= 10 for n in slow_ones.values()), ticks


def test_a_local_read_answers_without_a_thread(tmp_path: Path) -> None:
    with kafkakv.connect(tmp_path / "log") as db:
        m = db.map("m")
        m["k"] = 1

        async def main() -> Any:
            return await m.get_async("k"), await m.get_async("absent", 7)

        assert asyncio.run(main()) == (1, 7)
