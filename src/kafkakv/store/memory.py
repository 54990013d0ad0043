"""Stores in memory: :class:`DictStore` (a ``dict``) and :class:`SortedStore` (a ``SortedDict``).

Both lose everything on close. ``get``, ``in`` and ``len`` go straight to the dict, with no
lock: one key is always either before or after a write. Everything that reads more than one key
(iteration, ranges, ordered lookups) and :meth:`write` share a lock, so an iteration chunk never
sees half a batch; writes never wait for a whole iteration, only for one chunk.

>>> store = SortedStore()
>>> store.write({b"b": b"2", b"a": b"1", b"c": b"3"}, {0: Positions(applied=3)})
>>> store.get(b"a"), store.floor(b"bb"), list(store.range(b"b"))
(b'1', b'b', [(b'b', b'2'), (b'c', b'3')])
>>> store.write({b"b": None}, {}); len(store), store.positions()
(2, {0: Positions(applied=3, flushed=-1)})
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import NoReturn

from sortedcontainers import SortedDict

from kafkakv.errors import ClosedError
from kafkakv.store.base import OrderedStore, Positions, Store

__all__ = ["DictStore", "SortedStore", "iter_chunks", "position_problems"]

Bound = bytes | None
Inclusive = tuple[bool, bool]
ReadChunk = Callable[[Bound, Bound, Inclusive, bool, int], list[tuple[bytes, bytes]]]
"""``read(lo, hi, inclusive, reverse, limit)``: at most ``limit`` pairs in range, in order."""

_FIRST_CHUNK, _MAX_CHUNK = 32, 1024


def iter_chunks(
    read: ReadChunk, start: Bound, stop: Bound, inclusive: Inclusive, reverse: bool
) -> Iterator[tuple[bytes, bytes]]:
    """Lazily iterate a range by calling ``read`` for chunks of growing size (32 up to 1024),
    each continuing after the last key seen: nothing is held between chunks, so the store may
    change meanwhile (a key is seen at most once; keys written behind the cursor are missed)."""
    lo, hi, inc, size = start, stop, inclusive, _FIRST_CHUNK
    while True:
        chunk = read(lo, hi, inc, reverse, size)
        yield from chunk
        if len(chunk) < size:
            return
        if reverse:
            hi, inc = chunk[-1][0], (inc[0], False)
        else:
            lo, inc = chunk[-1][0], (False, inc[1])
        size = min(size * 4, _MAX_CHUNK)


def position_problems(positions: Mapping[int, Positions]) -> list[str]:
    """The invariants every store keeps for its positions; one message per violation."""
    problems = []
    for p, pos in sorted(positions.items()):
        if p < 0:
            problems.append(f"partition {p} is negative")
        if pos.applied < 0:
            problems.append(f"partition {p}: applied offset {pos.applied} < 0")
        if pos.flushed < -1:
            problems.append(f"partition {p}: flushed offset {pos.flushed} < -1")
    return problems


class _ClosedDict(dict[bytes, bytes]):
    """Replaces a closed store's dict so the lock-free reads raise without a flag check."""

    def get(self, *args: object, **kwargs: object) -> NoReturn:
        raise ClosedError("the store is closed")

    def __getitem__(self, key: bytes) -> NoReturn:
        raise ClosedError("the store is closed")

    def __contains__(self, key: object) -> NoReturn:
        raise ClosedError("the store is closed")

    def __len__(self) -> NoReturn:
        raise ClosedError("the store is closed")


_CLOSED = _ClosedDict()


