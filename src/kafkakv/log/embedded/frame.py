"""The embedded log's batch encoding: a batch's records, its framing, the head record, and
the one decoding a bootstrap spends its time in.

Pure functions over bytes, on the path of every append:

- :func:`plain_body`: the msgpack body of a batch of plain records (see
  :func:`kafkakv.log.records.plain_batch`), or None when any record is not plain, and
  :func:`plain_body_columns`, the same body of rows given as two binary columns (a Spark
  write task's, with no record object per row: see :meth:`EmbeddedLog.send_columns
  <kafkakv.log.embedded.log.EmbeddedLog.send_columns>`);
- :func:`frame`: a whole batch, its 56-byte header (with the CRC) and the body, and
  :func:`frame_header`, the header alone, for a write of header and body side by side
  (``pwritev``) with no copy of the body;
- :func:`pack_head`: the 80-byte head record of a :class:`~kafkakv.log.embedded.head.HeadState`.

and one on the path of :meth:`~kafkakv.log.base.Log.read_latest` (a replica loading its data
topic): :func:`latest_into`, a batch body's rows put straight into a dict of the last value per
key, with no tuple or int made per row.

The compiled module also has :data:`append_plain`, the steady-state append of
:meth:`Partition.append <kafkakv.log.embedded.partition.Partition.append>` in one call, its
system calls made without the GIL, and :data:`read_plain`, the common case of a sequential
read (a follower's, a replay's): whole batches as an append leaves them, checked and decoded
into records in one call, and :data:`first_records`, the first few records of a large batch
with the rows after them left undecoded (a map's open reads the first record of its data topic,
whose first batch may be a whole flush). None of these has a twin: where one is None (not built, or pure Python)
the partition's own Python path does the same; it also takes over wherever the compiled one
declines (``_frame.c`` says when), and says what is wrong with a batch that is. The last,
:data:`read_head`, one look at a head file's mapping (every wait's check and every read
begins with one), has its twin in ``head.py``.

The formats are in ``format.py`` and ``head.py``. Two implementations with one behaviour, as for
the map's reads (:mod:`kafkakv.map.reads`): ``kafkakv.log.embedded._frame``, built from
``_frame.c`` where kafkakv was installed with a C compiler and zlib, and the ``py_`` functions
below, used when it is not built or ``KAFKAKV_PURE_PYTHON=1`` is set. :data:`COMPILED` says
which one this process uses; ``tests/log/test_frame.py`` gives both the same inputs and
compares the bytes and errors.
"""

from __future__ import annotations

import operator
import struct
import sys
import zlib
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

import msgspec

from kafkakv._native import compiled
from kafkakv.log.base import Record
from kafkakv.log.records import plain_batch

__all__ = [
    "BATCH_HEADER",
    "BATCH_MAGIC",
    "BATCH_MAGIC_V1",
    "COMPILED",
    "CRC_START",
    "HEAD_MAGIC",
    "append_plain",
    "bind_head",
    "first_records",
    "frame",
    "frame_header",
    "latest_into",
    "pack_head",
    "pack_rows",
    "plain_body",
    "plain_body_columns",
    "py_frame",
    "py_frame_header",
    "py_latest_into",
    "py_pack_head",
    "py_plain_body",
    "py_plain_body_columns",
    "read_head",
    "read_plain",
    "unpack_rows",
]

BATCH_HEADER = struct.Struct("<QIIBBHIIqqqI")  # the layout is in format.py
BATCH_MAGIC = 2  # the format's version, in every batch header (the C module writes it too)
BATCH_MAGIC_V1 = 1  # batches written before the CRC covered the base offset: still read
CRC_START = 16  # the batch CRC covers the base offset (bytes 0..8), then the bytes from here on
HEAD_MAGIC = b"KKVH"  # the layout is in head.py
_HEAD_PREFIX = struct.Struct("<4sI")  # magic, CRC
_HEAD_BODY = struct.Struct("<QQQQQQQ16s")

pack_rows = (
    msgspec.msgpack.Encoder().encode
)  # msgpack as a Packer writes it, in a third of the time

