"""What a directory is made of, without threads or I/O: its records, errors, states and the
:class:`Table` interface that holds its entries.

A directory turns each record of a topic into one change of a read-only mapping: ``key ->
value`` sets the key, ``key -> None`` deletes it. The table keeps the entries and, per
partition, the next offset to read; :meth:`Table.apply` writes a batch of changes and the new
positions together, so a persistent table never holds data without the offsets that produced
it.
"""

from __future__ import annotations

import enum
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from kafkakv.lifecycle import Closeable

__all__ = [
    "Change",
    "DirectoryRecord",
    "DirectoryState",
    "Listener",
    "RecordError",
    "Table",
    "Transform",
]

K = TypeVar("K")
V = TypeVar("V")


class DirectoryRecord(NamedTuple):
    """One record as a transform sees it: key and value decoded by the directory's codecs
    (``key`` is ``None`` for a record without one), where it was read, and what came with it.

    >>> DirectoryRecord("t-1", {"acquirerId": "a-7"}, 0, 12).value["acquirerId"]
    'a-7'
    """

    key: Any
    value: Any
    partition: int
    offset: int
    headers: Sequence[tuple[str, bytes]] = ()
    timestamp: int | None = None


Transform = Callable[[DirectoryRecord], "tuple[Any, Any] | None"]
"""``transform(record) -> (key, value) | None``: the entry a record stands for. A ``None``
value deletes that key; returning ``None`` deletes the record's own key."""

Listener = Callable[[Any, Any, Any], None]
"""``listener(key, old, new)``: called after each change, in log order; ``old`` or ``new`` is
``None`` when the key was absent before or is deleted now."""

Change = tuple[Any, ...]
"""``(key, value)``: set ``key``, or delete it when ``value`` is ``None``; tables that keep
bytes (:attr:`Table.encodes`) get ``(key, value, key_bytes, value_bytes)``."""


@dataclass(frozen=True, slots=True)
class RecordError:
    """A record the directory skipped: its key or value did not decode, or the transform
    raised or returned something that is not an entry. The same record fails the same way in
    every replica; the directory goes on with the next one.

    ``key`` is the record's raw key bytes (``None`` when it had none); ``error`` names the
    exception and its message; ``traceback`` is the formatted traceback.
    """

    partition: int
    offset: int
    key: bytes | None
    error: str
    traceback: str

    def __str__(self) -> str:
        return f"partition {self.partition} offset {self.offset} key {self.key!r}: {self.error}"


class DirectoryState(enum.Enum):
    """Where a :class:`~kafkakv.directory.Directory` is in its life.

    NEW (not started) → LOADING (reading up to the end offsets captured at start) → READY
    (loaded; following) → CLOSED. FAILED: the log failed for good (not a transient outage);
    the entries stay readable as they were.
    """

    NEW = "new"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


class Table(Closeable, Generic[K, V]):
    """Where a directory keeps its entries and per-partition positions.

    One writer (the directory's thread) calls :meth:`apply`; any thread may read meanwhile and
    sees each batch entirely or not at all. Every method raises
    :class:`~kafkakv.errors.ClosedError` after :meth:`close`.
    """

    #: True when entries and positions survive close() and a reopen.
    persistent: bool = False
    #: True when the table keeps bytes: each change then comes with its key and value
    #: encoded by :meth:`encode` (an entry that cannot be encoded is a record error).
    encodes: bool = False

    def encode(self, key: K, value: V | None) -> tuple[bytes, bytes | None]:
        """The bytes a table that :attr:`encodes` keeps for an entry. Raises
        :class:`~kafkakv.errors.EncodeError`."""
        raise NotImplementedError

    @abstractmethod
    def get(self, key: K) -> V | None:
        """The value of ``key``, or ``None``."""

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abstractmethod
    def __len__(self) -> int:
        """Number of entries."""

    @abstractmethod
    def keys(self) -> Iterator[K]:
        """Every key; safe while the table changes."""

    @abstractmethod
    def items(self) -> Iterator[tuple[K, V]]:
        """Every ``(key, value)``; safe while the table changes."""

    @abstractmethod
    def positions(self) -> dict[int, int]:
        """Per partition, the next offset to read (only partitions written so far)."""

    @abstractmethod
    def apply(
        self, changes: Sequence[Change], positions: Mapping[int, int], old: list[Any] | None
    ) -> None:
        """Apply ``changes`` in order and record ``positions``, atomically.

        When ``old`` is a list, append each change's previous value to it (for listeners).
        """

    @abstractmethod
    def clear(self) -> None:
        """Delete every entry and position (before a full reload)."""