class _MemoryStore(Store):
    """What both memory stores share; ``_data`` is the live dict (or ``_CLOSED``)."""

    def __init__(self, data: dict[bytes, bytes]) -> None:
        self._data = data
        self._positions: dict[int, Positions] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _live(self) -> None:
        if self._closed:
            raise ClosedError("the store is closed")

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` or ``None``: one dict lookup, no lock."""
        return self._data.get(key)

    def lookup(self) -> Callable[[bytes], bytes | None]:
        return self._data.get

    def table(self) -> Mapping[bytes, bytes]:
        return self._data

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """One C-level pass over ``keys``, no lock (as :meth:`get`)."""
        return list(map(self._data.get, keys))

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def positions(self) -> dict[int, Positions]:
        """A copy of every partition's positions. O(partitions)."""
        with self._lock:
            self._live()
            return dict(self._positions)

    def write(
        self, changes: Mapping[bytes, bytes | None], positions: Mapping[int, Positions]
    ) -> None:
        """Apply ``changes`` and ``positions`` under the lock. O(len(changes)) for a dict,
        O(len(changes) · log n) sorted. Raises ClosedError after close()."""
        with self._lock:
            if self._closed:  # the path of every applied batch: no call while open
                self._live()
            # Bulk dict operations, not a Python loop per key (a bootstrap writes 25,000 at
            # once), and no call of a helper: this is every applied update's path. C-level
            # scans; removals are the rarer case. all() asks each value only whether it is
            # empty (a third of the cost of comparing it with None), and stops at the first.
            data = self._data
            if not all(changes.values()) and None in changes.values():
                for key in [k for k, v in changes.items() if v is None]:
                    data.pop(key, None)
                data.update({k: v for k, v in changes.items() if v is not None})
            else:
                data.update(changes)  # type: ignore[arg-type]  # no None in it (cast: a call)
            self._positions.update(positions)

    def drop_partition(self, partition: int, keys: Iterable[bytes] | None = None) -> None:
        """Forget ``partition``'s positions and delete ``keys``, as one step."""
        with self._lock:
            self._live()
            self._positions.pop(partition, None)
            for key in keys or ():
                self._data.pop(key, None)

    def check(self) -> list[str]:
        """Types of every key and value, and the positions' invariants. O(n)."""
        with self._lock:
            self._live()
            problems = position_problems(self._positions)
            bad = sum(
                1 for k, v in self._data.items() if type(k) is not bytes or type(v) is not bytes
            )
            if bad:
                problems.append(f"{bad} keys or values are not bytes")
            return problems

    def close(self) -> None:
        """Drop the data; every later call raises ClosedError. Idempotent. The data is
        cleared, not only let go: a :meth:`lookup` function kept by a caller holds the dict,
        and would keep every key alive after close."""
        with self._lock:
            self._closed = True
            if self._data is not _CLOSED:
                self._data.clear()
            self._data = _CLOSED
            self._positions = {}


class DictStore(_MemoryStore):
    """A plain ``dict``: O(1) reads and writes, no order. Iteration copies the keys (O(n))."""

    def __init__(self) -> None:
        super().__init__({})

    def keys(self) -> Iterator[bytes]:
        """Iterate a snapshot of the keys taken now (O(n) copy, between two writes)."""
        with self._lock:
            self._live()
            return iter(list(self._data))

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Iterate a snapshot of the items taken now (O(n) copy, between two writes)."""
        with self._lock:
            self._live()
            return iter(list(self._data.items()))

    def columns(self) -> tuple[list[bytes], list[bytes]]:
        """The keys and the values, both taken between the same two writes (O(n) copy of
        references, no tuple per item)."""
        with self._lock:
            self._live()
            return list(self._data), list(self._data.values())


class SortedStore(_MemoryStore, OrderedStore):
    """A ``SortedDict``: O(1) ``get``, O(log n) writes and ordered lookups; iteration is lazy,
    in chunks (see :func:`iter_chunks`), each O(log n + chunk) under the lock."""

    def __init__(self) -> None:
        self._sorted: SortedDict[bytes, bytes] = SortedDict()
        super().__init__(self._sorted)

    def _read(
        self, lo: Bound, hi: Bound, inc: Inclusive, reverse: bool, limit: int
    ) -> list[tuple[bytes, bytes]]:
        with self._lock:
            self._live()
            data = self._sorted
            return [(k, data[k]) for k in islice(data.irange(lo, hi, inc, reverse), limit)]

    def _edge(self, lo: Bound, hi: Bound, inc: Inclusive, reverse: bool) -> bytes | None:
        found = self._read(lo, hi, inc, reverse, 1)
        return found[0][0] if found else None

    def keys(self) -> Iterator[bytes]:
        """Every key in order, lazily. Raises ClosedError after close()."""
        return (k for k, _ in self.range())

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) in key order, lazily. Raises ClosedError after close()."""
        return self.range()

    def columns(self) -> tuple[list[bytes], list[bytes]]:
        """The keys in order and their values, between the same two writes (C-level passes:
        the dict's own lookup per key)."""
        with self._lock:
            self._live()
            keys = list(self._sorted)
            return keys, list(map(self._sorted.__getitem__, keys))

    def range(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        inclusive: tuple[bool, bool] = (True, False),
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs in ``[start, stop)`` (per ``inclusive``), lazily in chunks. O(log n) per chunk
        plus its size. Raises ClosedError after close() (also from a running iteration)."""
        self._live()
        return iter_chunks(self._read, start, stop, inclusive, reverse)

    def check(self) -> list[str]:
        """Also verifies the sorted index matches the dict. O(n log n)."""
        problems = super().check()
        with self._lock:
            if list(self._sorted) != sorted(dict.keys(self._sorted)):
                problems.append("the sorted key index does not match the stored keys")
        return problems