# A batch body's rows (format.py's Row), each row's shape and types checked as it decodes.
unpack_rows: Callable[[bytes | memoryview], list[Any]] = msgspec.msgpack.Decoder(
    list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...] | None]]
).decode


def py_plain_body(records: Sequence[Record], limit: int) -> bytes | None:
    """The body ``[[i, 0, key, value, None], ...]`` of plain ``records`` (slots 0..n-1, one
    timestamp for the batch), or None when any is not plain or they do not fit ``limit``."""
    plain = plain_batch(records, limit)
    if plain is None:
        return None
    keys, values = plain
    n = len(keys)
    if n == 1:  # a sync update
        return pack_rows([(0, 0, keys[0], values[0], None)])
    return pack_rows(list(zip(range(n), repeat(0, n), keys, values, repeat(None, n), strict=True)))


def py_plain_body_columns(
    length: int,
    wide: bool,
    key_offsets: Any,
    key_data: Any,
    value_offsets: Any,
    value_data: Any,
    limit: int,
) -> bytes | None:
    """The body :func:`py_plain_body` makes of the records ``(key, value)`` of ``length`` rows
    of two binary columns (offsets 32-bit, or 64-bit when ``wide``: see
    :class:`~kafkakv.log.columns.Columns`); None for no rows, or when the largest key plus
    the largest value is over ``limit``. Raises ValueError for offsets that do not bound
    rows of their data.

    >>> py_plain_body_columns(1, False, b"\\0\\0\\0\\0\\1\\0\\0\\0", b"k", b"\\0" * 4 + b"\\2\\0\\0\\0", b"v1", 9)
    b'\\x91\\x95\\x00\\x00\\xc4\\x01k\\xc4\\x02v1\\xc0'
    """
    length = operator.index(length)
    if length > sys.maxsize:
        raise OverflowError(f"plain_body_columns(): {length} rows")
    if length < 0 or length > (sys.maxsize - 9) // 8:
        raise ValueError(f"plain_body_columns(): {length} rows")
    bounds = [
        _bounds(offsets, data, wide, length, what)
        for offsets, data, what in (
            (key_offsets, key_data, "key"),
            (value_offsets, value_data, "value"),
        )
    ]
    if length == 0:
        return None
    (keys, key_bytes), (values, value_bytes) = bounds
    key_sizes = [keys[i + 1] - keys[i] for i in range(length)]
    value_sizes = [values[i + 1] - values[i] for i in range(length)]
    if max(key_sizes) + max(value_sizes) > limit:
        return None
    return pack_rows(
        [
            (
                i,
                0,
                bytes(key_bytes[keys[i] : keys[i + 1]]),
                bytes(value_bytes[values[i] : values[i + 1]]),
                None,
            )
            for i in range(length)
        ]
    )


def _bounds(
    offsets: Any, data: Any, wide: bool, length: int, what: str
) -> tuple[list[int], memoryview]:
    """``offsets`` as ints and ``data`` as bytes, once checked as the C function checks them."""
    raw, data = memoryview(offsets).cast("B"), memoryview(data).cast("B")
    width = 8 if wide else 4
    if len(raw) != (length + 1) * width:
        raise ValueError(
            f"plain_body_columns(): {what} offsets hold {len(raw)} bytes, not the "
            f"{(length + 1) * width} of {length} rows"
        )
    found = raw.cast("q" if wide else "i").tolist()
    if found[0] < 0:
        raise ValueError(f"plain_body_columns(): {what} offsets start below 0")
    for i in range(1, length + 1):
        if found[i] < found[i - 1] or found[i] > len(data):
            raise ValueError(
                f"plain_body_columns(): {what} {i - 1} ends at {found[i]}, outside "
                f"{found[i - 1]}..{len(data)}"
            )
    return found, data


