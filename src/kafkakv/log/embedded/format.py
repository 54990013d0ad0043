"""The embedded log's on-disk formats: record batches, index entries, the head record.

Pure functions over bytes; no files. All integers are little-endian.

Record batch (a 56-byte header, then the records)::

    0   u64  base_offset        offset of the batch's first record slot
    8   u32  size               whole batch in bytes, header included
    12  u32  crc                zlib CRC-32 of bytes 0..8, then of bytes 16..size
    16  u8   magic              2 (1: a batch whose CRC covers bytes 16..size only)
    17  u8   attributes         bit 0: written by a transactional writer
    18  u16  reserved
    20  u32  record_count
    24  u32  last_offset_delta  the batch spans base_offset .. base_offset + last_offset_delta
    28  i64  base_timestamp
    36  i64  max_timestamp
    44  i64  delete_horizon_ms  set by the cleaner when it first keeps a tombstone; -1 otherwise
    52  u32  producer           transactional writers: hash of the transactional id; else 0
    56  ...  records            msgpack array of [offset_delta, timestamp_delta, key, value, headers]

``base_offset`` and ``size`` lead so that a scan can skip a batch without decoding it. The CRC
covers the base offset and everything after itself, so a torn or bit-flipped batch is
detected, a flipped offset included; ``size`` is checked by framing. Batches of magic 1,
which kafkakv wrote until 27 November 2026, have a CRC that leaves the base offset out;
they are still read, their offsets checked only against the batches around them (see
partition.py), which a flip that stays inside a gap left by compaction passes. After
compaction a batch keeps its base offset and offset span but may hold fewer records.

Offset index entry: ``u32 relative_offset, u32 position`` (8 bytes), sparse, ascending.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import NamedTuple, cast

from isal.isal_zlib import crc32  # zlib's CRC-32, with carry-less multiplies: ~5x as fast

from kafkakv.errors import CorruptLogError, InvalidRecordError
from kafkakv.log.base import Record, new_tuple
from kafkakv.log.embedded.frame import (
    BATCH_HEADER,
    BATCH_MAGIC,
    BATCH_MAGIC_V1,
    CRC_START,
    frame,
    latest_into,
    pack_rows,
    plain_body,
    unpack_rows,
)
from kafkakv.log.records import RECORD_OVERHEAD, check_record

__all__ = [
    "ATTR_TRANSACTIONAL",
    "BATCH_HEADER",
    "HEADER_SIZE",
    "INDEX_ENTRY",
    "BatchHeader",
    "Row",
    "crc_seed",
    "decode_rows",
    "encode_batch",
    "encode_records",
    "entries_from_rows",
    "latest_from_body",
    "next_valid_batch",
    "parse_header",
    "records_from_rows",
    "reencode_batch",
    "scan_batches",
    "valid_batch_at",
    "verify_crc",
]

ATTR_TRANSACTIONAL = 0x01
HEADER_SIZE = BATCH_HEADER.size  # 56
INDEX_ENTRY = struct.Struct("<II")


class BatchHeader(NamedTuple):
    """The decoded fixed part of a batch. A tuple: a read that looks for an offset parses the
    header of every batch it steps over, where a frozen dataclass cost four times as much."""

    base_offset: int
    size: int
    crc: int
    attributes: int
    record_count: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    delete_horizon_ms: int
    producer: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)


Row = tuple[int, int, "bytes | None", "bytes | None", "list[tuple[str, bytes]] | None"]
"""A stored record: offset delta, timestamp delta, key, value, headers (None when empty)."""


def encode_records(
    records: Sequence[Record],
    now_ms: int,
    *,
    max_message_bytes: int,
    null_keys: bool,
) -> tuple[bytes, int, int]:
    """Validate and encode records for slots ``0..n-1``.

    Returns ``(body, base_timestamp, max_timestamp)``. A record without a timestamp gets
    ``now_ms``. Raises :class:`InvalidRecordError` (a ``TypeError``) for a field of the wrong
    type, or a null key when ``null_keys`` is false, and :class:`RecordTooLargeError` when a
    record's key, value and headers exceed ``max_message_bytes``. Costs O(total bytes).
    """
    if not records:
        raise InvalidRecordError("an append needs at least one record")
    body = plain_body(records, max_message_bytes - RECORD_OVERHEAD)
    if body is not None:  # the usual batch: framed in one pass (see frame.py)
        return body, now_ms, now_ms
    rows, base_ts, max_ts = _checked_rows(records, now_ms, max_message_bytes, null_keys)
    return pack_rows(rows), base_ts, max_ts


def _checked_rows(
    records: Sequence[Record], now_ms: int, max_message_bytes: int, null_keys: bool
) -> tuple[list[Row], int, int]:
    """The rows of any batch, each record checked on its own: ``(rows, base_ts, max_ts)``."""
    rows: list[Row] = []
    base_ts: int | None = None
    max_ts = -(2**63)
    for i, r in enumerate(records):
        key, value, headers, ts = check_record(
            i, r, max_message_bytes=max_message_bytes, null_keys=null_keys
        )
        if ts is None:
            ts = now_ms
        if base_ts is None:
            base_ts = ts
        if ts > max_ts:
            max_ts = ts
        rows.append((i, ts - base_ts, key, value, headers))
    assert base_ts is not None
    return rows, base_ts, max_ts


def encode_batch(
    base_offset: int,
    body: bytes,
    *,
    record_count: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int = 0,
    delete_horizon_ms: int = -1,
    producer: int = 0,
) -> bytes:
    """Frame ``body`` as a complete batch with its header and CRC (:func:`.frame.frame`)."""
    return frame(
        base_offset,
        body,
        record_count,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        attributes,
        delete_horizon_ms,
        producer,
    )


def parse_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at ``pos``; raises :class:`CorruptLogError` if it is not one."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptLogError("truncated batch header", position=pos)
    fields = BATCH_HEADER.unpack_from(buf, pos)
    (base, size, crc, magic, attrs, _r, count, last_delta, bts, mts, horizon, producer) = fields
    if (
        (magic != BATCH_MAGIC and magic != BATCH_MAGIC_V1)
        or size < HEADER_SIZE
        or last_delta < 0
        or count > last_delta + 1
    ):
        raise CorruptLogError("bad batch header (magic, size or counts)", position=pos)
    return new_tuple(
        BatchHeader, (base, size, crc, attrs, count, last_delta, bts, mts, horizon, producer)
    )


def crc_seed(buf: bytes | memoryview, pos: int) -> int:
    """What the CRC of the batch whose header is at ``pos`` starts from, before its bytes from
    CRC_START on: the CRC of its base offset, or 0 for a batch of magic 1 (see the layout)."""
    if buf[pos + CRC_START] == BATCH_MAGIC_V1:
        return 0
    return crc32(memoryview(buf)[pos : pos + 8])


def verify_crc(buf: bytes | memoryview, pos: int, header: BatchHeader) -> bool:
    """True when the batch at ``pos`` (entirely inside ``buf``) matches its CRC."""
    view = memoryview(buf)[pos + CRC_START : pos + header.size]
    return crc32(view, crc_seed(buf, pos)) == header.crc


def records_from_rows(
    rows: Sequence[Row],
    header: BatchHeader,
    partition: int,
    min_offset: int = 0,
    limit: int | None = None,
) -> list[Record]:
    """The records of a decoded batch (its :func:`decode_rows`) from ``min_offset``, at most
    ``limit`` of them. Offsets increase along a batch, so finding the first costs a bisection,
    not a pass: a reader that takes a large batch in slices pays for its slices only."""
    base = header.base_offset
    bts = header.base_timestamp
    start = bisect_left(rows, min_offset - base, key=_offset_delta) if min_offset > base else 0
    stop = len(rows) if limit is None else min(len(rows), start + limit)
    return [
        new_tuple(Record, (k, v, h or (), bts + td, partition, base + od))
        for od, td, k, v, h in rows[start:stop]
    ]


def entries_from_rows(
    rows: Sequence[Row],
    header: BatchHeader,
    partition: int,
    min_offset: int = 0,
    limit: int | None = None,
) -> list[tuple[bytes | None, bytes | None, int]]:
    """As :func:`records_from_rows`, as ``(key, value, offset)`` entries: a reader that needs
    no more (a directory) skips building a six-field record per row."""
    base = header.base_offset
    start = bisect_left(rows, min_offset - base, key=_offset_delta) if min_offset > base else 0
    stop = len(rows) if limit is None else min(len(rows), start + limit)
    return [(k, v, base + od) for od, _, k, v, _ in rows[start:stop]]


def latest_from_body(
    target: dict[bytes | None, bytes | None],
    body: bytes | memoryview,
    header: BatchHeader,
    min_offset: int,
    limit: int,
) -> tuple[int, int, bool]:
    """Put the records of a batch from ``min_offset``, at most ``limit`` of them, into
    ``target`` as the last value per key, straight from the batch's ``body`` (the bytes after
    its header). Returns how many were put, the offset of the last (-1: none), and whether the
    batch was read to its end. Raises :class:`CorruptLogError` (``target`` unchanged) when the
    body does not decode."""
    try:
        taken, last, done = latest_into(target, body, min_offset - header.base_offset, limit)
    except ValueError as exc:  # msgspec.DecodeError is one
        raise CorruptLogError(f"undecodable records: {exc}") from exc
    return taken, header.base_offset + last if taken else -1, done


_offset_delta = itemgetter(0)


def decode_rows(buf: bytes | memoryview, pos: int, header: BatchHeader) -> list[Row]:
    """The raw stored rows of the batch at ``pos`` (for the reads, and the cleaner); raises
    :class:`CorruptLogError` when they do not decode as rows."""
    body = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    try:
        rows = cast("list[Row]", unpack_rows(body))  # headers decode as tuples
    except (ValueError, TypeError) as exc:  # msgspec.DecodeError is a ValueError
        raise CorruptLogError(f"undecodable records: {exc}", position=pos) from exc
    return rows


def reencode_batch(header: BatchHeader, rows: Sequence[Row], delete_horizon_ms: int) -> bytes:
    """Re-frame a batch with a subset of its rows, keeping its base offset and offset span."""
    max_ts = header.base_timestamp + max(row[1] for row in rows) if rows else header.max_timestamp
    return encode_batch(
        header.base_offset,
        pack_rows(list(rows)),
        record_count=len(rows),
        last_offset_delta=header.last_offset_delta,
        base_timestamp=header.base_timestamp,
        max_timestamp=max_ts,
        attributes=header.attributes,
        delete_horizon_ms=delete_horizon_ms,
        producer=header.producer,
    )


def valid_batch_at(buf: bytes | memoryview, pos: int) -> BatchHeader | None:
    """The header of a whole batch at ``pos`` whose checksum holds; None otherwise."""
    try:
        h = parse_header(buf, pos)
    except CorruptLogError:
        return None
    if pos + h.size > len(buf) or not verify_crc(buf, pos, h):
        return None
    return h


def next_valid_batch(
    buf: bytes | memoryview,
    start: int,
    accept: Callable[[int, BatchHeader], bool] | None = None,
) -> int | None:
    """The first position from ``start`` holding a valid batch (that ``accept`` also takes).

    Used to tell a torn tail (nothing valid follows) from damage in the middle. O(n) headers.
    """
    for p in range(start, len(buf) - HEADER_SIZE + 1):
        h = valid_batch_at(buf, p)
        if h is not None and (accept is None or accept(p, h)):
            return p
    return None


def scan_batches(
    buf: bytes | memoryview, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for consecutive whole batches in ``buf[start:end]``.

    Stops quietly at a batch that does not fit entirely; raises :class:`CorruptLogError` for a
    header that is not a batch header. CRCs are not checked here.
    """
    stop = len(buf) if end is None else end
    pos = start
    while stop - pos >= HEADER_SIZE:
        header = parse_header(buf, pos)
        if pos + header.size > stop:
            return
        yield pos, header
        pos += header.size
