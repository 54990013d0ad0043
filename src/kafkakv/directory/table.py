"""Where a directory keeps its entries: :class:`MemoryTable` (decoded objects in a ``dict``)
and :class:`StoreTable` (bytes in any :class:`~kafkakv.store.Store`, such as the on-disk
:class:`~kafkakv.store.LmdbStore` a replicated map uses).

>>> from kafkakv.codecs import codec_for
>>> from kafkakv.store import SortedStore
>>> table = StoreTable(SortedStore(), codec_for("str"), codec_for("json"))
>>> table.apply([("b", [2], *table.encode("b", [2])), ("a", 1, *table.encode("a", 1))], {0: 2}, None)
>>> list(table.items()), table.positions()
([('a', 1), ('b', [2])], {0: 2})
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

from kafkakv.codecs import Codec
from kafkakv.directory.base import Change, Table
from kafkakv.directory.decode import fast_decoder
from kafkakv.errors import ClosedError
from kafkakv.store.base import Positions, Store

__all__ = ["MemoryTable", "StoreTable"]

_second = operator.itemgetter(1)
_NONES = itertools.repeat(None)  # "is any value None" at C speed, without calling __eq__

K = TypeVar("K")
V = TypeVar("V")


class MemoryTable(Table[K, V]):
    """Decoded keys and values in a ``dict``: ``get``, ``in`` and ``len`` are one dict
    operation with no lock and no decoding (the values returned are the stored objects:
    do not mutate them). Iteration copies a snapshot under the lock, O(n). Lost on close.
    """

    def __init__(self) -> None:
        self._data: dict[K, V] = {}
        self._positions: dict[int, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _live(self) -> None:
        if self._closed:
            raise ClosedError("the directory is closed")

    def get(self, key: K) -> V | None:
        """The value of ``key`` or ``None``: one dict lookup. Raises ClosedError."""
        if self._closed:
            self._live()
        return self._data.get(key)

    def __contains__(self, key: object) -> bool:
        if self._closed:
            self._live()
        try:
            return key in self._data
        except TypeError:  # an unhashable key is in no dict
            return False

    def __len__(self) -> int:
        if self._closed:
            self._live()
        return len(self._data)

    def keys(self) -> Iterator[K]:
        with self._lock:
            self._live()
            return iter(list(self._data))

    def items(self) -> Iterator[tuple[K, V]]:
        with self._lock:
            self._live()
            return iter(list(self._data.items()))

    def positions(self) -> dict[int, int]:
        with self._lock:
            self._live()
            return dict(self._positions)

    def apply(
        self, changes: Sequence[Change], positions: Mapping[int, int], old: list[Any] | None
    ) -> None:
        """O(len(changes)) under the lock (readers of one key never wait)."""
        with self._lock:
            self._live()
            data = self._data
            if old is None and not any(map(operator.is_, map(_second, changes), _NONES)):
                data.update(changes)
            elif old is None:
                for key, value in changes:
                    if value is None:
                        data.pop(key, None)
                    else:
                        data[key] = value
            else:
                for key, value in changes:
                    old.append(data.pop(key, None) if value is None else data.get(key))
                    if value is not None:
                        data[key] = value
            self._positions.update(positions)

    def clear(self) -> None:
        with self._lock:
            self._live()
            self._data.clear()
            self._positions.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._data = {}
            self._positions = {}


class StoreTable(Table[K, V]):
    """Entries as bytes in ``store`` (keys by ``keys.encode``, values by ``values.encode``),
    positions as the store's ``applied`` offsets, both written in one :meth:`Store.write`.
    Reads cost the store's lookup plus one decode; for :class:`~kafkakv.store.LmdbStore` a
    read transaction, O(log n). The table owns the store and closes it.
    """

    encodes = True

    def __init__(self, store: Store, keys: Codec[K], values: Codec[V]) -> None:
        self.store = store
        self.persistent = store.persistent
        self._keys = keys
        self._values = values
        self._decode_key = fast_decoder(keys)
        self._decode_value = fast_decoder(values)

    def encode(self, key: K, value: V | None) -> tuple[bytes, bytes | None]:
        return self._keys.encode(key), None if value is None else self._values.encode(value)

    def _encoded_key(self, key: object) -> bytes | None:
        try:
            return self._keys.encode(key)  # type: ignore[arg-type]
        except Exception:  # a key the codec cannot encode is in no table
            return None

    def get(self, key: K) -> V | None:
        encoded = self._encoded_key(key)
        data = None if encoded is None else self.store.get(encoded)
        return None if data is None else cast(V, self._decode_value(data))

    def __contains__(self, key: object) -> bool:
        encoded = self._encoded_key(key)
        return encoded is not None and encoded in self.store

    def __len__(self) -> int:
        return len(self.store)

    def keys(self) -> Iterator[K]:
        decode = self._decode_key
        return (decode(k) for k in self.store)

    def items(self) -> Iterator[tuple[K, V]]:
        dk, dv = self._decode_key, self._decode_value
        return ((dk(k), dv(v)) for k, v in self.store.items())

    def positions(self) -> dict[int, int]:
        return {p: pos.applied for p, pos in self.store.positions().items()}

    def apply(
        self, changes: Sequence[Change], positions: Mapping[int, int], old: list[Any] | None
    ) -> None:
        """One :meth:`Store.write` (one LMDB transaction) for the whole batch; with ``old``,
        one extra lookup and decode per change."""
        batch: dict[bytes, bytes | None] = {}
        if old is not None:
            get, decode = self.store.get, self._decode_value
            for _, _, kb, vb in changes:
                previous = batch[kb] if kb in batch else get(kb)
                old.append(None if previous is None else decode(previous))
                batch[kb] = vb
        else:
            for _, _, kb, vb in changes:
                batch[kb] = vb
        self.store.write(batch, {p: Positions(applied=o) for p, o in positions.items()})

    def clear(self) -> None:
        held = self.store.positions()
        keys = list(self.store.keys())
        for p in held or [0]:
            self.store.drop_partition(p, keys)
            keys = []

    def close(self) -> None:
        self.store.close()
