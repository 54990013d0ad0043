"""What a stretch of a partition adds up to, as two columns: :class:`Columns`.

:meth:`Log.latest_columns <kafkakv.log.base.Log.latest_columns>` gives the last value of each key
of a partition, as compaction would leave it, in the buffers of two Arrow binary arrays (keys,
values) rather than a dict of a bytes object per key: a reader that hands the rows to Arrow
(a Spark task reading a map) wraps the buffers, with no Python object per row. Nothing here
needs pyarrow; :func:`columns_of` is the plain-Python way from a dict, which every log can
take, and which the embedded log's C accumulator is held to.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate
from typing import Any, NamedTuple

__all__ = ["INT32_MAX", "Allocate", "Columns", "columns_of", "written"]

Allocate = Callable[[int], Any]
"""``allocate(size)``: a writable buffer of at least ``size`` bytes for a column to be written
into (``pyarrow.allocate_buffer``: Arrow's memory pool, whose pages a process reuses); None
where one is asked for: new ``bytes``."""

INT32_MAX = (1 << 31) - 1
"""The last offset a column with 32-bit offsets (Arrow ``binary``) can hold."""


class Columns(NamedTuple):
    """The last value per key of a stretch of records, tombstoned keys left out, in the order
    the keys first came. ``key_offsets`` and ``value_offsets`` hold ``length + 1`` offsets in
    native byte order, 32-bit (Arrow ``binary``) or, when ``wide``, 64-bit (``large_binary``):
    row ``i``'s key is ``key_data[key_offsets[i]:key_offsets[i + 1]]``. The four are ``bytes``,
    or the buffers an :data:`Allocate` gave. ``apart``: the value (None: a tombstone) of each
    key the reader asked to have set aside, which is then not in the columns."""

    length: int
    wide: bool
    key_offsets: Any
    key_data: Any
    value_offsets: Any
    value_data: Any
    apart: dict[bytes, bytes | None]

    def pairs(self) -> list[tuple[bytes, bytes]]:
        """The rows as ``(key, value)`` pairs (for tests and small reads: a bytes object per
        field).

        >>> columns_of({b"a": b"1", b"b": None, b"c": b"22"}, ()).pairs()
        [(b'a', b'1'), (b'c', b'22')]
        """
        keys, values = (_offsets(b, self.wide) for b in (self.key_offsets, self.value_offsets))
        key_data, value_data = memoryview(self.key_data), memoryview(self.value_data)
        return [
            (
                bytes(key_data[keys[i] : keys[i + 1]]),
                bytes(value_data[values[i] : values[i + 1]]),
            )
            for i in range(self.length)
        ]


def columns_of(
    latest: Mapping[bytes | None, bytes | None],
    apart: Sequence[bytes],
    allocate: Allocate | None = None,
) -> Columns:
    """The :class:`Columns` of ``latest``, each key's last value (None: a tombstone), in its
    order, written into what ``allocate`` gives (None: new bytes); a ``None`` key (a record
    without one) is not a key, and the keys in ``apart`` are set aside.

    >>> c = columns_of({b"a": b"1", None: b"x", b"\\x00f": b"7"}, (b"\\x00f",))
    >>> c.length, c.key_data, c.value_data, c.apart
    (1, b'a', b'1', {b'\\x00f': b'7'})
    """
    found = {key: latest[key] for key in apart if key in latest}
    rows = [
        (key, value)
        for key, value in latest.items()
        if key is not None and value is not None and key not in found
    ]
    keys = [key for key, _ in rows]
    values = [value for _, value in rows]
    key_sizes, value_sizes = list(map(len, keys)), list(map(len, values))
    wide = max(sum(key_sizes), sum(value_sizes), 0) > INT32_MAX
    code = "q" if wide else "i"
    buffers: list[Any] = [
        array(code, accumulate(key_sizes, initial=0)).tobytes(),
        b"".join(keys),
        array(code, accumulate(value_sizes, initial=0)).tobytes(),
        b"".join(values),
    ]
    if allocate is not None:
        buffers = [written(allocate, data) for data in buffers]
    key_offsets, key_data, value_offsets, value_data = buffers
    return Columns(len(rows), wide, key_offsets, key_data, value_offsets, value_data, found)


def _offsets(buffer: Any, wide: bool) -> memoryview:
    raw = memoryview(buffer).cast("B")
    return raw.cast("q") if wide else raw.cast("i")


def written(allocate: Allocate, data: bytes) -> Any:
    """``data`` written into a buffer ``allocate`` gives."""
    buffer = allocate(len(data))
    view = memoryview(buffer).cast("B")
    if view.readonly:
        raise BufferError(f"allocate({len(data)}) gave a read-only buffer")
    if len(view) < len(data):
        raise ValueError(f"allocate({len(data)}) gave a buffer of {len(view)} bytes")
    view[: len(data)] = data
    return buffer
