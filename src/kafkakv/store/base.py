"""Where a replica keeps its state: the :class:`Store` interface.

A store maps encoded keys to encoded values (both ``bytes``) and remembers, per log partition,
the next ops offset it has to apply and the ops offset covered by the last flush it saw. The
map layer decides; the store only keeps. Every change arrives through :meth:`Store.write`, which
applies a batch of changes *and* the new positions as one atomic step: a store that survives a
restart (:class:`~kafkakv.store.lmdb.LmdbStore`) never holds data without the offset that
produced it, so a restarted replica replays exactly what it has not applied.

Threads: one writer at a time (the map's applier holds a lock around :meth:`write`); reads may
run concurrently with a write from other threads and see the state before or after it, never a
torn batch. Iteration works on a snapshot or raises nothing when the store changes meanwhile.

Ordered stores (:class:`OrderedStore`) order keys by their bytes (unsigned, lexicographic), which is
the natural order of the str, bytes and int key codecs.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from kafkakv.lifecycle import Closeable

__all__ = ["OrderedStore", "Positions", "Store"]


class Positions(NamedTuple):
    """Per-partition progress of a store: ``applied`` is the next ops offset to apply (0 when
    nothing was applied), ``flushed`` the last ops offset covered by a flush (-1: none).

    A value: stores keep the very object they are given and hand it out again, with no copy
    (every applied batch writes one)."""

    applied: int = 0
    flushed: int = -1


class Store(Closeable):
    """Key → value bytes plus per-partition positions. See the module docstring."""

    #: True when the state survives close() and a reopen with the same settings.
    persistent: bool = False

    # -- reads ------------------------------------------------------------------------
    @abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, or ``None``. O(1) for dict, O(log n) for sorted stores."""

    def lookup(self) -> Callable[[bytes], bytes | None]:
        """A function that does what :meth:`get` does, for a hot path to keep: a memory store
        gives its dict's own ``get``. Valid until :meth:`close`, which the caller must know
        of: after it the function may go on answering from the old state."""
        return self.get

    def table(self) -> Mapping[bytes, bytes] | None:
        """The store's own dict of keys to values, for a hot path to read with ``[]`` and
        ``in``, no function call per read (a memory store's dict), or None when the store
        keeps none. Read only; valid until :meth:`close`, which the caller must know of:
        after it the dict raises ClosedError or is empty."""
        return None

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The value (or ``None``) of each of ``keys``, in order: what a batch of updates reads."""
        get = self.get
        return [get(key) for key in keys]

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abstractmethod
    def __len__(self) -> int:
        """Number of keys, O(1)."""

    @abstractmethod
    def keys(self) -> Iterator[bytes]:
        """Every key (sorted stores: in order). Safe while the store changes."""

    def __iter__(self) -> Iterator[bytes]:
        return self.keys()

    @abstractmethod
    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) pair (sorted stores: in key order). Safe while the store changes."""

    def columns(self) -> tuple[list[bytes], list[bytes]]:
        """Every key and its value as two lists in the same order (sorted stores: key
        order), a snapshot taken now: what a bulk export copies into columns. Memory stores
        take both lists in two C-level passes; others split :meth:`items`."""
        items = list(self.items())
        return [k for k, _ in items], [v for _, v in items]

    @abstractmethod
    def positions(self) -> dict[int, Positions]:
        """A copy of the positions of every partition written so far."""

    # -- the one write path -----------------------------------------------------------
    @abstractmethod
    def write(
        self,
        changes: Mapping[bytes, bytes | None],
        positions: Mapping[int, Positions],
    ) -> None:
        """Atomically set or delete (``None``) keys and record new ``positions``.

        Either all of it is visible (and, for a persistent store, durable on a clean close) or,
        after a crash, none of it. Positions of partitions not named are left as they are.
        Raises :class:`~kafkakv.errors.ClosedError` after :meth:`close`.
        """

    @abstractmethod
    def drop_partition(self, partition: int, keys: Iterable[bytes] | None = None) -> None:
        """Forget a partition's positions and delete ``keys`` (all keys the caller says
        belong to it); used before a full reload of that partition."""

    # -- lifecycle --------------------------------------------------------------------
    @abstractmethod
    def check(self) -> list[str]:
        """Verify internal invariants; return a description of each problem (empty: sound)."""

    @abstractmethod
    def close(self) -> None:
        """Release resources. Idempotent."""


class OrderedStore(Store):
    """A store whose keys are kept in byte order, with range queries."""

    @abstractmethod
    def _edge(
        self, lo: bytes | None, hi: bytes | None, inclusive: tuple[bool, bool], reverse: bool
    ) -> bytes | None:
        """The smallest key within the bounds (the largest with ``reverse``), or ``None``.
        O(log n). Every navigation method below is this with other bounds."""

    def first(self) -> bytes | None:
        """The smallest key, or ``None`` when empty. O(log n)."""
        return self._edge(None, None, (True, True), False)

    def last(self) -> bytes | None:
        """The largest key, or ``None`` when empty. O(log n)."""
        return self._edge(None, None, (True, True), True)

    def floor(self, key: bytes) -> bytes | None:
        """The largest key ``<= key``, or ``None``."""
        return self._edge(None, key, (True, True), True)

    def ceiling(self, key: bytes) -> bytes | None:
        """The smallest key ``>= key``, or ``None``."""
        return self._edge(key, None, (True, True), False)

    def lower(self, key: bytes) -> bytes | None:
        """The largest key ``< key``, or ``None``."""
        return self._edge(None, key, (True, False), True)

    def higher(self, key: bytes) -> bytes | None:
        """The smallest key ``> key``, or ``None``."""
        return self._edge(key, None, (False, True), False)

    @abstractmethod
    def range(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        inclusive: tuple[bool, bool] = (True, False),
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs with ``start <= key < stop`` (bounds per ``inclusive``; ``None``
        is unbounded), in key order or reversed. Lazy; safe while the store changes."""
