"""The ops records of many puts and removes at once: a Spark write task's rows.

:func:`update_records` turns a batch of record keys and values (None: a remove) into the
records a writer appends, one :data:`~kafkakv.map.ops.OpCode.PUT` or ``REMOVE`` per row, grouped
by partition, each numbered with its partition's next sequence number. The seqs of a
partition move on by a fixed stride (see :func:`~kafkakv.map.dedup.numbering`).

:func:`update_columns` makes the same records from the buffers of an Arrow batch's two
``large_binary`` columns (keys, values) and gives them back as columns too: a
:class:`~kafkakv.log.columns.Columns` per partition, whose keys are the record keys and whose
values are the ops records, with no Python object per row on the way. It places each row
itself, as Kafka's default partitioner does (:func:`~kafkakv.log.partitioner.partition_for`).

Two implementations with one behaviour, as for the embedded log's frames: ``kafkakv.map._bulk``,
built from ``_bulk.c`` where kafkakv was installed with a C compiler (no Python code per row:
a 65,536-row batch in a few milliseconds), and :func:`py_update_records` and
:func:`py_update_columns`, used where it is not built or ``KAFKAKV_PURE_PYTHON=1`` is set.
:data:`COMPILED` says which one this process uses; ``tests/map/test_bulk.py`` gives both the
same rows and compares the bytes.

>>> from kafkakv.map.ops import decode_op
>>> out, bad = update_records([b"a", b"b"], [b"1", None], [0, 1], b"origin-1", [0, 1], 4, 100)
>>> bad, [decode_op(r.value)[:3] for p in sorted(out) for r in out[p]]
(-1, [(<OpCode.PUT: 1>, b'origin-1', 0), (<OpCode.REMOVE: 5>, b'origin-1', 1)])

Two rows, ``b"a" -> b"1"`` and ``b"bc" -> null``, as Arrow holds them (offsets, data, a byte
per row that says whether it has a value), on one partition:

>>> from array import array
>>> offsets = array("q", [0, 1, 3])
>>> seqs = [0]
>>> out, bad = update_columns(offsets, b"abc", array("q", [0, 1, 1]), b"1", b"\\x01\\x00",
...                           b"k:", b"origin-1", seqs, 4, 100)
>>> [(key, decode_op(op)[:3]) for key, op in out[0].pairs()], bad, seqs
([(b'k:a', (<OpCode.PUT: 1>, b'origin-1', 0)), (b'k:bc', (<OpCode.REMOVE: 5>, b'origin-1', 4))], -1, [8])
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Callable
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from kafkakv._native import compiled
from kafkakv.log.base import Record, new_tuple
from kafkakv.log.columns import Columns
from kafkakv.log.partitioner import partition_for
from kafkakv.map.ops import OpCode, encode_fields

__all__ = [
    "COMPILED",
    "py_update_columns",
    "py_update_records",
    "update_columns",
    "update_records",
]

_PUT, _REMOVE = int(OpCode.PUT), int(OpCode.REMOVE)
_SEQ_MAX = (1 << 64) - 1  # a seq is a msgpack uint 64
_STRIDE_MAX = (1 << 63) - 1


def py_update_records(
    record_type: type[Record],
    keys: list[bytes],
    values: list[bytes | None],
    partitions: list[int],
    origin: bytes,
    next_seqs: list[int],
    stride: int,
    limit: int,
) -> tuple[dict[int, list[Record]], int]:
    """The records of ``keys`` and ``values`` (None: a remove) by partition (``partitions``:
    each row's), and -1; or nothing and the first row whose key and ops record together are
    over ``limit`` bytes. Row ``i`` of partition ``p`` gets seq ``next_seqs[p]``, which then
    moves on by ``stride`` (only when every row went in)."""
    if len(keys) != len(values) or len(keys) != len(partitions):
        raise ValueError("update_records(): keys, values and partitions differ in length")
    if stride <= 0:
        raise ValueError("update_records(): stride must be positive")
    seqs = list(next_seqs)
    out: dict[int, list[Record]] = {}
    for i, (key, value, p) in enumerate(zip(keys, values, partitions, strict=True)):
        if not 0 <= p < len(seqs):
            raise ValueError(f"update_records(): row {i}'s partition {p} is not one of {len(seqs)}")
        if type(key) is not bytes or (value is not None and type(value) is not bytes):
            raise TypeError(
                f"update_records(): row {i}: a key must be bytes, a value bytes or None"
            )
        seq = seqs[p]
        op = encode_fields((_REMOVE, origin, seq) if value is None else (_PUT, origin, seq, value))
        if len(key) + len(op) > limit:
            return {}, i
        seqs[p] = seq + stride
        out.setdefault(p, []).append(new_tuple(record_type, (key, op, (), None, None, None)))
    next_seqs[:] = seqs
    return out, -1


def py_update_columns(
    columns_type: type[Columns],
    key_offsets: Any,
    key_data: Any,
    value_offsets: Any,
    value_data: Any,
    value_valid: Any,
    prefix: bytes,
    origin: bytes,
    next_seqs: list[int],
    stride: int,
    limit: int,
) -> tuple[dict[int, Columns], int]:
    """The records of the rows of two Arrow ``large_binary`` columns by partition, as columns.

    ``key_offsets`` and ``value_offsets`` are buffers of ``n + 1`` native 64-bit offsets (an
    empty one: no rows) into ``key_data`` and ``value_data``; ``value_valid`` is None (every
    row has a value) or a buffer of a byte per row, 0 where the value is null: a remove. Row
    ``i``'s record key is ``prefix`` and its key; its partition the one Kafka's default
    partitioner picks for that among ``len(next_seqs)``; its value the ops record
    :func:`py_update_records` makes for it, numbered the same way. Each partition that gets
    rows gets ``columns_type(length, True, key_offsets, key_data, value_offsets, value_data,
    {})``, new bytes, its rows in the batch's order (the partitions in the order they first
    come); with -1. Or ``({}, i)``, nothing numbered, for the first row ``i`` whose record key
    and ops record together are over ``limit`` bytes.

    Costs two passes over the rows. Raises ``TypeError`` for an argument of the wrong type,
    ``BufferError`` for a buffer that is not contiguous, ``ValueError`` for offsets that are
    not whole, differ in count, start below 0, go down or end past their data, for a
    ``value_valid`` of another length, no partition or a stride below 1, and
    ``OverflowError`` for a seq that is not a 64-bit unsigned int or would pass one.
    """
    if not (isinstance(columns_type, type) and issubclass(columns_type, tuple)):
        raise TypeError("update_columns(): columns_type must be a tuple type")
    if type(prefix) is not bytes or type(origin) is not bytes:
        raise TypeError("update_columns(): prefix and origin must be bytes")
    if type(next_seqs) is not list:
        raise TypeError("update_columns(): next_seqs must be a list")
    count = len(next_seqs)
    if count < 1:
        raise ValueError("update_columns(): next_seqs must hold a seq per partition, at least one")
    stride = operator.index(stride)
    if stride > _STRIDE_MAX:
        raise OverflowError("update_columns(): stride is over 2**63 - 1")
    if stride <= 0:
        raise ValueError("update_columns(): stride must be positive")
    limit = operator.index(limit)
    seqs = list(next_seqs)
    for seq in seqs:
        if not isinstance(seq, int):
            raise TypeError(f"update_columns(): a seq must be an int, not {type(seq).__name__}")
        if not 0 <= seq <= _SEQ_MAX:
            raise OverflowError(f"update_columns(): seq {seq} is not a 64-bit unsigned int")
    key_view, keys = _buffer(key_offsets, "key_offsets"), _buffer(key_data, "key_data")
    value_view, values = _buffer(value_offsets, "value_offsets"), _buffer(value_data, "value_data")
    valid = None if value_valid is None else _buffer(value_valid, "value_valid")
    key_starts = _offsets(key_view, "key_offsets")
    value_starts = _offsets(value_view, "value_offsets")
    n = max(len(key_starts) - 1, 0)
    if max(len(value_starts) - 1, 0) != n:
        raise ValueError(
            f"update_columns(): key_offsets hold {n} rows, "
            f"value_offsets {max(len(value_starts) - 1, 0)}"
        )
    if valid is not None and len(valid) != n:
        raise ValueError(f"update_columns(): value_valid holds {len(valid)} bytes for {n} rows")
    _check_offsets(key_starts, n, len(keys), "key_offsets", "key_data")
    _check_offsets(value_starts, n, len(values), "value_offsets", "value_data")
    rows: dict[int, tuple[list[bytes], list[bytes]]] = {}
    for i in range(n):
        key = prefix + bytes(keys[key_starts[i] : key_starts[i + 1]])
        p = partition_for(key, count)
        seq = seqs[p]
        if valid is None or valid[i]:
            value = bytes(values[value_starts[i] : value_starts[i + 1]])
            op = encode_fields((_PUT, origin, seq, value))
        else:
            op = encode_fields((_REMOVE, origin, seq))
        if len(key) + len(op) > limit:
            return {}, i
        if seq + stride > _SEQ_MAX:
            raise OverflowError(
                f"update_columns(): row {i}: partition {p}'s seqs go past 2**64 - 1"
            )
        seqs[p] = seq + stride
        record_keys, ops = rows.setdefault(p, ([], []))
        record_keys.append(key)
        ops.append(op)
    out = {p: _columns(columns_type, record_keys, ops) for p, (record_keys, ops) in rows.items()}
    next_seqs[:] = seqs
    return out, -1


def _buffer(data: Any, what: str) -> memoryview:
    """The bytes of a C-contiguous buffer, as update_columns() takes them."""
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(
            f"update_columns(): {what} must be a buffer, not {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        raise BufferError(f"update_columns(): {what} is not C-contiguous")
    return view.cast("B")


def _offsets(view: memoryview, what: str) -> list[int]:
    if len(view) % 8:
        raise ValueError(
            f"update_columns(): {what} holds {len(view)} bytes, "
            "not a whole number of 64-bit offsets"
        )
    starts: list[int] = view.cast("q").tolist()
    return starts


def _check_offsets(starts: list[int], n: int, size: int, what: str, data_what: str) -> None:
    """Raises ValueError, naming the column and the row, for offsets that start below 0, go
    down or end past the data."""
    start = starts[0] if n else 0
    if start < 0:
        raise ValueError(f"update_columns(): {what}: row 0 starts at {start}, before 0")
    for i in range(n):
        end = starts[i + 1]
        if end < start:
            raise ValueError(
                f"update_columns(): {what}: row {i} ends at {end}, before it starts at {start}"
            )
        if end > size:
            raise ValueError(
                f"update_columns(): {what}: row {i} ends at {end}, past the {size} bytes of "
                f"{data_what}"
            )
        start = end


def _columns(columns_type: type[Columns], keys: list[bytes], values: list[bytes]) -> Columns:
    """The rows as columns of 64-bit offsets."""
    return columns_type(
        len(keys),
        True,
        array("q", accumulate(map(len, keys), initial=0)).tobytes(),
        b"".join(keys),
        array("q", accumulate(map(len, values), initial=0)).tobytes(),
        b"".join(values),
        {},
    )


COMPILED = False
_update_records: Callable[..., tuple[dict[int, list[Record]], int]] = py_update_records
_update_columns: Callable[..., tuple[dict[int, Columns], int]] = py_update_columns
_bulk = compiled("kafkakv.map._bulk")
if not TYPE_CHECKING and _bulk is not None:
    _update_records, _update_columns = _bulk.update_records, _bulk.update_columns
    COMPILED = True


def update_records(
    keys: list[bytes],
    values: list[bytes | None],
    partitions: list[int],
    origin: bytes,
    next_seqs: list[int],
    stride: int,
    limit: int,
) -> tuple[dict[int, list[Record]], int]:
    """See :func:`py_update_records` (records of :class:`~kafkakv.log.base.Record`)."""
    return _update_records(Record, keys, values, partitions, origin, next_seqs, stride, limit)


def update_columns(
    key_offsets: Any,
    key_data: Any,
    value_offsets: Any,
    value_data: Any,
    value_valid: Any,
    prefix: bytes,
    origin: bytes,
    next_seqs: list[int],
    stride: int,
    limit: int,
) -> tuple[dict[int, Columns], int]:
    """See :func:`py_update_columns` (columns of :class:`~kafkakv.log.columns.Columns`)."""
    return _update_columns(
        Columns,
        key_offsets,
        key_data,
        value_offsets,
        value_data,
        value_valid,
        prefix,
        origin,
        next_seqs,
        stride,
        limit,
    )