def py_frame(*fields: Any) -> bytes:
    """``body`` framed as a complete batch: header, CRC, body. The arguments are
    :func:`py_frame_header`'s; a field out of its range raises ``struct.error``."""
    body = fields[1] if len(fields) > 1 else b""
    if not isinstance(body, bytes):
        raise TypeError(f"frame(): body must be bytes, not {type(body).__name__}")
    return py_frame_header(*fields) + body


def py_frame_header(
    base_offset: int,
    body: bytes,
    record_count: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int,
    delete_horizon_ms: int,
    producer: int,
) -> bytes:
    """The header :func:`py_frame` puts before ``body`` (its CRC covers the body), from the
    fields of format.py's batch header in this order."""
    if not isinstance(body, bytes):
        raise TypeError(f"frame_header(): body must be bytes, not {type(body).__name__}")
    header = bytearray(
        BATCH_HEADER.pack(
            base_offset,
            BATCH_HEADER.size + len(body),
            0,
            BATCH_MAGIC,
            attributes,
            0,
            record_count,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            delete_horizon_ms,
            producer,
        )
    )
    crc = zlib.crc32(body, zlib.crc32(header[CRC_START:], zlib.crc32(header[:8])))
    struct.pack_into("<I", header, 12, crc)
    return bytes(header)


def py_pack_head(state: tuple[int, int, int, int, int, int, int, bytes]) -> bytes:
    """The head record of ``state``'s eight fields (see head.py's layout)."""
    if not isinstance(state, tuple) or len(state) != 8:
        raise struct.error("pack_head() takes a head state of 8 fields")
    body = _HEAD_BODY.pack(*state)
    return _HEAD_PREFIX.pack(HEAD_MAGIC, zlib.crc32(body)) + body


def py_latest_into(
    target: dict[bytes | None, bytes | None], body: bytes | memoryview, first: int, limit: int
) -> tuple[int, int, bool]:
    """Put the key and value of each row of the batch ``body`` whose offset delta is ``first``
    or more, at most ``limit`` of them, into ``target`` in order (so each key ends with its
    last value). Returns ``(taken, last, done)``: how many were put, the offset delta of the
    last (-1 when none), and False when a row after it was left for ``limit``. A malformed
    body raises ValueError (``msgspec.DecodeError`` is one) and puts nothing."""
    if type(target) is not dict:
        raise TypeError("latest_into(): target must be a dict")
    rows = unpack_rows(body)
    taken, last = 0, -1
    for delta, _, key, value, _ in rows:
        if delta < first:
            continue
        if taken == limit:
            return taken, last, False
        target[key] = value
        taken, last = taken + 1, delta
    return taken, last, True


def _bind_nothing(state_type: type) -> None:
    """Without the C module there is nothing to bind."""


COMPILED = False
plain_body, frame, frame_header, pack_head = py_plain_body, py_frame, py_frame_header, py_pack_head
plain_body_columns = py_plain_body_columns
latest_into = py_latest_into
#: The compiled steady-state append (see the module docstring), or None.
append_plain: Callable[..., Any] | None = None
#: The compiled common case of a sequential read (see the module docstring), or None.
read_plain: Callable[..., Any] | None = None
#: The compiled look at a head file's mapping (head.py's ``py_read_head``), or None.
read_head: Callable[..., Any] | None = None
#: The compiled take of a batch's first records, the rest undecoded (see the module
#: docstring), or None.
first_records: Callable[..., Any] | None = None
#: Gives the C module the HeadState class that :data:`append_plain` returns (head.py calls it).
bind_head: Callable[[type], None] = _bind_nothing
_frame = compiled("kafkakv.log.embedded._frame")  # also needs zlib's header to build
if not TYPE_CHECKING and _frame is not None:
    _frame.bind(Record)
    plain_body, frame, pack_head = _frame.plain_body, _frame.frame, _frame.pack_head
    plain_body_columns = _frame.plain_body_columns
    frame_header = _frame.frame_header
    latest_into = _frame.latest_into
    append_plain, bind_head = _frame.append_plain, _frame.bind_head
    read_plain, read_head = _frame.read_plain, _frame.read_head
    first_records = _frame.first_records
    COMPILED = True
