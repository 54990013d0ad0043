"""The log cleaner: key-based compaction and time/size retention for one partition.

Compaction (``cleanup.policy`` includes ``compact``), after Kafka's design:

1. Only sealed segments are cleaned, and only up to the first segment holding a record younger
   than ``min.compaction.lag.ms``. The part already cleaned is the *clean* section; the rest
   up to that bound is the *dirty* section.
2. Scan the dirty section and map every key to the offset of its latest record there.
3. Copy the cleanable segments, in groups that fit ``segment.bytes``, into new segment files:
   a record survives unless the map holds a later offset for its key. Offsets never change;
   removed records leave gaps. A batch whose records all survive is copied byte for byte.
4. A tombstone survives its first cleaning; the batch is stamped with a delete horizon
   (now + ``delete.retention.ms``) and a later cleaning after that horizon drops it.
5. Swap each group in one atomic manifest replace (see Partition.swap_locked).

The cleaner works without the partition lock (sealed segments never change) and takes it only
for the swap, so appends continue meanwhile; ``clean.lock`` keeps two processes from cleaning
the same partition at once. Every lock wait ends at the caller's deadline with
:class:`~kafkakv.errors.LockTimeoutError`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from kafkakv.log.base import CleanResult
from kafkakv.log.embedded import fs
from kafkakv.log.embedded.flock import flock_until, unflock
from kafkakv.log.embedded.format import (
    INDEX_ENTRY,
    decode_rows,
    reencode_batch,
    scan_batches,
    verify_crc,
)
from kafkakv.log.embedded.manifest import Manifest, SegmentInfo, segment_name
from kafkakv.log.embedded.partition import Partition, now_ms

__all__ = [
    "CleanResult",
    "clean_partition",
    "dirty_ratio",
    "enforce_retention",
    "remove_leftovers",
]


@contextlib.contextmanager
def _clean_lock(part: Partition, *, block: bool, deadline: float) -> Iterator[bool]:
    """Hold ``clean.lock``: False at once when another cleaner has it and not ``block``,
    else wait for it until ``deadline``."""
    path = os.path.join(part.dir, "clean.lock")
    fd = fs.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, part.settings.file_mode)
    held = -1
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = fd
        except BlockingIOError:
            if not block:
                yield False
                return
            what = f"the cleaner lock of {part.topic}-{part.number}"
            held = flock_until(fd, path, deadline, what)
        yield True
    finally:
        if held >= 0:
            unflock(held, fd)
        fs.close(fd)


def remove_leftovers(part: Partition, *, timeout: float | None = None) -> list[str] | None:
    """Delete what an interrupted compaction left (segment files the manifest does not list),
    as the next cleaner pass would; return the names removed.

    None when another cleaner holds ``clean.lock``: the unlisted files are then its output in
    progress, not leftovers. Waits for the partition lock at most ``timeout`` seconds (None:
    ``lock_timeout``). Costs one directory listing and a manifest read.
    """
    deadline = _deadline(part, timeout)
    with _clean_lock(part, block=False, deadline=deadline) as got:
        if not got:
            return None
        with part.locked(deadline):
            return part.remove_leftovers_locked()


def _deadline(part: Partition, timeout: float | None) -> float:
    return time.monotonic() + (part.settings.lock_timeout if timeout is None else timeout)


def _cleanable(part: Partition, m: Manifest, now: int) -> tuple[SegmentInfo, ...]:
    """Sealed segments that may be cleaned: stop at the first one too young for the lag."""
    lag = part.config.min_compaction_lag_ms
    out = []
    for seg in m.sealed:
        if lag and (seg.max_ts if seg.max_ts is not None else now) > now - lag:
            break
        out.append(seg)
    return tuple(out)


def dirty_ratio(part: Partition, m: Manifest, now: int) -> float:
    """Dirty bytes over all bytes of the cleanable segments (0 when there are none)."""
    segs = _cleanable(part, m, now)
    total = sum(s.size or 0 for s in segs)
    dirty = sum(s.size or 0 for s in segs if s.base >= m.clean_upto)
    return dirty / total if total else 0.0


def _overdue(part: Partition, m: Manifest, now: int) -> bool:
    limit = part.config.max_compaction_lag_ms
    return any(
        s.base >= m.clean_upto and s.max_ts is not None and s.max_ts < now - limit
        for s in _cleanable(part, m, now)
    )


def _tombstones_due(part: Partition, m: Manifest, now: int) -> bool:
    return any(
        s.tombstone_horizon is not None and s.tombstone_horizon <= now
        for s in _cleanable(part, m, now)
    )


def _read_segment(part: Partition, seg: SegmentInfo) -> bytes:
    with open(os.path.join(part.dir, seg.name + ".log"), "rb") as f:
        return f.read(seg.size)


def clean_partition(
    part: Partition, *, force: bool, block: bool = False, timeout: float | None = None
) -> CleanResult | None:
    """Compact ``part`` if it is due (or ``force``); None when skipped.

    Without ``block``, skips when another process is cleaning the partition; with it, waits.
    Each wait for a lock ends ``timeout`` seconds (None: the log's ``lock_timeout``) after the
    call started, with :class:`~kafkakv.errors.LockTimeoutError`.

    Costs two passes over the cleanable segments (one over the dirty section to build the
    key map, one copying) and one manifest swap per group. Memory: one entry per distinct
    key of the dirty section.
    """
    deadline = _deadline(part, timeout)
    with _clean_lock(part, block=block, deadline=deadline) as got:
        if not got:
            return None
        with part.locked(deadline):
            part.remove_leftovers_locked()
            head = part.settled_locked()
        now = now_ms()
        m = part.manifest(head.layout_version)
        if not force and not (
            dirty_ratio(part, m, now) >= part.config.min_cleanable_dirty_ratio
            or _overdue(part, m, now)
            or _tombstones_due(part, m, now)
        ):
            return None
        segs = _cleanable(part, m, now)
        if not any(s.base >= m.clean_upto for s in segs) and not _tombstones_due(part, m, now):
            return None  # nothing dirty and no tombstone due: a copy would change nothing
        latest: dict[bytes | None, int] = {}
        for seg in segs:
            if seg.base < m.clean_upto:
                continue
            buf = _read_segment(part, seg)
            for pos, h in scan_batches(buf):
                base = h.base_offset
                for od, _td, key, _v, _h in decode_rows(buf, pos, h):
                    latest[key] = base + od
        groups = _groups(segs, part.config.segment_bytes)
        result = CleanResult()
        generation = m.next_generation
        for group in groups:
            out, rin, rout, bin_ = _copy_group(part, group, latest, now, generation)
            generation += 1
            swapped = False
            # The copy may take long: the swap gets a full timeout of its own.
            with part.locked(_deadline(part, timeout)):
                upto = _next_base(m, group[-1])
                swapped = part.swap_locked(tuple(s.name for s in group), (out,), upto)
            if not swapped:
                for ext in (".log", ".index"):
                    with contextlib.suppress(FileNotFoundError):
                        fs.unlink(os.path.join(part.dir, out.name + ext))
                return result
            result = CleanResult(
                result.segments_in + len(group),
                result.segments_out + 1,
                result.bytes_in + bin_,
                result.bytes_out + (out.size or 0),
                result.records_in + rin,
                result.records_out + rout,
            )
        return result


def _next_base(m: Manifest, seg: SegmentInfo) -> int:
    bases = [s.base for s in m.segments]
    return bases[bases.index(seg.base) + 1]


def _groups(segs: tuple[SegmentInfo, ...], limit: int) -> list[tuple[SegmentInfo, ...]]:
    """Consecutive segments whose combined size fits one segment (at least one per group)."""
    groups: list[tuple[SegmentInfo, ...]] = []
    current: list[SegmentInfo] = []
    size = 0
    for seg in segs:
        if current and (size + (seg.size or 0) > limit or seg.base - current[0].base > 2**31 - 1):
            groups.append(tuple(current))
            current, size = [], 0
        current.append(seg)
        size += seg.size or 0
    if current:
        groups.append(tuple(current))
    return groups


def _copy_group(
    part: Partition,
    group: tuple[SegmentInfo, ...],
    latest: dict[bytes | None, int],
    now: int,
    generation: int,
) -> tuple[SegmentInfo, int, int, int]:
    """Write the cleaned copy of ``group``; return it with records in/out and bytes in."""
    first = group[0]
    name = segment_name(first.base, generation)
    base_path = os.path.join(part.dir, name)
    horizon_ms = part.config.delete_retention_ms
    interval = part.config.index_interval_bytes
    records_in = records_out = bytes_in = 0
    out_pos = last_index = 0
    earliest_horizon: int | None = None
    chunks: list[bytes] = []
    index: list[bytes] = []
    for seg in group:
        buf = _read_segment(part, seg)
        bytes_in += len(buf)
        view = memoryview(buf)
        for pos, h in scan_batches(buf):
            if not verify_crc(buf, pos, h):
                raise part._corrupt(seg, pos, "batch checksum mismatch while cleaning")
            rows = decode_rows(buf, pos, h)
            records_in += len(rows)
            base = h.base_offset
            expired = h.delete_horizon_ms >= 0 and h.delete_horizon_ms <= now
            kept = [
                row
                for row in rows
                if latest.get(row[2], -1) <= base + row[0] and not (expired and row[3] is None)
            ]
            if not kept:
                continue
            # A batch's horizon exists only while it holds tombstones; first kept → stamp it.
            if any(row[3] is None for row in kept):
                horizon = h.delete_horizon_ms if h.delete_horizon_ms >= 0 else now + horizon_ms
            else:
                horizon = -1
            if horizon >= 0 and (earliest_horizon is None or horizon < earliest_horizon):
                earliest_horizon = horizon
            if len(kept) == len(rows) and horizon == h.delete_horizon_ms:
                batch: bytes | memoryview = view[pos : pos + h.size]
            else:
                batch = reencode_batch(h, kept, horizon)
            if out_pos > 0 and out_pos - last_index >= interval:
                index.append(INDEX_ENTRY.pack(base - first.base, out_pos))
                last_index = out_pos
            chunks.append(bytes(batch))
            out_pos += len(batch)
            records_out += len(kept)
    for ext, data in ((".log", chunks), (".index", index)):  # synced: a swap will name them
        fs.write_file(base_path + ext, data, part.settings.file_mode, sync=True)
    max_ts = max((s.max_ts for s in group if s.max_ts is not None), default=None)
    out = SegmentInfo(
        base=first.base,
        name=name,
        created_ms=min(s.created_ms for s in group),
        size=out_pos,
        max_ts=max_ts,
        tombstone_horizon=earliest_horizon,
    )
    return out, records_in, records_out, bytes_in


def enforce_retention(part: Partition, *, timeout: float | None = None) -> int:
    """Drop the oldest sealed segments past ``retention.bytes`` or ``retention.ms``.

    Returns how many segments were removed. The active segment is never removed. Waits for
    the partition lock at most ``timeout`` seconds (None: the log's ``lock_timeout``).
    """
    cfg = part.config
    if not cfg.delete or (cfg.retention_bytes < 0 and cfg.retention_ms < 0):
        return 0
    with part.locked(_deadline(part, timeout)):
        head = part.settled_locked()
        m = part.manifest(head.layout_version)
        total = sum(s.size or 0 for s in m.sealed) + head.active_pos
        now = now_ms()
        drop: list[str] = []
        for seg in m.sealed:
            size = seg.size or 0
            by_size = cfg.retention_bytes >= 0 and total - size >= cfg.retention_bytes
            by_time = (
                cfg.retention_ms >= 0
                and seg.max_ts is not None
                and seg.max_ts < now - cfg.retention_ms
            )
            if not (by_size or by_time):
                break
            drop.append(seg.name)
            total -= size
        if drop and part.swap_locked(tuple(drop), (), None):
            return len(drop)
        return 0
