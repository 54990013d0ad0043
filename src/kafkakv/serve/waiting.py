"""Awaiting a map's update futures on the event loop, cheaply: :class:`UpdateWaiter`.

A write's future (:class:`~kafkakv.map.futures.OpFuture`) is resolved by the thread that
applies the update. ``await future`` works (``asyncio.wrap_future``), but costs per write a
second future chained both ways, a wake-up of the loop through its self-pipe, and, with
``asyncio.timeout``, a timer: together about a sixth of a write's CPU in the server
(docs/benchmarks.md, "kafkakv serve"). Here each resolution only appends to a queue, the loop
is woken once for all the resolutions that arrive before it runs, and one sweep every
:data:`SWEEP_S` seconds fails the waits that ran out of time, oldest first: with one timeout
for every wait, the oldest is always the first to expire.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
from concurrent.futures import Future
from typing import Any

__all__ = ["SWEEP_S", "UpdateWaiter"]

SWEEP_S = 0.05
"""How often waits past their deadline are looked for (while any is pending)."""


class UpdateWaiter:
    """Turns update futures into asyncio futures of one loop, each bounded by ``timeout``
    seconds (then it fails with :class:`TimeoutError`; the update may still apply)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._loop = loop
        self._timeout = timeout
        self._resolved: collections.deque[tuple[Future[Any], asyncio.Future[Any]]] = (
            collections.deque()
        )
        self._woken = False  # a drain is scheduled on the loop
        self._pending: collections.deque[tuple[float, asyncio.Future[Any]]] = collections.deque()
        self._sweeping = False

    def wait(self, update: Future[Any]) -> asyncio.Future[Any]:
        """An asyncio future with ``update``'s outcome. On the loop's thread."""
        waited: asyncio.Future[Any] = self._loop.create_future()
        if update.done():
            _settle(update, waited)
            return waited
        self._pending.append((time.monotonic() + self._timeout, waited))
        if not self._sweeping:
            self._sweeping = True
            self._loop.call_later(SWEEP_S, self._sweep)
        update.add_done_callback(functools.partial(self._resolve, waited))
        return waited

    def _resolve(self, waited: asyncio.Future[Any], update: Future[Any]) -> None:
        """From the applying thread: queue the outcome, wake the loop unless it is woken."""
        self._resolved.append((update, waited))
        if not self._woken:
            self._woken = True
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        # Cleared before taking: an outcome queued after the last pop wakes the loop again.
        self._woken = False
        resolved = self._resolved
        while resolved:
            update, waited = resolved.popleft()
            if not waited.done():
                _settle(update, waited)

    def _sweep(self) -> None:
        pending, now = self._pending, time.monotonic()
        while pending and (pending[0][1].done() or pending[0][0] <= now):
            _, waited = pending.popleft()
            if not waited.done():
                waited.set_exception(TimeoutError())
        if pending:
            self._loop.call_later(SWEEP_S, self._sweep)
        else:
            self._sweeping = False


def _settle(update: Future[Any], waited: asyncio.Future[Any]) -> None:
    exc = update.exception()
    if exc is None:
        waited.set_result(update.result())
    else:
        waited.set_exception(exc)
