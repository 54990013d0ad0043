"""What readers of a map with expiry see: its store without the keys past their deadline.

The replica's state machine decides each op by the op record's timestamp (see
:mod:`kafkakv.map.ops`), so every replica decides alike; reads go by the log's clock as the
replica can tell (the machine's clock on the embedded log; on Kafka an estimate,
:mod:`kafkakv.map.logclock`, a lower bound: never ahead of the clock that decides), so that a
key reads as absent as soon as its deadline passes by it, before the ``EXPIRE`` op that
removes it is applied. :class:`LiveView` (and :class:`OrderedLiveView` over an ordered store)
wraps the store for :class:`~kafkakv.map.ReplicaMap`'s reads: every read skips expired keys;
writes are the engine's and go to the store itself. A read that looks at the store more than
once (``len``, a step over expired keys in order) holds the replica's lock meanwhile, so its
answer comes from one state: an op applied between two looks would otherwise be counted twice,
or stepped over.

>>> import threading
>>> from kafkakv.store.memory import DictStore
>>> store, deadlines = DictStore(), {}
>>> store.write({b"old": b"1", b"new": b"2", b"forever": b"3"}, {})
>>> deadlines.update({b"old": 1000, b"new": now_ms() + 60_000})
>>> view = LiveView(store, deadlines, threading.RLock(), now_ms)
>>> view.get(b"old"), view.get(b"new"), len(view), sorted(view)
(None, b'2', 2, [b'forever', b'new'])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from kafkakv.store.base import OrderedStore, Positions, Store

__all__ = ["LiveView", "OrderedLiveView", "now_ms", "view_of"]


def now_ms() -> float:
    """This process's wall clock, in milliseconds since the epoch (the unit of deadlines)."""
    return time.time() * 1000


class LiveView(Store):
    """``store`` as readers see it: keys whose deadline (in ``deadlines``, ms) has passed by
    ``now()`` (ms since the epoch: the replica's estimate of the log's clock) are absent.
    Reads cost one dict look-up more per key while any key has a deadline, and a call of
    ``now`` per key that has one, nothing more otherwise. ``lock`` is the replica's
    (reentrant): nothing is applied while it is held."""

    def __init__(
        self,
        store: Store,
        deadlines: Mapping[bytes, int],
        lock: AbstractContextManager[Any],
        now: Callable[[], float] = now_ms,
    ) -> None:
        self.store = store
        self.deadlines = deadlines
        self.lock = lock
        self.now = now
        self.persistent = store.persistent

    def _expired(self, key: bytes) -> bool:
        deadline = self.deadlines.get(key)
        return deadline is not None and deadline <= self.now()

    def get(self, key: bytes) -> bytes | None:
        if self.deadlines and self._expired(key):
            return None
        return self.store.get(key)

    def lookup(self) -> Callable[[bytes], bytes | None]:
        return self.get

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self.get(key) is not None

    def __len__(self) -> int:
        with self.lock:  # the expired keys the store still holds, and its size, of one state
            if not self.deadlines:
                return len(self.store)
            now, get = self.now(), self.store.get
            gone = sum(1 for k, d in self.deadlines.items() if d <= now and get(k) is not None)
            return len(self.store) - gone

    def keys(self) -> Iterator[bytes]:
        return (k for k in iter(self.store) if not (self.deadlines and self._expired(k)))

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return (kv for kv in self.store.items() if not (self.deadlines and self._expired(kv[0])))

    def positions(self) -> dict[int, Positions]:
        return self.store.positions()

    def write(
        self, changes: Mapping[bytes, bytes | None], positions: Mapping[int, Positions]
    ) -> None:
        self.store.write(changes, positions)

    def drop_partition(self, partition: int, keys: Iterable[bytes] | None = None) -> None:
        self.store.drop_partition(partition, keys)

    def check(self) -> list[str]:
        return self.store.check()

    def close(self) -> None:
        self.store.close()


class OrderedLiveView(LiveView, OrderedStore):
    """:class:`LiveView` of an ordered store: navigation steps over expired keys."""

    store: OrderedStore

    def _edge(
        self, lo: bytes | None, hi: bytes | None, inclusive: tuple[bool, bool], reverse: bool
    ) -> bytes | None:
        with self.lock:  # every step over an expired key in one state
            found = self.store._edge(lo, hi, inclusive, reverse)
            while found is not None and self.deadlines and self._expired(found):
                if reverse:  # on below it, within the bounds
                    found = self.store._edge(lo, found, (inclusive[0], False), True)
                else:
                    found = self.store._edge(found, hi, (False, inclusive[1]), False)
            return found

    def range(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        inclusive: tuple[bool, bool] = (True, False),
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        pairs = self.store.range(start, stop, inclusive=inclusive, reverse=reverse)
        return (kv for kv in pairs if not (self.deadlines and self._expired(kv[0])))


def view_of(
    store: Store,
    deadlines: Mapping[bytes, int],
    lock: AbstractContextManager[Any],
    now: Callable[[], float] = now_ms,
) -> Store:
    """The live view of ``store`` (ordered when it is), reading under the replica's ``lock``
    where it looks more than once, keys past their deadline by ``now()``."""
    if isinstance(store, OrderedStore):
        return OrderedLiveView(store, deadlines, lock, now)
    return LiveView(store, deadlines, lock, now)
