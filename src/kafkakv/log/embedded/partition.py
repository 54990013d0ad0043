"""One partition of the embedded log: segment files, sparse index, head, manifest, locks.

Files in a partition directory::

    head                       the published state (see head.py)
    manifest.json              the list of segments (see manifest.py)
    lock                       flock: held by whoever appends, rolls, swaps or recovers
    clean.lock                 flock: held by the cleaner working on this partition
    <base>-<gen>.log           a segment: record batches back to back
    <base>-<gen>.index         its sparse offset index

Writers serialise on a thread lock (same process) and ``flock`` on ``lock`` (other processes),
and give up with :class:`~kafkakv.errors.LockTimeoutError` at their deadline (see flock.py).
Readers take no lock: they read the head, then only bytes the head says are published. Only a
head that is missing, torn or from an earlier boot sends a reader to the lock, to rebuild it.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import mmap
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any, Literal, NamedTuple

from kafkakv.errors import ClosedError, CorruptLogError, LogIOError, OffsetOutOfRangeError
from kafkakv.gcpause import gc_paused
from kafkakv.log.base import EndMark, Entry, Record, new_tuple
from kafkakv.log.config import TopicConfig
from kafkakv.log.embedded import fs
from kafkakv.log.embedded.bell import Bell
from kafkakv.log.embedded.flock import acquire_until, flock_until, lock_timeout_error, unflock
from kafkakv.log.embedded.format import (
    ATTR_TRANSACTIONAL,
    HEADER_SIZE,
    INDEX_ENTRY,
    BatchHeader,
    Row,
    decode_rows,
    entries_from_rows,
    latest_from_body,
    parse_header,
    records_from_rows,
    scan_batches,
    verify_crc,
)
from kafkakv.log.embedded.frame import append_plain, first_records, frame_header, read_plain
from kafkakv.log.embedded.head import BOOT_ID, HeadFile, HeadState
from kafkakv.log.embedded.manifest import Manifest, SegmentInfo, segment_name
from kafkakv.log.embedded.notify import ChangeNotifier
from kafkakv.log.embedded.recovery import index_entries, valid_prefix
from kafkakv.log.embedded.settings import EmbeddedSettings, FsyncPolicy

__all__ = ["Partition", "PendingTailError", "PreparedBatch"]

Shape = Literal["records", "entries", "latest", "columns"]
"""What :meth:`Partition.read` returns: a list of :class:`Record`, a list of ``(key, value,
offset)`` entries, one dict of the last value per key (:meth:`Log.read_latest`), or the
accumulator of :meth:`Log.latest_columns` it was given (see columns.py)."""

_Take = Callable[
    [Any, bytes | memoryview, int, BatchHeader, Any, int, int, int], tuple[int, int, Any]
]
"""How a read takes records of one batch into its result: ``take(out, buf, p, header, kept,
partition, offset, room)`` puts those at ``offset`` or after, at most ``room`` of them, of the
batch at ``p`` in ``buf`` (or in ``kept``, its rows decoded by a read that stopped inside it)
into ``out``. It returns how many it took, the offset of the last (-1: none), and the batch's
decoded rows when records of it are left after those (None when none are). Raises
:class:`CorruptLogError` when the batch does not decode."""


def _taking_rows(
    make: Callable[..., list[Any]],
    offset_of: Callable[[Any], int],
    put: Callable[[Any, list[Any]], None] = list.extend,
) -> _Take:
    """A :data:`_Take` that decodes the batch's rows, and puts into ``out`` what ``make``
    builds of them (see :func:`~.format.records_from_rows`)."""

    def take(
        out: Any,
        buf: bytes | memoryview,
        p: int,
        h: BatchHeader,
        kept: list[Row] | None,
        part: int,
        offset: int,
        room: int,
    ) -> tuple[int, int, list[Row] | None]:
        rows = decode_rows(buf, p, h) if kept is None else kept
        got = make(rows, h, part, offset, room)
        if not got:
            return 0, -1, None
        put(out, got)
        last = offset_of(got[-1])
        return len(got), last, None if last == h.base_offset + rows[-1][0] else rows

    return take


def _put_latest(out: dict[bytes | None, bytes | None], entries: list[Entry]) -> None:
    out.update([(key, value) for key, value, _ in entries])


_take_latest_rows = _taking_rows(entries_from_rows, itemgetter(2), _put_latest)


def _take_latest(
    out: dict[bytes | None, bytes | None],
    buf: bytes | memoryview,
    p: int,
    h: BatchHeader,
    kept: list[Row] | None,
    part: int,
    offset: int,
    room: int,
) -> tuple[int, int, list[Row] | None]:
    """A :data:`_Take` into a dict of the last value per key. A batch read to its end (the
    common case: a loader) goes into the dict straight from its bytes, with no row decoded; a
    read that stops inside one decodes its rows once, for the reads after it to go on from.
    (It is given the rows another read kept only for a slice: see
    :meth:`Partition._read_segment`.)"""
    if kept is not None or room < h.record_count:
        return _take_latest_rows(out, buf, p, h, kept, part, offset, room)
    body = memoryview(buf)[p + HEADER_SIZE : p + h.size]
    taken, last, done = latest_from_body(out, body, h, offset, room)
    return taken, last, None if done else decode_rows(buf, p, h)  # (a count that lied)


def _take_columns(
    out: Any,
    buf: bytes | memoryview,
    p: int,
    h: BatchHeader,
    kept: list[Row] | None,
    part: int,
    offset: int,
    room: int,
) -> tuple[int, int, list[Row] | None]:
    """A :data:`_Take` into a columns accumulator (see columns.py), as :func:`_take_latest`
    does into a dict: a batch read to its end straight from its bytes (the accumulator holds
    them), one that stops inside decoded once."""
    if kept is not None or room < h.record_count:
        return _take_columns_rows(out, buf, p, h, kept, part, offset, room)
    body = memoryview(buf)[p + HEADER_SIZE : p + h.size]
    try:
        taken, last, done = out.add(body, offset - h.base_offset, room)
    except ValueError as exc:  # msgspec.DecodeError is one
        raise CorruptLogError(f"undecodable records: {exc}") from exc
    last = h.base_offset + last if taken else -1
    return taken, last, None if done else decode_rows(buf, p, h)  # (a count that lied)


def _put_columns(out: Any, entries: list[Entry]) -> None:
    for key, value, _ in entries:
        out.put(key, value)


_take_columns_rows = _taking_rows(entries_from_rows, itemgetter(2), _put_columns)

_take_record_rows = _taking_rows(records_from_rows, itemgetter(5))

_UNDECODED: Any = object()
"""What a :data:`_Take` returns for the rows of a batch it stopped inside of without decoding
them: the next read decodes the batch (see :func:`_take_records`)."""


def _take_records(
    out: list[Record],
    buf: bytes | memoryview,
    p: int,
    h: BatchHeader,
    kept: list[Row] | None,
    part: int,
    offset: int,
    room: int,
) -> tuple[int, int, Any]:
    """A :data:`_Take` into a list of records. A read of at most 1/64 of a batch from its
    start takes those records in C with no row after them decoded (a map's open reads the
    first record of its data topic, whose first batch may be a flush of 500,000 keys: 0.3 s
    decoded whole); the reads that go on inside the batch decode it once, as any other, so a
    sequential reader decodes at most 1/64 of such a batch twice (a replay reads 5,000 ops at
    a time from a bulk append's batches of 65,536: those it decodes once)."""
    few = kept is None and offset <= h.base_offset and room * 64 <= h.record_count
    if few and first_records is not None:
        got = first_records(buf, p, part, room)
        if got is not None:
            out.extend(got)
            return len(got), got[-1].offset, _UNDECODED
    return _take_record_rows(out, buf, p, h, kept, part, offset, room)


def _mapped(fd: int, pos: int, size: int) -> memoryview:
    """The ``size`` bytes at ``pos`` of the segment ``fd``, mapped rather than copied (empty
    when the file is shorter: the caller's read says so). For a batch larger than a read's
    chunk (a flush of a whole map is one): 112 MB mapped and read took 6 ms where ``pread``
    took 90-110 (a copy into pages that each fault in). The mapping is of published bytes,
    which nothing truncates (a writer truncates only past the published end, recovery only an
    unpublished tail), and lasts as long as a view of it does: the decoded records and entries
    are copies, and a columns accumulator keeps the body until it writes its columns."""
    if os.fstat(fd).st_size < pos + size:
        return memoryview(b"")
    start = pos - pos % mmap.ALLOCATIONGRANULARITY
    mapped = mmap.mmap(fd, pos + size - start, mmap.MAP_SHARED, mmap.PROT_READ, offset=start)
    return memoryview(mapped)[pos - start :]


# What a read's result starts as, and how it takes each batch into it.
_SHAPES: dict[str, tuple[Callable[[], Any], _Take]] = {
    "records": (list, _take_records),
    "entries": (list, _taking_rows(entries_from_rows, itemgetter(2))),
    "latest": (dict, _take_latest),
    "columns": (dict, _take_columns),  # (given its accumulator: see Partition.read)
}

_TAKE_RECORDS = _SHAPES["records"][1]
_FROM_BYTES = (
    _take_latest,
    _take_columns,
)  # take a batch read to its end from its bytes  # what read_plain does, for the batches it takes

_READ_CHUNK = 1 << 17
_MAX_READ_CHUNK = 1 << 22
_MAX_SEGMENT_SPAN = 2**31 - 1  # relative offsets in the index are u32; stay well inside
_LOCK_NOW = fcntl.LOCK_EX | fcntl.LOCK_NB
_MAX_MS = 2**63 - 1  # a roll time past any clock: the C append takes a signed 64-bit time
# fs's, unless a test recorder took them
_OS_PWRITE, _OS_PWRITEV, _OS_FDATASYNC = os.pwrite, os.pwritev, os.fdatasync
_PREALLOCATE = 1 << 18
"""Under ``fsync=always`` the active segment's file is grown this far ahead of its data, with
``fallocate``. An ``fdatasync`` after a write that grows a file must also commit the new size
to the file system's journal; inside the file's size it flushes the data alone (on ext4 here,
130 against 200 µs a call). The bytes past the published position read as zeros."""


class _Locked:
    """What :meth:`Partition.locked` returns: a context manager of a class rather than a
    generator, which cost a microsecond more on every append."""

    __slots__ = ("_deadline", "_held", "_part")

    def __init__(self, part: Partition, deadline: float | None) -> None:
        self._part = part
        self._deadline = deadline
        self._held = -1

    def __enter__(self) -> None:
        self._held = self._part._take_lock(self._deadline)

    def __exit__(self, *exc: object) -> None:
        self._part._drop_lock(self._held)


CommittedCheck = Callable[[int, str, int, int, int], bool]
"""``(producer, topic, partition, segment_base, batch_end) -> committed``; see txn.py."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class _IndexCache:
    """The entries of one segment's index that one process has read so far."""

    __slots__ = ("complete", "loaded", "positions", "rels")

    def __init__(self) -> None:
        self.rels: array.array[int] = array.array("I")
        self.positions: array.array[int] = array.array("I")
        self.loaded = 0  # bytes of the index file consumed
        self.complete = False  # the segment is sealed and every entry is cached


class _Start(NamedTuple):
    """Where a read starts in a segment, and what the batch there must say: its base offset
    is ``low`` when ``exact`` (an index entry or a batch read before names it), else at least
    ``low`` (the segment's base, or one past the batch read before)."""

    position: int
    low: int
    exact: bool


_Partial = tuple[tuple[str, int, int], list[Row]]
"""The decoded rows of a batch a read stopped inside of, by (segment, position, CRC): the next
read of a sequential reader starts in it (decoding a batch of 500,000 records again for each
slice of it made reading a large flush quadratic)."""

_Cursor = tuple[str, int, _Start, _Partial | None]
"""Where a read stopped: (segment, next offset, byte position, the batch it stopped inside of
when it did). Threads read a partition at once, so it is one value, written whole and read once
per read: the position and the rows kept from one read never pair with another's (a read that
took another thread's position without its rows took a whole batch from its start, records
below the offset asked for included)."""


class PendingTailError(Exception):
    """Internal: the active segment has unpublished bytes that may belong to a committed
    transaction; the caller must resolve transactions outside the partition lock and retry."""


@dataclass(slots=True)
class PreparedBatch:
    """A batch written to the segment but not yet published (see Partition.write_locked)."""

    first_offset: int
    head: HeadState
    batch_position: int
    batch_size: int


def _io(what: str, path: str, exc: OSError) -> LogIOError:
    err = LogIOError(exc.errno or 0, f"{what} {path}: {exc.strerror or exc}")
    err.__cause__ = exc
    return err


def _crc_holds_at(fd: int, at: int, h: BatchHeader) -> bool:
    """Whether the batch of header ``h`` at byte ``at`` of file ``fd`` is whole and matches
    its CRC (for a batch a read steps over that is larger than the chunk it read)."""
    whole = os.pread(fd, h.size, at)
    return len(whole) == h.size and verify_crc(whole, 0, h)


class Partition:
    """A partition as one open log sees it. Thread-safe."""

    def __init__(
        self,
        topic: str,
        number: int,
        directory: str,
        config: TopicConfig,
        settings: EmbeddedSettings,
        committed: CommittedCheck,
        resolve_pending: Callable[[Partition, float], None],
        notifier: ChangeNotifier,
        token: str,
    ):
        self.topic = topic
        self.number = number
        self.dir = directory
        self.config = config
        self.null_keys = not config.compact  # records without a key are taken
        self.settings = settings
        self._committed = committed
        self._resolve_pending = resolve_pending
        # Who hears a publish: other logs through this log's bell, waiters of this log through
        # its notifier (see bell.py).
        self._notifier = notifier
        self._bell = Bell(directory, token, settings.file_mode, settings.dir_mode)
        self._tlock = threading.RLock()
        self._cache_lock = threading.Lock()
        self.lock_path = os.path.join(directory, "lock")
        try:
            self._head = HeadFile(os.path.join(directory, "head"))
            self._lock_fd = fs.open(
                self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, settings.file_mode
            )
        except OSError as exc:
            raise _io("cannot open partition", directory, exc) from exc
        self._manifest: Manifest | None = None
        self._bases: list[int] = []
        # Readers run without the cache lock: a reload retires the descriptors of segments
        # gone from the manifest, closed once no read is running (one may still use them).
        # close() likewise leaves the head and the read descriptors to the last reader out
        # (see _release_locked); _readers counts the reads and head reads under way.
        self._read_fds: dict[str, int] = {}
        self._retired: list[int] = []
        self._readers = 0
        self._closed = False
        self._index: dict[str, _IndexCache] = {}
        # Where the last read stopped: a tailing reader starts there instead of scanning
        # forward from the last sparse-index entry. See _Cursor: one value, written whole, as
        # threads read the partition at once.
        self._read_cursor: _Cursor | None = None
        self._wname: str | None = None
        self._wfd = -1
        self._ifd = -1
        # The active segment's file size as far as this process knows (it grew it, or saw
        # it when opening the file): when another process shrank or grew it since, appends
        # only preallocate later or sooner than they might.
        self._wsize = 0
        self._preallocates = settings.fsync is FsyncPolicy.ALWAYS
        # Under fsync=interval an append only marks the partition unsynced; the log's flusher
        # thread fdatasyncs it (see sync_pending). _fd_lock keeps the segment fd it dups open.
        self._unsynced = False
        self._fd_lock = threading.Lock()
        self._locked_depth = 0
        # The compiled steady-state append (frame.append_plain), if built, and what it needs
        # from the last append made the Python way: (layout version, active segment's base,
        # the time it rolls for age, in ms), or None until then. The C code declines when the
        # head names another layout or segment, so a stale entry costs one Python-path append.
        self._append_plain = append_plain
        # The compiled common case of a sequential read of records (frame.read_plain), or None.
        self._read_plain = read_plain
        self._steady: tuple[int, int, int] | None = None
        # The fsync policy, decided once for both append paths (see sync_locked): sync on
        # every append, or mark the partition for the log's flusher thread.
        interval = settings.fsync is FsyncPolicy.INTERVAL
        self._sync_each = settings.fsync is FsyncPolicy.ALWAYS or (
            interval and settings.fsync_interval_ms <= 0
        )
        self._mark_unsynced = interval and settings.fsync_interval_ms > 0

    # -- state ------------------------------------------------------------------------
    def published(self) -> HeadState:
        """The published head: a lock-free read of the head file (a few hundred nanoseconds).

        Only a head that is missing, torn or from an earlier boot is rebuilt, under the lock
        (waiting at most the log's ``lock_timeout``). A roll that a killed writer left half
        done needs no repair to read: readers never look past the head's segment, and the next
        writer finishes the roll.
        """
        with self._cache_lock:
            if self._closed:
                raise self._closed_error()
            self._readers += 1  # the head stays open meanwhile
        try:
            head = self._head.read()
            if head is None or head.boot_id != BOOT_ID:
                with self.locked():
                    head = self.settled_locked()
            return head
        finally:
            with self._cache_lock:
                self._readers -= 1
                if not self._readers and (self._retired or self._closed):
                    self._release_locked()

    def settle(self, deadline: float | None = None) -> HeadState:
        """Take the lock and make the head agree with the segments (see settled_locked)."""
        with self.locked(deadline):
            return self.settled_locked()

    def settled_locked(self) -> HeadState:
        """The head, made consistent with the manifest on disk; the caller holds the lock.

        Rebuilds a head that is missing, torn or from an earlier boot, and finishes a segment
        roll that a killed writer left half done (as Kafka recovers logs at start-up). Costs
        one manifest read; the full recovery only when one is needed.
        """
        with self._cache_lock:
            m = self._reload_manifest_locked()
        head = self._head.read()
        if head is None or head.boot_id != BOOT_ID or m.active.base != head.active_base:
            head = self.recover_locked()
        return head

    def manifest(self, at_least: int = 0) -> Manifest:
        """The manifest, reloaded when the cached one is older than ``at_least``."""
        m = self._manifest  # immutable, replaced whole: no lock to look (a reader holds it long)
        if m is not None and m.version >= at_least:
            return m
        with self._cache_lock:
            m = self._manifest
            if m is None or m.version < at_least:
                m = self._reload_manifest_locked()
            return m

    def _reload_manifest_locked(self) -> Manifest:
        try:
            m = Manifest.load(self.dir)
        except FileNotFoundError as exc:
            raise CorruptLogError(
                f"partition {self.topic}-{self.number} has no manifest", path=self.dir
            ) from exc
        except OSError as exc:
            raise _io("cannot read manifest of", self.dir, exc) from exc
        self._manifest = m
        self._bases = [s.base for s in m.segments]
        live = {s.name for s in m.segments}
        for name in [n for n in self._read_fds if n not in live]:
            self._retired.append(self._read_fds.pop(name))
        if not self._readers:
            self._release_locked()
        for name in [n for n in self._index if n not in live]:
            del self._index[name]
        return m

    def _release_locked(self) -> None:
        """Close the retired read descriptors, and once the partition is closed, every read
        descriptor and the head too. With the cache lock held and no read under way."""
        if self._closed:
            self._retired.extend(self._read_fds.values())  # a read may have opened more
            self._read_fds.clear()
            self._head.close()
        for fd in self._retired:
            os.close(fd)
        self._retired.clear()

    def _closed_error(self) -> ClosedError:
        return ClosedError(f"partition {self.topic}-{self.number} was closed (the log closed)")

    def start_offset(self) -> int:
        return self.published().start_offset

    def end_offset(self) -> int:
        return self.published().next_offset

    def end_mark(self) -> EndMark | None:
        """See :meth:`kafkakv.log.base.Log.end_mark`: the head's mapping and bytes, which hold
        the end offset itself (so bytes unchanged are an end offset unchanged)."""
        self.published()  # reads the head (rebuilding a missing, torn or earlier boot's one)
        mapped = self._head.last_mapped()  # those bytes, or a later publish's: one read only
        if mapped is None or mapped[2].boot_id != BOOT_ID:
            return None
        mm, raw, state = mapped
        return EndMark(state.next_offset, mm, raw)

    def data_bytes(self) -> int:
        """Bytes of batches the partition holds: its sealed segments' sizes and the published
        part of the active one, not the space preallocated past it (``fsync=always``). Costs
        a head read, and a manifest read when the cached one is older than the head."""
        head = self.published()
        m = self.manifest()
        if m.active.base != head.active_base:  # rolled since the manifest was cached
            with self._cache_lock:
                m = self._reload_manifest_locked()
            if m.active.base != head.active_base:  # a roll under way now: wait for it
                with self.locked():
                    head = self.settled_locked()
                    m = self.manifest()
        total = head.active_pos
        for seg in m.sealed:
            if seg.size is not None:
                total += seg.size
            else:  # sealed by a version that did not record sizes
                with contextlib.suppress(FileNotFoundError):  # the cleaner replaced it
                    total += os.stat(os.path.join(self.dir, seg.name + ".log")).st_size
        return total

    # -- reading ----------------------------------------------------------------------
    def _read_fd(self, name: str) -> int:
        fd = self._read_fds.get(name)
        if fd is None:
            path = os.path.join(self.dir, name + ".log")
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # FileNotFoundError: caller reloads
            self._read_fds[name] = fd
        return fd

    def _load_index(self, seg: SegmentInfo, end: int) -> _IndexCache:
        """Index entries of ``seg`` below ``end``, read from where the cache stopped."""
        cache = self._index.get(seg.name)
        if cache is None:
            cache = self._index[seg.name] = _IndexCache()
        path = os.path.join(self.dir, seg.name + ".index")
        try:
            with open(path, "rb") as f:
                f.seek(cache.loaded)
                raw = f.read()
        except FileNotFoundError:
            raw = b""
        usable = len(raw) - len(raw) % INDEX_ENTRY.size
        for rel, pos in INDEX_ENTRY.iter_unpack(raw[:usable]):
            if pos >= end or (cache.positions and pos <= cache.positions[-1]):
                break  # not published yet (or left by a torn append): stop caching here
            cache.rels.append(rel)
            cache.positions.append(pos)
            cache.loaded += INDEX_ENTRY.size
        cache.complete = seg.size is not None
        return cache

    def _position_for(self, seg: SegmentInfo, offset: int, end: int) -> _Start:
        """A batch boundary at or before ``offset`` (the sparse index, then a short scan), and
        the base offset its batch must have there."""
        rel = offset - seg.base
        if rel <= 0:
            return _Start(0, seg.base, False)
        cache = self._index.get(seg.name)
        if cache is None or (
            not cache.complete
            and (not cache.rels or rel > cache.rels[-1])
            and end - (cache.positions[-1] if cache.positions else 0)
            >= 2 * max(self.config.index_interval_bytes, 1)
        ):
            cache = self._load_index(seg, end)
        k = bisect_right(cache.rels, rel) - 1
        if k < 0:
            return _Start(0, seg.base, False)
        return _Start(cache.positions[k], seg.base + cache.rels[k], True)

    def read(
        self,
        offset: int,
        max_records: int,
        max_bytes: int,
        shape: Shape = "records",
        into: Any = None,
    ) -> tuple[Any, int]:
        """Records at or after ``offset`` in the ``shape`` asked for, and the offset to read
        from next (one past the last of them; ``offset`` when there is none); see
        :meth:`kafkakv.log.base.Log.read`. ``into``: what to take them into, rather than a
        new one (the ``"columns"`` shape's accumulator)."""
        with self._cache_lock:
            if self._closed:
                raise self._closed_error()
            self._readers += 1  # what this read uses stays open (see _release_locked)
        with gc_paused():  # over the release too: gc on there made reads 20% slower
            try:
                head = self._head.read()  # as published(), this read counted already
                if head is None or head.boot_id != BOOT_ID:
                    head = self.published()  # rebuilds it
                new, take = _SHAPES[shape]
                if offset >= head.next_offset:
                    return new() if into is None else into, offset
                if offset < head.start_offset:
                    raise OffsetOutOfRangeError(
                        f"offset {offset} of {self.topic}-{self.number} is below the log start "
                        f"offset {head.start_offset}"
                    )
                for attempt in range(5):
                    try:
                        with self._cache_lock:  # only the cache: threads read in parallel
                            m = self._manifest
                            if m is None or m.version < head.layout_version or attempt:
                                m = self._reload_manifest_locked()
                            bases = self._bases
                        out = new() if into is None else into
                        after = self._read_from(
                            m, bases, head, offset, max_records, max_bytes, take, out
                        )
                        return out, after
                    except FileNotFoundError:
                        head = self.published()  # a cleaner swapped segments: reload, retry
                raise CorruptLogError(
                    f"segments of {self.topic}-{self.number} keep disappearing while reading",
                    path=self.dir,
                )
            finally:
                with self._cache_lock:
                    self._readers -= 1
                    if not self._readers and (self._retired or self._closed):
                        self._release_locked()

    def _read_from(
        self,
        m: Manifest,
        bases: list[int],
        head: HeadState,
        offset: int,
        max_records: int,
        max_bytes: int,
        take: _Take,
        out: Any,
    ) -> int:
        """Take up to ``max_records`` records from ``offset`` into ``out`` (see :data:`_Take`);
        return one past the offset of the last (``offset`` when none was read)."""
        after = offset
        budget, room = max(1, max_bytes), max_records
        i = max(0, bisect_right(bases, offset) - 1)
        segs = m.segments
        while i < len(segs) and room > 0 and budget > 0:
            seg = segs[i]
            if seg.base > head.active_base:
                break  # rolled after the head we read: nothing published there yet
            if seg.base == head.active_base:
                end, limit = head.active_pos, head.next_offset
            elif seg.size is None or i + 1 == len(segs):
                break
            else:
                end, limit = seg.size, segs[i + 1].base
            cursor = self._read_cursor
            if cursor is not None and cursor[0] == seg.name and cursor[1] == offset:
                start = cursor[2]  # a sequential reader: on from where the last read stopped
                fast = self._read_plain
                if fast is not None and take is _TAKE_RECORDS and cursor[3] is None:
                    # Whole batches as appends leave them, in C; from the first that is not
                    # (or the read's end) on, the Python path below.
                    with self._cache_lock:  # open while the read runs (_readers)
                        fd = self._read_fds.get(seg.name)
                        if fd is None:
                            fd = self._read_fd(seg.name)
                    got = fast(fd, start.position, end, start.low, limit, self.number, room, budget)
                    if got is not None:
                        records, last, position, low, room, budget = got
                        if records:
                            out.extend(records)
                            after = last
                        start = new_tuple(_Start, (position, low, False))  # no Python call
                        self._read_cursor = (seg.name, low, start, None)
                        if room <= 0 or budget <= 0 or position >= end:
                            i += 1
                            continue
            else:
                with self._cache_lock:
                    start = self._position_for(seg, offset, end)
                if (
                    cursor is not None
                    and cursor[0] == seg.name
                    and start.position <= cursor[2].position
                    and cursor[1] <= offset
                ):
                    start = cursor[2]  # nearer than the sparse index
            partial = cursor[3] if cursor is not None else None
            budget, room, after = self._read_segment(
                seg, start, end, limit, offset, out, room, budget, take, after, partial
            )
            i += 1
        return after

    def _read_segment(
        self,
        seg: SegmentInfo,
        start: _Start,
        end: int,
        limit: int,
        offset: int,
        out: Any,
        room: int,
        budget: int,
        take: _Take,
        after: int,
        partial: _Partial | None = None,
    ) -> tuple[int, int, int]:
        """Read the batches of ``seg`` from ``start`` up to byte ``end`` into ``out``, at most
        ``room`` records; return the byte budget and the room left, and one past the offset of
        the last record read (``after`` when none was). ``partial``: the batch the read this
        one goes on from stopped inside of, decoded (see :data:`_Cursor`).

        Every batch's offsets are checked before anything of it is used (the CRC of a batch
        of magic 1 does not cover its base offset; see format.py): the first must have the
        base offset ``start`` names, each next one must begin above the last, and all must end
        below ``limit`` (the next segment's base, or the published end). Raises
        :class:`CorruptLogError` otherwise.

        A batch stepped over on the way to ``offset`` whose CRC fails (so its offsets may be
        wrong) is passed only when the first batch taken after it begins at or before
        ``offset``: then the records asked for cannot be inside it. Otherwise they might be,
        and the read raises rather than return what follows as if they were not there. So a
        damaged batch never hides records, and never stops reads that begin past it.
        """
        pos, low, exact = start
        suspect = -1  # where a batch stepped over failed its CRC (-1: none)
        with self._cache_lock:
            fd = self._read_fd(seg.name)  # stays open while this read runs (see _readers)
        part = self.number
        chunk = _READ_CHUNK  # grows while the caller keeps wanting more: never copy far past need
        while pos < end and room > 0 and budget > 0:
            buf: bytes | memoryview = os.pread(
                fd, min(end - pos, max(min(budget, chunk), HEADER_SIZE)), pos
            )
            chunk = min(chunk * 2, _MAX_READ_CHUNK)
            p = 0
            n = len(buf)
            while n - p >= HEADER_SIZE:
                try:
                    h = parse_header(buf, p)
                except CorruptLogError as exc:
                    raise self._corrupt(seg, pos + p, str(exc)) from None
                if (h.base_offset != low if exact else h.base_offset < low) or (
                    h.last_offset >= limit
                ):
                    raise self._corrupt(seg, pos + p, self._offsets_problem(h, low, exact, limit))
                if h.last_offset < offset:  # before the offset asked for: its rows are not read
                    if pos + p + h.size > end:
                        raise self._corrupt(seg, pos + p, "batch runs past the published end")
                    # Stepping over it trusts its offsets, which its CRC covers. A damaged
                    # one is suspect (see above) until a batch from offset or before shows
                    # that the offset asked for is not inside it. (One larger than buf is
                    # read for the check: rare, as the sparse index has an entry just after
                    # every batch larger than its interval.)
                    if suspect < 0 and not (
                        verify_crc(buf, p, h) if p + h.size <= n else _crc_holds_at(fd, pos + p, h)
                    ):
                        suspect = pos + p
                    low, exact = h.last_offset + 1, False
                    p += h.size
                    continue
                if suspect >= 0:
                    if h.base_offset > offset:
                        raise self._corrupt(seg, suspect, "batch checksum mismatch")
                    suspect = -1
                where = (seg.name, pos + p, h.crc)
                # A batch the last read stopped inside of is decoded already: its bytes need
                # not be in buf (after it, the outer loop reads on from its end). A read of
                # the last value per key that takes the rest of the batch takes it from the
                # bytes, in C, faster than from decoded rows (a map's open read one record of
                # a 500,000-record flush batch for its settings, and its bootstrap then went
                # through the rows in Python); one that takes a slice goes on from the rows.
                whole = take in _FROM_BYTES and room >= h.record_count
                kept = None
                if partial is not None and partial[0] == where and not whole:
                    kept = partial[1]
                if kept is None and p + h.size > n:
                    if p == 0:  # one batch larger than the chunk: read exactly it
                        if pos + h.size > end:
                            raise self._corrupt(seg, pos, "batch runs past the published end")
                        buf = _mapped(fd, pos, h.size) or os.pread(fd, h.size, pos)
                        n = len(buf)
                        if n < h.size:
                            raise self._corrupt(seg, pos, "segment shorter than published")
                        continue
                    break
                low, exact = h.last_offset + 1, False
                if kept is None and not verify_crc(buf, p, h):
                    raise self._corrupt(seg, pos + p, "batch checksum mismatch")
                try:
                    taken, last, keep = take(out, buf, p, h, kept, part, offset, room)
                except CorruptLogError as exc:
                    raise self._corrupt(seg, pos + p, str(exc)) from exc
                room -= taken
                budget -= h.size
                if taken:
                    after = last + 1
                if keep is _UNDECODED:  # stopped inside this batch, with nothing to keep
                    self._read_cursor = None
                    return budget, room, after
                if keep is not None:
                    # The read stops inside this batch: keep it decoded for the next one.
                    self._read_cursor = (
                        seg.name,
                        last + 1,
                        _Start(pos + p, h.base_offset, True),
                        (where, keep),
                    )
                    return budget, room, after
                if room <= 0 or budget <= 0:
                    self._read_cursor = (
                        seg.name,
                        low,
                        _Start(pos + p + h.size, low, False),
                        None,
                    )
                    return budget, room, after
                p += h.size
            if p == 0:
                raise self._corrupt(seg, pos, "segment shorter than published")
            pos += p
            self._read_cursor = (seg.name, low, _Start(pos, low, False), None)  # at a batch
        if suspect >= 0:
            raise self._corrupt(seg, suspect, "batch checksum mismatch")
        return budget, room, after

    @staticmethod
    def _offsets_problem(h: BatchHeader, low: int, exact: bool, limit: int) -> str:
        span = f"batch with offsets {h.base_offset}..{h.last_offset}"
        if h.last_offset >= limit:
            return f"{span} past the segment's end offset {limit}"
        if exact:
            return f"{span} where the index or the previous read says offset {low}"
        return f"{span} not above offset {low - 1}"

    def _corrupt(self, seg: SegmentInfo, position: int, message: str) -> CorruptLogError:
        path = os.path.join(self.dir, seg.name + ".log")
        return CorruptLogError(
            f"{self.topic}-{self.number}: {message} in {path} at byte {position}; "
            "run `kafkakv log check` for a full report",
            path=path,
            position=position,
        )

    # -- locking ----------------------------------------------------------------------
    def locked(self, deadline: float | None = None) -> _Locked:
        """Hold the partition's write lock (re-entrant within a thread): ``with
        part.locked(): ...``.

        Waits for other threads and processes until ``deadline`` (a :func:`time.monotonic`
        value; None: ``lock_timeout`` from the first wait), then raises
        :class:`~kafkakv.errors.LockTimeoutError` naming the lock file and its holder.
        Uncontended it costs one ``flock`` call (non-blocking) to take and one to release.
        """
        return _Locked(self, deadline)

    def _take_lock(self, deadline: float | None) -> int:
        """Take the thread lock, then (outermost only) the file lock; return the descriptor
        holding the ``flock`` (-1 when nested). See :meth:`locked`."""
        if not self._tlock.acquire(blocking=False):
            start = time.monotonic()
            if deadline is None:
                deadline = start + self.settings.lock_timeout
            if not acquire_until(self._tlock, deadline):
                waited = time.monotonic() - start
                raise lock_timeout_error(
                    self._lock_name(), self.lock_path, waited, thread_lock=True
                )
        try:
            self._locked_depth += 1
            if self._closed:  # set under this lock by close(): the lock file is gone
                raise self._closed_error()
            if self._locked_depth > 1:
                return -1
            held = self._lock_fd
            try:
                fcntl.flock(held, _LOCK_NOW)
            except BlockingIOError:
                if deadline is None:
                    deadline = time.monotonic() + self.settings.lock_timeout
                held = flock_until(held, self.lock_path, deadline, self._lock_name())
            return held
        except BaseException:
            self._locked_depth -= 1
            self._tlock.release()
            raise

    def _drop_lock(self, held: int) -> None:
        """Undo :meth:`_take_lock` that returned ``held``."""
        try:
            if held >= 0:
                unflock(held, self._lock_fd)
        finally:
            self._locked_depth -= 1
            self._tlock.release()

    def _lock_name(self) -> str:
        return f"the write lock of partition {self.topic}-{self.number}"

    def _open_active_locked(self, m: Manifest) -> None:
        name = m.active.name
        if self._wname == name:
            return
        self._close_writer()
        base = os.path.join(self.dir, name)
        try:
            mode = self.settings.file_mode
            wfd = fs.open(base + ".log", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
            try:
                ifd = fs.open(
                    base + ".index", os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, mode
                )
            except OSError:
                fs.close(wfd)
                raise
        except OSError as exc:
            raise _io("cannot open segment", base, exc) from exc
        with self._fd_lock:
            self._wfd, self._ifd, self._wname = wfd, ifd, name
        self._wsize = os.fstat(wfd).st_size

    def _close_writer(self) -> None:
        with self._fd_lock:
            for fd in (self._wfd, self._ifd):
                if fd >= 0:
                    fs.close(fd)
            self._wfd = self._ifd = -1
            self._wname = None

    def prepare_locked(self, *, resolve_pending: bool) -> HeadState:
        """Authoritative head for an append; the caller holds :meth:`locked`.

        Repairs a torn tail left by a writer that died before publishing. When
        ``resolve_pending`` is true and such a tail exists, raises :class:`PendingTailError`
        instead, so the caller can first roll forward a committed transaction that owns it.
        Zeros past the published position are not a tail but preallocated space (see
        :data:`_PREALLOCATE`): a batch never begins with the zero bytes of a whole header.
        """
        head = self._head.read()
        if head is None or head.boot_id != BOOT_ID:
            head = self.recover_locked()
        m = self.manifest(head.layout_version)
        if m.active.base != head.active_base:
            head = self.recover_locked()
            m = self.manifest(head.layout_version)
        self._open_active_locked(m)
        # One pread from the last published byte: whether the file reaches the published
        # position, and whether a batch was written after it. No fstat: on Linux 6.13 and
        # later a stat makes the next write's mtime fine-grained, and the fdatasync after it
        # then commits the journal (230 instead of 130 µs under fsync=always).
        pos = head.active_pos
        at = pos - 1 if pos else 0
        raw = os.pread(self._wfd, HEADER_SIZE + 1, at)
        if at + len(raw) < pos:
            head = self.recover_locked()
        elif raw.count(0, pos - at) != len(raw) - (pos - at):
            if resolve_pending:
                raise PendingTailError()
            self._truncate_locked(pos)
        return head

    def _truncate_locked(self, pos: int) -> None:
        fs.ftruncate(self._wfd, pos)
        self._wsize = pos
        raw = os.pread(self._ifd, os.fstat(self._ifd).st_size, 0)
        keep = 0
        for rel_pos in INDEX_ENTRY.iter_unpack(raw[: len(raw) - len(raw) % INDEX_ENTRY.size]):
            if rel_pos[1] >= pos:
                break
            keep += INDEX_ENTRY.size
        fs.ftruncate(self._ifd, keep)

    # -- appending --------------------------------------------------------------------
    def write_locked(
        self,
        head: HeadState,
        body: bytes,
        count: int,
        base_ts: int,
        max_ts: int,
        *,
        producer: int = 0,
    ) -> PreparedBatch:
        """Write one batch after ``head`` (rolling first if needed); publish nothing.

        Returns the head to publish. The caller holds :meth:`locked`.
        """
        size = HEADER_SIZE + len(body)
        head = self._maybe_roll_locked(head, size)
        first = head.next_offset
        # format.encode_batch's fields, by position (no keyword call here). The header goes
        # beside the body in one pwritev: a batch of megabytes is not copied to be written.
        header = frame_header(
            first,  # base_offset
            body,
            count,  # record_count
            count - 1,  # last_offset_delta
            base_ts,
            max_ts,
            ATTR_TRANSACTIONAL if producer else 0,  # attributes
            -1,  # delete_horizon_ms
            producer,
        )
        pos = head.active_pos
        if self._preallocates and pos + size > self._wsize:
            self._preallocate_locked(pos, pos + size)
        try:
            written = fs.pwritev(self._wfd, [header, body], pos)
            if written != size:
                raise OSError(errno.ENOSPC, "short write")
            last_index = head.last_index_pos
            interval = self.config.index_interval_bytes
            if pos > 0 and pos - last_index >= interval:
                fs.write(self._ifd, INDEX_ENTRY.pack(first - head.active_base, pos))
                last_index = pos
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._truncate_locked(pos)
            raise _io("cannot append to", os.path.join(self.dir, self._wname or "?"), exc) from exc
        self._wsize = max(self._wsize, pos + size)
        new = HeadState(  # spelled out: _replace costs more than building it
            head.seq + 1,
            first + count,
            head.start_offset,
            head.active_base,
            pos + size,
            head.layout_version,
            last_index,
            head.boot_id,
        )
        return PreparedBatch(first, new, pos, size)

    def _preallocate_locked(self, pos: int, end: int) -> None:
        """Grow the active segment's file to hold at least up to ``end``, and up to
        :data:`_PREALLOCATE` bytes past ``pos`` within ``segment.bytes``. Where the file
        system cannot, appends go on growing the file as they write."""
        size = max(end, min(pos + _PREALLOCATE, self.config.segment_bytes))
        try:
            fs.fallocate(self._wfd, pos, size - pos)
        except OSError:
            self._preallocates = False
            return
        self._wsize = max(self._wsize, size)

    def sync_locked(self, *, force: bool = False) -> None:
        """Flush the active segment as the fsync policy asks; the caller holds :meth:`locked`.

        ``always`` (or ``force``): ``fdatasync`` now. ``interval``: mark the partition
        unsynced, for the log's flusher thread (:meth:`sync_pending`), so no append waits for
        the disk; with ``fsync_interval_ms=0`` there is no flusher and it syncs now as well.
        """
        if force or self._sync_each:
            if self._wfd >= 0:
                fs.fdatasync(self._wfd)
        elif self._mark_unsynced:
            self._unsynced = True

    def sync_pending(self) -> bool:
        """``fdatasync`` the active segment if an append left it unsynced; True if it did.

        Takes no partition lock: appends go on during the disk flush. It syncs a duplicate of
        the segment's descriptor, which stays valid if a roll closes the original (a roll
        syncs the segment it seals itself). Every append that marked the partition before
        this call is on disk when it returns. The head file is never synced: after a reboot it
        is rebuilt from the segment (see :meth:`recover_locked`).
        """
        with self._fd_lock:
            if not self._unsynced or self._wfd < 0:
                return False
            self._unsynced = False  # before the sync: a later append marks it again
            fd = fs.dup(self._wfd)
        try:
            fs.fdatasync(fd)
        finally:
            fs.close(fd)
        return True

    def publish_locked(self, head: HeadState, origin: object = None) -> None:
        """Publish ``head`` and wake whoever waits for it: other logs through this log's bell,
        this log's waiters unless deaf to ``origin`` (see ChangeNotifier.poke)."""
        if self._bell.fd < 0:
            self._bell.make_locked()
        self._head.publish(head)
        self._announce(origin)

    def _announce(self, origin: object) -> None:
        """After a publish: ring this log's bell, poke this log's waiters (see bell.py)."""
        self._bell.ring()
        if self._notifier.waiting:
            self._notifier.poke(self._head.path, origin)

    def append(
        self,
        body: bytes,
        count: int,
        base_ts: int,
        max_ts: int,
        deadline: float | None = None,
        origin: object = None,
    ) -> int:
        """Append one encoded batch (non-transactional) and publish it; return its offset.

        Waits for locks until ``deadline`` (see :meth:`locked`). The steady state (no lock to
        wait for, no tail, no roll) goes through the compiled
        :data:`~kafkakv.log.embedded.frame.append_plain` where it is built: the same system
        calls with the same bytes, in one call. ``origin``: see :meth:`publish_locked`."""
        if (
            self._steady is not None
            and self._append_plain is not None
            # not a test's recorder of the writes (see fs.py): the C code calls the OS itself
            and fs.pwrite is _OS_PWRITE
            and fs.pwritev is _OS_PWRITEV
            and fs.fdatasync is _OS_FDATASYNC
            and self._tlock.acquire(blocking=False)
        ):
            try:
                # Not inside this thread's own locked(), nor closed (the path below says so).
                if self._locked_depth == 0 and not self._closed:
                    first = self._append_steady(body, count, base_ts, max_ts)
                    if first is not None:
                        if self._notifier.waiting:  # the compiled append rang the bell
                            self._notifier.poke(self._head.path, origin)
                        return first
            finally:
                self._tlock.release()
        resolve = True
        while True:
            try:
                with self.locked(deadline):
                    head = self.prepare_locked(resolve_pending=resolve)
                    prepared = self.write_locked(head, body, count, base_ts, max_ts)
                    self.sync_locked()
                    self.publish_locked(prepared.head, origin)
                    new = prepared.head
                    active = self.manifest(new.layout_version).active
                    roll_at = min(active.created_ms + self.config.segment_ms, _MAX_MS)
                    self._steady = (new.layout_version, new.active_base, roll_at)
                    return prepared.first_offset
            except PendingTailError:
                if deadline is None:
                    deadline = time.monotonic() + self.settings.lock_timeout
                self._resolve_pending(self, deadline)  # outside the lock: it takes several
                resolve = False

    def _append_steady(self, body: bytes, count: int, base_ts: int, max_ts: int) -> int | None:
        """:meth:`append` through the compiled steady state, the thread lock held; None when it
        declined (nothing written, the flock released)."""
        assert self._steady is not None and self._append_plain is not None
        layout, base, roll_at = self._steady
        config, head = self.config, self._head
        done: tuple[int, bytes, HeadState] | None  # typed here: no cast() call on the way out
        try:
            done = self._append_plain(
                self._lock_fd,
                self._wfd,
                self._ifd,
                head._fd,
                head._mm,
                BOOT_ID,
                layout,
                base,
                self._wsize if self._preallocates else -1,
                config.segment_bytes,
                roll_at,
                config.index_interval_bytes,
                body,
                count,
                base_ts,
                max_ts,
                self._sync_each,
                self._bell.fd,
            )
        except OSError as exc:  # a batch cut off again, or written and left unpublished
            self._wsize = 0  # the file may be shorter now: the next append preallocates anew
            raise _io("cannot append to", os.path.join(self.dir, self._wname or "?"), exc) from exc
        if done is None:
            return None
        first, raw, state = done
        head._last = (raw, state)  # as HeadFile.publish: the next read skips the CRC
        if self._mark_unsynced:
            self._unsynced = True  # for the flusher (see sync_locked)
        return first

    def _maybe_roll_locked(self, head: HeadState, incoming: int) -> HeadState:
        m = self.manifest(head.layout_version)
        active = m.active
        pos = head.active_pos
        full = pos > 0 and pos + incoming > self.config.segment_bytes
        old = pos > 0 and now_ms() - active.created_ms >= self.config.segment_ms
        wide = head.next_offset - active.base >= _MAX_SEGMENT_SPAN
        if not (full or old or wide):
            return head
        return self.roll_locked(head, m)

    def roll_locked(self, head: HeadState, m: Manifest) -> HeadState:
        """Seal the active segment and start a new one at ``head.next_offset``; publish it."""
        if os.fstat(self._wfd).st_size > head.active_pos:
            fs.ftruncate(self._wfd, head.active_pos)  # preallocated: it seals at its data's end
        fs.fdatasync(self._wfd)  # under every policy: the manifest records the size it seals
        sealed = replace(m.active, size=head.active_pos, max_ts=self._max_timestamp_locked(head))
        new = SegmentInfo(
            base=head.next_offset,
            name=segment_name(head.next_offset, m.next_generation),
            created_ms=now_ms(),
        )
        base = os.path.join(self.dir, new.name)
        for ext in (".log", ".index"):  # truncate: a killed roll may have left this name
            flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            fs.close(fs.open(base + ext, flags, self.settings.file_mode))
        m2 = replace(
            m,
            version=m.version + 1,
            segments=(*m.sealed, sealed, new),
            next_generation=m.next_generation + 1,
        )
        m2.save(self.dir, mode=self.settings.file_mode)
        with self._cache_lock:
            self._reload_manifest_locked()
        rolled = head._replace(
            seq=head.seq + 1,
            active_base=new.base,
            active_pos=0,
            layout_version=m2.version,
            last_index_pos=0,
        )
        self.publish_locked(rolled)
        self._open_active_locked(m2)
        return rolled

    def _max_timestamp_locked(self, head: HeadState) -> int:
        """Largest timestamp of the active segment, from batch headers only (mmap, no copy)."""
        if head.active_pos == 0:
            return -1
        with (
            mmap.mmap(self._wfd, head.active_pos, mmap.MAP_SHARED, mmap.PROT_READ) as mm,
            memoryview(mm) as view,  # released before the map closes
        ):
            headers = scan_batches(view, 0, head.active_pos)
            return max((h.max_timestamp for _, h in headers), default=-1)

    # -- recovery ---------------------------------------------------------------------
    def recover_locked(self) -> HeadState:
        """Rebuild the head from the segments (after a reboot, or a missing or torn head).

        Validates every batch of the active segment; stops at the first one that is torn,
        fails its checksum, or belongs to an uncommitted transaction. Truncates there only when
        nothing valid follows: corruption with valid data after it, or a whole batch whose
        offset does not follow the one before (the active segment is never compacted), raises
        :class:`CorruptLogError` and changes nothing. Rebuilds the active segment's index.
        Reads the segment in windows (see recovery.py): memory stays bounded whatever its size;
        costs one read of it to validate and one of its headers to rebuild the index.
        """
        with self._cache_lock:
            m = self._reload_manifest_locked()
        self._open_active_locked(m)
        active = m.active
        fd = self._wfd
        size = os.fstat(fd).st_size
        interval = self.config.index_interval_bytes
        try:
            found = valid_prefix(
                lambda n, at: os.pread(fd, n, at),
                size,
                active.base,
                interval,
                lambda p, h: self._acceptable(active, p, h),
            )
        except CorruptLogError as exc:  # a batch whose offset does not follow: see valid_prefix
            raise self._corrupt(active, exc.position or 0, str(exc)) from None
        pos = found.end
        if found.later is not None:
            raise self._corrupt(
                active,
                pos,
                f"invalid batch followed by valid data at byte {found.later}; refusing to truncate",
            )
        if pos < size:
            fs.ftruncate(fd, pos)
        self._wsize = pos
        fs.ftruncate(self._ifd, 0)
        for entries in index_entries(lambda n, at: os.pread(fd, n, at), pos, active.base, interval):
            fs.write(self._ifd, entries)
        next_offset = found.next_offset
        last_index = found.last_index_pos
        old = self._head.read()
        head = HeadState(
            seq=(old.seq + 1) if old else 1,
            next_offset=next_offset,
            start_offset=m.segments[0].base,
            active_base=active.base,
            active_pos=pos,
            layout_version=m.version,
            last_index_pos=last_index,
        )
        self.publish_locked(head)
        self._index.pop(active.name, None)
        return head

    def _acceptable(self, seg: SegmentInfo, pos: int, h: BatchHeader) -> bool:
        if h.base_offset < seg.base:
            return False
        return not (h.attributes & ATTR_TRANSACTIONAL) or self._committed(
            h.producer, self.topic, self.number, seg.base, pos + h.size
        )

    # -- maintenance helpers --------------------------------------------------------------
    def swap_locked(
        self,
        replaced: tuple[str, ...],
        new_segments: tuple[SegmentInfo, ...],
        clean_upto: int | None,
    ) -> bool:
        """Replace the contiguous segments named ``replaced`` by ``new_segments``.

        Atomic for readers: one manifest rename, then a head publish with the new layout
        version. Returns False (changing nothing) when the manifest no longer holds exactly
        those segments. Old files are unlinked; readers that have them open keep reading.
        """
        with self._cache_lock:
            m = self._reload_manifest_locked()
        names = [s.name for s in m.segments]
        if not replaced or replaced[0] not in names:
            return False
        i = names.index(replaced[0])
        if tuple(names[i : i + len(replaced)]) != replaced or i + len(replaced) >= len(names):
            return False  # changed meanwhile, or would replace the active segment
        segments = (*m.segments[:i], *new_segments, *m.segments[i + len(replaced) :])
        m2 = replace(
            m,
            version=m.version + 1,
            segments=segments,
            clean_upto=m.clean_upto if clean_upto is None else max(m.clean_upto, clean_upto),
            next_generation=m.next_generation + 1,
        )
        m2.save(self.dir, mode=self.settings.file_mode)
        head = self._head.read()
        if head is None or head.boot_id != BOOT_ID or m.active.base != head.active_base:
            head = self.recover_locked()
        self.publish_locked(
            head._replace(
                seq=head.seq + 1,
                layout_version=m2.version,
                start_offset=segments[0].base,
            )
        )
        with self._cache_lock:
            self._reload_manifest_locked()
        for name in replaced:
            for ext in (".log", ".index"):
                with contextlib.suppress(FileNotFoundError):
                    fs.unlink(os.path.join(self.dir, name + ext))
        fs.fsync_dir(self.dir)
        return True

    def remove_leftovers_locked(self) -> list[str]:
        """Delete segment files the manifest does not list (an interrupted swap's output).

        The live set comes from the manifest on disk, never a cached copy: another process or
        another log object on the same directory may have swapped segments since."""
        with self._cache_lock:
            live = {s.name for s in self._reload_manifest_locked().segments}
        removed = []
        for entry in os.listdir(self.dir):
            stem, dot, ext = entry.rpartition(".")
            if dot and ext in ("log", "index", "cleaning") and stem.split(".")[0] not in live:
                with contextlib.suppress(FileNotFoundError):
                    fs.unlink(os.path.join(self.dir, entry))
                removed.append(entry)
        return removed

    def close(self) -> None:
        """Release the partition's files; any use afterwards raises ClosedError. Reads under
        way finish first: the last of them releases the head and the read descriptors."""
        with self._tlock:
            self._close_writer()
            with self._cache_lock:
                self._closed = True
                if not self._readers:
                    self._release_locked()
            self._bell.close()
            if self._lock_fd >= 0:
                fs.close(self._lock_fd)
                self._lock_fd = -1
