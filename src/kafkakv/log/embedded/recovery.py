"""What recovery learns from an active segment, read in bounded chunks.

After a reboot, or with a missing or torn head, the head is rebuilt from the active segment
(see :meth:`Partition.recover_locked`): the valid batches from its start, the first invalid
byte, whether anything valid follows it, and the sparse index of the valid part. A segment may
be as large as ``segment.bytes`` (1 GiB by default), so nothing here holds more of it than a
window of :data:`WINDOW` bytes plus one piece of a batch that does not fit in it: memory stays
bounded whatever the size of the segment or of its batches.

No files here: the caller passes ``read(length, position) -> bytes`` (``os.pread`` on an open
descriptor) and the file's size, and writes what it is told.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from isal.isal_zlib import crc32  # zlib's CRC-32, with carry-less multiplies: ~5x as fast

from kafkakv.errors import CorruptLogError
from kafkakv.log.embedded.format import (
    HEADER_SIZE,
    INDEX_ENTRY,
    BatchHeader,
    crc_seed,
    parse_header,
)
from kafkakv.log.embedded.frame import CRC_START

__all__ = ["WINDOW", "SegmentScan", "ValidPrefix", "index_entries", "valid_prefix"]

WINDOW = 1 << 18
"""Bytes of the segment read at once (and the most kept)."""

Reader = Callable[[int, int], bytes]
"""``read(length, position)``: the file's bytes there, short only at its end (``os.pread``)."""

Accept = Callable[[int, BatchHeader], bool]
"""``accept(position, header)``: whether a batch with a valid checksum counts as valid."""


class SegmentScan:
    """A segment of ``size`` bytes seen through a window of at most ``window`` bytes."""

    def __init__(self, read: Reader, size: int, window: int = WINDOW):
        self._read = read
        self.size = size
        self._window = max(window, HEADER_SIZE)
        self._buf = b""
        self._at = 0  # file position of self._buf[0]

    def header_at(self, pos: int) -> BatchHeader | None:
        """The parsed header at ``pos``; None when it is not a batch header or is cut off."""
        if self.size - pos < HEADER_SIZE:
            return None
        if not (self._at <= pos and pos + HEADER_SIZE <= self._at + len(self._buf)):
            self._buf = self._read(min(self._window, self.size - pos), pos)
            self._at = pos
        try:
            return parse_header(self._buf, pos - self._at)
        except CorruptLogError:
            return None

    def valid_at(self, pos: int) -> BatchHeader | None:
        """The header of a whole batch at ``pos`` whose checksum holds (as
        :func:`~kafkakv.log.embedded.format.valid_batch_at` over the whole file); else None.

        Checks the part of the batch inside the window in place, and reads the rest in pieces
        of at most the window's size, leaving the window where it is."""
        h = self.header_at(pos)
        if h is None or pos + h.size > self.size:
            return None
        start = pos + CRC_START - self._at
        end = pos + h.size - self._at
        crc = crc32(memoryview(self._buf)[start:end], crc_seed(self._buf, pos - self._at))
        done = self._at + min(end, len(self._buf))  # file position checked up to
        stop = pos + h.size
        while done < stop:
            piece = self._read(min(self._window, stop - done), done)
            if not piece:
                return None  # the file shrank under us
            crc = crc32(piece, crc)
            done += len(piece)
        return h if crc == h.crc else None

    def last_nonzero(self) -> int:
        """The position of the file's last byte that is not zero (-1: none), read backwards
        a window at a time. A preallocated segment ends in zeros (see partition.py)."""
        end = self.size
        while end > 0:
            start = max(0, end - self._window)
            piece = self._read(end - start, start).rstrip(b"\0")
            if piece:
                return start + len(piece) - 1
            end = start
        return -1

    def next_valid(self, start: int, accept: Accept) -> int | None:
        """The first position from ``start`` holding a valid batch that ``accept`` takes (as
        :func:`~kafkakv.log.embedded.format.next_valid_batch`). O(n) header parses, up to the
        last byte that is not zero: a batch's header is never all zeros."""
        for p in range(start, min(self.size - HEADER_SIZE, self.last_nonzero()) + 1):
            h = self.valid_at(p)
            if h is not None and accept(p, h):
                return p
        return None


@dataclass(frozen=True, slots=True)
class ValidPrefix:
    """The valid batches at the start of a segment."""

    end: int
    """Byte position after the last valid batch (0 when there is none)."""
    next_offset: int
    """The offset after the last valid batch (the segment's base when there is none)."""
    last_index_pos: int
    """Position of the last index entry the valid batches get (see :func:`index_entries`)."""
    later: int | None
    """Position of a valid batch after invalid bytes at ``end``, or None (a torn tail)."""


def valid_prefix(
    read: Reader, size: int, base: int, interval: int, accept: Accept, window: int = WINDOW
) -> ValidPrefix:
    """Validate the batches of a segment (base offset ``base``) from its start.

    Stops at the first batch that is torn, fails its checksum, or that ``accept`` refuses;
    then looks for a valid batch after it. Raises :class:`~kafkakv.errors.CorruptLogError`
    (with the position) for a valid batch whose base offset does not follow the one before. Reads the segment once (and, past a stop, every
    byte position's header); holds at most about two windows of it.
    """
    scan = SegmentScan(read, size, window)
    pos = 0
    next_offset = base
    last_index = 0
    while True:
        h = scan.valid_at(pos)
        if h is None or not accept(pos, h):
            break
        if h.base_offset != next_offset:  # a writer's bug, or a batch of magic 1 (format.py)
            raise CorruptLogError(
                f"batch at offset {h.base_offset} where the active segment is at "
                f"{next_offset}; refusing to rebuild the head",
                position=pos,
            )
        if pos > 0 and pos - last_index >= interval:
            last_index = pos
        next_offset = h.last_offset + 1
        pos += h.size
    later = scan.next_valid(pos + 1, accept) if pos < size else None
    return ValidPrefix(pos, next_offset, last_index, later)


def index_entries(
    read: Reader, end: int, base: int, interval: int, window: int = WINDOW
) -> Iterator[bytes]:
    """The sparse index of the batches in ``[0, end)`` (validated already: headers only), as
    packed entries joined in pieces of at most a window's worth."""
    scan = SegmentScan(read, end, window)
    pos = 0
    last_index = 0
    entries: list[bytes] = []
    most = max(1, window // INDEX_ENTRY.size)
    while pos < end:
        h = scan.header_at(pos)
        if h is None:
            raise CorruptLogError("a validated batch header no longer parses", position=pos)
        if pos > 0 and pos - last_index >= interval:
            entries.append(INDEX_ENTRY.pack(h.base_offset - base, pos))
            last_index = pos
            if len(entries) >= most:
                yield b"".join(entries)
                entries.clear()
        pos += h.size
    if entries:
        yield b"".join(entries)
