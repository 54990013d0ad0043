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

:func:`packed` is the other way to columns: a list of values (bytes or None) as the buffers of
one Arrow binary column, for a Spark task's rows. The C one sizes them, then copies them into
buffers of that size; Arrow's own converter (``pa.array``) grows its buffers as it goes, and
took 4 to 5 times as long on the values of a stream's task. Its twin is :func:`py_packed`.

>>> n, wide, offsets, data, valid, nulls = packed([b"ab", None, b"c"])
>>> n, wide, list(memoryview(offsets).cast("i")), data, bin(valid[0]), nulls
(3, False, [0, 2, 2, 3], b'abc', '0b101', 1)
"""

from __future__ import annotations

import secrets
from array import array
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from kafkakv._native import compiled
from kafkakv.log.columns import INT32_MAX, Allocate, Columns, columns_of, written
from kafkakv.log.embedded.frame import py_latest_into

__all__ = ["COMPILED", "PyLatestColumns", "finished", "new_latest_columns", "packed", "py_packed"]


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


Packed = tuple[int, bool, Any, Any, Any, int]
"""What :func:`packed` gives: ``(length, wide, offsets, data, valid, nulls)``."""


def py_packed(
    values: list[bytes | None], allocate: Allocate | None = None, narrow: int = INT32_MAX
) -> Packed:
    """The twin of the C ``packed``: ``values`` as the buffers of one Arrow binary column.
    ``offsets`` holds ``length + 1`` offsets, 64-bit when the data is over ``narrow`` bytes
    (``wide``), else 32-bit; ``valid`` is None when no value is None, else a bitmap (bit ``i
    % 8`` of byte ``i // 8`` set for a value); ``nulls`` counts the Nones. The buffers are new
    bytes, or written into what ``allocate(size)`` gives. Raises TypeError naming the first
    row that is neither bytes nor None."""
    if type(values) is not list:
        raise TypeError("packed(): values must be a list")
    for i, value in enumerate(values):
        if value is not None and type(value) is not bytes:
            raise TypeError(f"packed(): row {i} is {type(value).__name__}, not bytes or None")
    present = [value for value in values if value is not None]
    data = b"".join(present)
    wide = len(data) > narrow
    sizes = [0 if value is None else len(value) for value in values]
    offsets = array("q" if wide else "i", accumulate(sizes, initial=0)).tobytes()
    nulls = len(values) - len(present)
    valid = None
    if nulls:
        bits = [value is not None for value in values]
        valid = bytes(
            sum(1 << j for j, bit in enumerate(bits[i : i + 8]) if bit)
            for i in range(0, len(bits), 8)
        )
    buffers = [offsets, data] + ([valid] if valid is not None else [])
    if allocate is not None:
        buffers = [written(allocate, b) for b in buffers]
    return len(values), wide, buffers[0], buffers[1], buffers[2] if nulls else None, nulls


COMPILED = False
_LatestColumns: Any = PyLatestColumns
packed: Callable[..., Packed] = py_packed
"""``packed(values, allocate=None, narrow=INT32_MAX)``: this process's implementation (see
:func:`py_packed`)."""
_columns = compiled("kafkakv.log.embedded._columns")
if not TYPE_CHECKING and _columns is not None:
    _LatestColumns = _columns.LatestColumns
    packed = _columns.packed
    COMPILED = True


def new_latest_columns() -> Any:
    """A new accumulator (this process's implementation), its hash seeded at random."""
    return _LatestColumns(secrets.randbits(64))


def finished(accumulator: Any, apart: Sequence[bytes], allocate: Allocate | None = None) -> Columns:
    """The :class:`Columns` of ``accumulator``, the keys in ``apart`` set aside, written into
    what ``allocate`` gives (None: new bytes)."""
    return Columns(*accumulator.finish(tuple(apart), allocate))
