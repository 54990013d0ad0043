"""The accumulator of :meth:`EmbeddedLog.latest_columns
<kafkakv.log.embedded.log.EmbeddedLog.latest_columns>`: stored batch bodies in, the last value
per key out as :class:`~kafkakv.log.columns.Columns`.

``LatestColumns(seed)`` takes each batch a read takes with ``add(body, first, limit)``, which
reads the rows at offset delta ``first`` or after, at most ``limit`` of them, as
:func:`~kafkakv.log.embedded.frame.latest_into` does (same ``(taken, last, done)``, same
checks: a malformed body raises ValueError and changes nothing), and rows a read decoded
already with ``put(key, value)``. ``finish(apart)`` gives the columns, the keys ``apart`` set
aside, written into new bytes or the buffers ``allocate(size)`` gives; ``len()`` counts the
keys seen.

Two implementations with one behaviour: ``kafkakv.log.embedded._columns``, built from
``_columns.c`` (a hash table over the bodies' own bytes: no bytes object per row, 3 to 5 times
faster than the dict and ``pa.array`` a reader built before), and :class:`PyLatestColumns`
(a dict), used where the C module is not built or ``KAFKAKV_PURE_PYTHON=1`` is set.
:data:`COMPILED` says which one this process uses; ``tests/log/test_columns.py`` gives both
the same bodies.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kafkakv._native import compiled
from kafkakv.log.columns import Allocate, Columns, columns_of
from kafkakv.log.embedded.frame import py_latest_into

__all__ = ["COMPILED", "PyLatestColumns", "finished", "new_latest_columns"]


class PyLatestColumns:
    """The twin of the C accumulator: a dict of the last value per key."""

    def __init__(self, seed: int = 0) -> None:
        self._latest: dict[bytes | None, bytes | None] = {}  # (seed: the C hash's)

    def add(self, body: bytes | memoryview, first: int, limit: int) -> tuple[int, int, bool]:
        return py_latest_into(self._latest, body, first, limit)

    def put(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        if type(key) is not bytes or (value is not None and type(value) is not bytes):
            raise TypeError("put(): key must be bytes, value bytes or None")
        self._latest[key] = value

    def finish(self, apart: tuple[bytes, ...], allocate: Allocate | None = None) -> tuple[Any, ...]:
        if type(apart) is not tuple or not all(type(key) is bytes for key in apart):
            raise TypeError("finish(): apart must be a tuple of bytes")
        return tuple(columns_of(self._latest, apart, allocate))

    def __len__(self) -> int:
        return len(self._latest) - (None in self._latest)


COMPILED = False
_LatestColumns: Any = PyLatestColumns
_columns = compiled("kafkakv.log.embedded._columns")
if not TYPE_CHECKING and _columns is not None:
    _LatestColumns = _columns.LatestColumns
    COMPILED = True


def new_latest_columns() -> Any:
    """A new accumulator (this process's implementation), its hash seeded at random."""
    return _LatestColumns(secrets.randbits(64))


def finished(accumulator: Any, apart: Sequence[bytes], allocate: Allocate | None = None) -> Columns:
    """The :class:`Columns` of ``accumulator``, the keys in ``apart`` set aside, written into
    what ``allocate`` gives (None: new bytes)."""
    return Columns(*accumulator.finish(tuple(apart), allocate))
