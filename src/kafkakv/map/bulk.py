"""The ops records of many puts and removes at once: a Spark write task's rows.

:func:`update_records` turns a batch of record keys and values (None: a remove) into the
records a writer appends, one :data:`~kafkakv.map.ops.OpCode.PUT` or ``REMOVE`` per row, grouped
by partition, each numbered with its partition's next sequence number. The seqs of a
partition move on by a fixed stride (see :func:`~kafkakv.map.dedup.numbering`).

Two implementations with one behaviour, as for the embedded log's frames: ``kafkakv.map._bulk``,
built from ``_bulk.c`` where kafkakv was installed with a C compiler (no Python code per row:
a 65,536-row batch in a few milliseconds), and :func:`py_update_records`, used where it is not
built or ``KAFKAKV_PURE_PYTHON=1`` is set. :data:`COMPILED` says which one this process uses;
``tests/map/test_bulk.py`` gives both the same rows and compares the bytes.

>>> from kafkakv.map.ops import decode_op
>>> out, bad = update_records([b"a", b"b"], [b"1", None], [0, 1], b"origin-1", [0, 1], 4, 100)
>>> bad, [decode_op(r.value)[:3] for p in sorted(out) for r in out[p]]
(-1, [(<OpCode.PUT: 1>, b'origin-1', 0), (<OpCode.REMOVE: 5>, b'origin-1', 1)])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kafkakv._native import compiled
from kafkakv.log.base import Record, new_tuple
from kafkakv.map.ops import OpCode, encode_fields

__all__ = ["COMPILED", "py_update_records", "update_records"]

_PUT, _REMOVE = int(OpCode.PUT), int(OpCode.REMOVE)


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


COMPILED = False
_update_records: Callable[..., tuple[dict[int, list[Record]], int]] = py_update_records
_bulk = compiled("kafkakv.map._bulk")
if not TYPE_CHECKING and _bulk is not None:
    _update_records = _bulk.update_records
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
