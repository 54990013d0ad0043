"""Checking records before they are appended: the rules every backend enforces the same way.

A record that breaks one raises before anything of its batch is written:
:class:`~kafkakv.errors.InvalidRecordError` (a ``TypeError``) for a field of the wrong type or
a missing key on a compacted topic, :class:`~kafkakv.errors.RecordTooLargeError` for a record
over the topic's ``max.message.bytes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import is_not, itemgetter
from typing import cast

from kafkakv.errors import InvalidRecordError, RecordTooLargeError
from kafkakv.log.base import RECORD_OVERHEAD, Record

__all__ = ["RECORD_OVERHEAD", "CheckedRecord", "check_batch", "check_record", "plain_batch"]

CheckedRecord = tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None, int | None]
"""``(key, value, headers or None, timestamp or None)`` with every field of its exact type."""


def _as_bytes(what: str, x: object) -> bytes | None:
    if x is None or type(x) is bytes:
        return x
    if isinstance(x, bytes | bytearray | memoryview):
        return bytes(x)
    raise InvalidRecordError(f"a record {what} must be bytes or None, not {type(x).__name__}")


def check_record(
    index: int,
    record: object,
    *,
    max_message_bytes: int,
    null_keys: bool,
    overhead: int = RECORD_OVERHEAD,
) -> CheckedRecord:
    """Validate record number ``index`` of a batch; return its fields normalised. Its size is
    its key, value and headers plus ``overhead``, the log's framing of a record."""
    if not isinstance(record, Record):
        raise InvalidRecordError(f"records must be Record, not {type(record).__name__}")
    key = _as_bytes("key", record.key)
    value = _as_bytes("value", record.value)
    if key is None and not null_keys:
        raise InvalidRecordError("a compacted topic needs a key on every record")
    size = overhead + (len(key) if key else 0) + (len(value) if value else 0)
    headers: list[tuple[str, bytes]] | None = None
    if record.headers:
        headers = []
        for h in record.headers:
            if not (isinstance(h, tuple | list) and len(h) == 2 and isinstance(h[0], str)):
                raise InvalidRecordError("headers must be (str, bytes) pairs")
            hv = _as_bytes("header value", h[1]) or b""
            headers.append((h[0], hv))
            size += len(h[0]) + len(hv)
    if size > max_message_bytes:
        raise RecordTooLargeError(
            f"record {index} is {size} bytes framed, over the topic's max.message.bytes "
            f"({max_message_bytes})"
        )
    ts = record.timestamp
    if ts is not None and (type(ts) is not int or not 0 <= ts < 2**62):
        raise InvalidRecordError(f"a timestamp must be a non-negative int of ms, not {ts!r}")
    return key, value, headers, ts


def check_batch(
    records: object, *, max_message_bytes: int, null_keys: bool, overhead: int = RECORD_OVERHEAD
) -> list[CheckedRecord]:
    """Validate a whole batch (a non-empty sequence of :class:`Record`) before any is written;
    ``overhead`` as for :func:`check_record`."""
    if isinstance(records, Record) or not isinstance(records, Sequence):
        raise InvalidRecordError(f"append takes a sequence of Record, not {type(records).__name__}")
    if not records:
        raise InvalidRecordError("an append needs at least one record")
    plain = plain_batch(records, max_message_bytes - overhead)
    if plain is not None:
        keys, values = plain
        n = len(keys)
        return list(zip(keys, values, repeat(None, n), repeat(None, n), strict=True))
    return [
        check_record(
            i, r, max_message_bytes=max_message_bytes, null_keys=null_keys, overhead=overhead
        )
        for i, r in enumerate(records)
    ]


def plain_batch(
    records: Sequence[object], limit: int
) -> tuple[list[bytes], list[bytes | None]] | None:
    """The keys and values of a batch of plain records, or None when any record is not plain.

    Plain: a :class:`Record` of a bytes key, a bytes or None value, no headers and no
    timestamp, whose key and value together stay within ``limit`` bytes. That is the usual
    batch (ops, flushes, bulk loads), and :func:`check_record` would pass every record of it
    unchanged; here it is checked by passes of C-level operations over the whole batch rather
    than a Python call per record. Any other batch is for the checking loop.
    """
    if len(records) == 1:  # a sync update: the same checks, without the passes' set-up
        r = records[0]
        if (
            type(r) is Record
            and type(r[0]) is bytes
            and (r[1] is None or type(r[1]) is bytes)
            and not r[2]
            and r[3] is None
            and len(r[0]) + len(r[1] or b"") <= limit
        ):
            return [r[0]], [r[1]]
        return None
    if set(map(type, records)) != _RECORD_TYPE:
        return None
    rows = cast("Sequence[Record]", records)
    keys = list(map(_first, rows))
    values = list(map(_second, rows))
    if (
        set(map(type, keys)) != _BYTES_TYPE
        or not set(map(type, values)) <= _VALUE_TYPES
        or any(map(_third, rows))
        or any(map(is_not, map(_fourth, rows), repeat(None)))  # no hashing: any timestamp
        or max(map(len, keys)) + max(map(len, filter(None, values)), default=0) > limit
    ):
        return None
    return keys, values


_RECORD_TYPE = {Record}
_BYTES_TYPE = {bytes}
_VALUE_TYPES = {bytes, type(None)}
_first, _second, _third, _fourth = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)
