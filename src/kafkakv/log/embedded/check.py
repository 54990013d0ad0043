"""Verification of a partition's files: every problem found, not just the first.

First finishes what recovery finishes anyway, so neither is reported: an interrupted roll (as
the next writer would) and the leftover files of an interrupted compaction (as the next cleaner
would). Then checks the manifest against the files, every batch (framing, checksum, offsets
ascending and inside the segment's range), every index entry (ascending, pointing at a batch
boundary whose offset it names), and the published head against the active segment. After a corrupt batch
the scan searches forward for the next valid batch and goes on from there, so the data after
a damaged spot is still checked and reported on.
"""

from __future__ import annotations

import os

from kafkakv.errors import CorruptLogError, LockTimeoutError
from kafkakv.log.base import Problem
from kafkakv.log.embedded.cleaner import remove_leftovers
from kafkakv.log.embedded.format import INDEX_ENTRY, next_valid_batch, valid_batch_at
from kafkakv.log.embedded.manifest import Manifest
from kafkakv.log.embedded.partition import Partition

__all__ = ["check_partition"]


def check_partition(part: Partition) -> list[Problem]:
    problems: list[Problem] = []

    def report(where: str, message: str) -> None:
        problems.append(Problem(part.topic, part.number, where, message))

    try:
        part.settle()  # finishes an interrupted roll first, as the next writer would
    except LockTimeoutError:
        raise  # a writer holds the lock: not a fault of the files (LockTimeoutError is an OSError)
    except (OSError, CorruptLogError) as exc:
        report("head", f"cannot be recovered: {exc}")
    # What an interrupted compaction left is removed, as the next cleaner pass would: no
    # corruption. While another cleaner works, its unlisted output is not looked at.
    leftovers_removed = None
    try:
        leftovers_removed = remove_leftovers(part)
    except LockTimeoutError:
        raise
    except CorruptLogError:
        pass  # an unreadable manifest: reported below
    except OSError as exc:
        report(part.dir, f"cannot remove the leftovers of a compaction: {exc}")
    try:
        m = Manifest.load(part.dir)
    except (OSError, CorruptLogError) as exc:
        report("manifest.json", f"unreadable: {exc}")
        return problems
    head = part._head.read()
    if head is None:
        report("head", "missing or torn head record")
    elif head.active_base != m.active.base:
        report("head", f"active segment {head.active_base} but manifest says {m.active.base}")
    listed = {s.name for s in m.segments}
    for entry in sorted(os.listdir(part.dir)) if leftovers_removed is not None else ():
        stem, _, ext = entry.rpartition(".")
        # An empty unlisted file is what a writer killed during a roll leaves: not a problem.
        if (
            ext in ("log", "index")
            and stem not in listed
            and os.path.getsize(os.path.join(part.dir, entry)) > 0
        ):
            report(entry, "segment file not listed in the manifest, and not removable")
    previous_last = -1
    for i, seg in enumerate(m.segments):
        is_active = i == len(m.segments) - 1
        limit = m.segments[i + 1].base if not is_active else None
        path = os.path.join(part.dir, seg.name + ".log")
        try:
            with open(path, "rb") as f:
                buf = f.read()
        except OSError as exc:
            report(seg.name + ".log", f"cannot read: {exc}")
            continue
        if is_active and head is not None and head.active_base == seg.base:
            if len(buf) < head.active_pos:
                report(seg.name + ".log", f"{len(buf)} bytes but {head.active_pos} published")
            buf = buf[: head.active_pos]
        elif seg.size is not None and len(buf) != seg.size:
            report(seg.name + ".log", f"{len(buf)} bytes but the manifest says {seg.size}")
            buf = buf[: seg.size]
        starts: dict[int, int] = {}
        pos = 0
        last_in_seg = None
        while pos < len(buf):
            h = valid_batch_at(buf, pos)
            if h is None:
                report(f"{seg.name}.log@{pos}", "corrupt or torn batch (framing or checksum)")
                nxt = next_valid_batch(buf, pos + 1)
                if nxt is None:
                    break
                report(
                    f"{seg.name}.log@{pos}",
                    f"{nxt - pos} bytes skipped; valid data resumes at {nxt}",
                )
                pos = nxt
                continue
            if h.base_offset <= previous_last:
                report(f"{seg.name}.log@{pos}", f"offset {h.base_offset} not above {previous_last}")
            if h.base_offset < seg.base or (limit is not None and h.last_offset >= limit):
                report(
                    f"{seg.name}.log@{pos}",
                    f"offsets {h.base_offset}..{h.last_offset} outside the segment",
                )
            starts[pos] = h.base_offset
            previous_last = max(previous_last, h.last_offset)
            last_in_seg = h.last_offset
            pos += h.size
        if is_active and head is not None and head.active_base == seg.base:
            expected = seg.base if last_in_seg is None else last_in_seg + 1
            if head.next_offset != expected:
                report("head", f"next offset {head.next_offset} but the data ends at {expected}")
        try:
            with open(os.path.join(part.dir, seg.name + ".index"), "rb") as f:
                raw = f.read()
        except OSError as exc:
            report(seg.name + ".index", f"cannot read: {exc}")
            continue
        prev = -1
        for k, (rel, ipos) in enumerate(INDEX_ENTRY.iter_unpack(raw[: len(raw) - len(raw) % 8])):
            if is_active and head is not None and ipos >= head.active_pos:
                break  # unpublished tail
            if ipos <= prev:
                report(f"{seg.name}.index#{k}", "entries not ascending")
            if starts.get(ipos) != seg.base + rel:
                report(
                    f"{seg.name}.index#{k}", f"entry ({rel}, {ipos}) does not point at its batch"
                )
            prev = ipos
    return problems
