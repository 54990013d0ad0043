"""Where the time of an update seen in another process goes, stage by stage: the profile behind
``bench_peers.py``'s visibility row, and what the same code costs when it runs cold.

Command (from the project root)::

    .venv/bin/python benchmarks/profile_visibility.py [--updates N] [--gap-ms MS] [--dir DIR]

1. **Stages.** As in ``bench_peers.py --only visibility``: a writer process (spawned) puts one
   key every 2 ms, its value carrying ``time.monotonic_ns()``; this process has the map open
   with a listener. Both ends also note the time at these points, on the one monotonic clock
   every process shares:

   - writer: *stamp*, before ``m.put``; *append*, when the put enters the partition's append
     (``Partition.append``); *published*, when that calls the compiled append, which takes
     the lock, writes the batch and the head, and rings the bell that wakes other processes
     (``kafkakv.log.embedded.bell``);
   - reader: *woken*, when ``poll`` on the inotify descriptor returns; *read*, when the
     follower's ``read_batch`` returns the record; *seen*, when the listener is called.

   Each stage is printed as p50 / p90 / p99 over the updates after the first 50. *Bare wake*
   is the same writer and reader with nothing in between: a ``pwrite`` of the stamp to a file,
   then the time at which the reader's ``poll`` on an inotify watch of that file returns.
   *Bare protocol* is the log's protocol at its barest, written straight in Python, stamp to
   callback: the writer, under a ``flock``, writes a record (CRC, length, key, value) and
   then a head (CRC, end position), each with one ``pwrite``; the reader, woken by inotify,
   reads the events, the head through ``mmap`` and its CRC, the new bytes with one ``pread``,
   checks each record's CRC, puts it in a dict and calls a function. No map, no futures, no layers: about 15 calls on
   the two sides, against kafkakv's 20 and 33 (``tests/map/test_visibility_path.py``).
   The wrappers that note the times cost well under a microsecond each.
2. **Cold and warm.** ``m.put`` in this process, split as above (before the append, the append,
   after it), back to back, then after each put 2 ms asleep, then 2 ms spinning in a loop.
   The updates come 2 ms apart in part 1 too: this shows what that gap costs the same code.

The last line printed is one JSON object with every number (microseconds).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import mmap
import multiprocessing as mp
import os
import select
import shutil
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from _common import lat, machine

import kafkakv
from kafkakv.log.embedded import partition as partition_module

GAP_S = 0.002  # between two updates of the writer, as in bench_peers
WARM = 50  # updates left out of the figures
_FRAME = struct.Struct("<II")  # the bare protocol's records and head: CRC, length of the rest
_PAIR = struct.Struct("<HI")  # a record's key and value lengths
_END = struct.Struct("<Q")  # the head's end position


def _note_appends(marks: list[int]) -> None:
    """Make every append to a partition note when it starts, when it calls the compiled append
    (which publishes the head and rings the bell that wakes other processes), and when it
    returns."""
    append, compiled = partition_module.Partition.append, partition_module.append_plain
    assert compiled is not None, "the C module is not built"

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        marks.append(time.monotonic_ns())
        try:
            return append(self, *args, **kwargs)
        finally:
            marks.append(time.monotonic_ns())

    def noted(*args: Any) -> Any:
        marks.append(time.monotonic_ns())
        return compiled(*args)

    partition_module.Partition.append = timed  # type: ignore[method-assign]
    partition_module.append_plain = noted  # before the log opens: partitions take it then


def _writer(path: str, n: int, out: str, gap: float) -> None:
    appends: list[int] = []
    _note_appends(appends)
    db = kafkakv.connect(path, background_cleaner=False)
    m = db.map("profile", value_codec="bytes", flush_period=5000)
    rows = []
    for _ in range(n):
        appends.clear()
        stamp = time.monotonic_ns()
        m.put("ping", str(stamp).encode())
        rows.append((stamp, *appends[:2]) if len(appends) == 3 else (stamp, 0, 0))
        time.sleep(gap)
    db.close()
    with open(out, "w") as f:
        json.dump(rows, f)


def _bare_writer(path: str, n: int, gap: float) -> None:
    fd = os.open(path, os.O_WRONLY)
    for _ in range(n):
        os.pwrite(fd, b"%020d" % time.monotonic_ns(), 0)
        time.sleep(gap)
    os.close(fd)


class _NotedPoll:
    """A ``select.poll`` that notes when a poll returns with events."""

    def __init__(self, real: Any, marks: list[int]) -> None:
        self.real, self.marks = real, marks

    def poll(self, *args: Any) -> Any:
        events = self.real.poll(*args)
        if events:
            self.marks.append(time.monotonic_ns())
        return events

    def register(self, *args: Any) -> None:
        self.real.register(*args)


def _first_after(marks: list[int], t: int) -> int | None:
    """The first mark at or after ``t`` (marks ascend)."""
    lo, hi = 0, len(marks)
    while lo < hi:
        mid = (lo + hi) // 2
        if marks[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return marks[lo] if lo < len(marks) else None


def stages(root: str, n: int, gap: float) -> dict[str, dict[str, float]]:
    path = os.path.join(root, "stages")
    db = kafkakv.connect(path, background_cleaner=False)
    m = db.map("profile", value_codec="bytes", flush_period=5000)
    woken: list[int] = []
    read: list[int] = []
    seen: dict[int, int] = {}
    notifier = db.log._notifier  # type: ignore[attr-defined]
    notifier._poller = _NotedPoll(notifier._poller, woken)
    read_batch = db.log.read_batch

    def noted_read(*args: Any, **kwargs: Any) -> Any:
        batch = read_batch(*args, **kwargs)
        if batch[0]:
            read.append(time.monotonic_ns())
        return batch

    db.log.read_batch = noted_read  # type: ignore[method-assign]
    done = threading.Event()

    def listener(k: Any, old: Any, new: Any, mine: bool) -> None:
        if new is not None and not mine:
            seen[int(new)] = time.monotonic_ns()
            if len(seen) >= n:
                done.set()

    m.add_listener(listener)
    time.sleep(0.2)
    out = os.path.join(root, "writer.json")
    proc = mp.get_context("spawn").Process(target=_writer, args=(path, n, out, gap))
    proc.start()
    done.wait(60 + n * 0.01)
    proc.join(60)
    db.close()
    with open(out) as f:
        rows = json.load(f)[WARM:]
    spans: dict[str, list[int]] = {
        k: [] for k in ("before append", "append", "wake", "read", "apply + listener", "total")
    }
    for stamp, entered, published in rows:
        at = seen.get(stamp)
        if at is None or not published:
            continue
        w, r = _first_after(woken, published), _first_after(read, published)
        if w is None or r is None or not published <= w <= r <= at:
            continue
        for name, span in zip(
            spans,
            (entered - stamp, published - entered, w - published, r - w, at - r, at - stamp),
            strict=True,
        ):
            spans[name].append(span)
    spans["bare wake"] = bare_wake(root, n, gap)
    spans["bare protocol"] = bare_protocol(root, n, gap)
    return {name: lat(values) for name, values in spans.items() if values}


def _inotify(path: str) -> tuple[int, Any]:
    """An inotify descriptor watching ``path``'s writes, and a ``poll`` object on it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    if fd < 0 or libc.inotify_add_watch(fd, os.fsencode(path), 0x2) < 0:  # IN_MODIFY
        raise OSError(ctypes.get_errno(), "inotify is not available here")
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return fd, poller


def bare_wake(root: str, n: int, gap: float) -> list[int]:
    path = os.path.join(root, "stamp")
    with open(path, "wb") as f:
        f.write(b"0" * 20)
    fd, poller = _inotify(path)
    stamp_fd = os.open(path, os.O_RDONLY)
    proc = mp.get_context("spawn").Process(target=_bare_writer, args=(path, n, gap))
    proc.start()
    spans = []
    try:
        while len(spans) < n and poller.poll(5000):
            woke = time.monotonic_ns()
            os.read(fd, 4096)
            spans.append(woke - int(os.pread(stamp_fd, 20, 0)))
    finally:
        proc.join(60)
        os.close(stamp_fd)
        os.close(fd)
    return spans[WARM:]


def _bare_protocol_writer(folder: str, n: int, gap: float) -> None:
    segment = os.open(os.path.join(folder, "segment"), os.O_WRONLY)
    head = os.open(os.path.join(folder, "head"), os.O_WRONLY)
    lock = os.open(os.path.join(folder, "lock"), os.O_RDWR)
    pos = 0
    for _ in range(n):
        value = b"%d" % time.monotonic_ns()
        body = _PAIR.pack(4, len(value)) + b"ping" + value
        record = _FRAME.pack(zlib.crc32(body), len(body)) + body
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.pwrite(segment, record, pos)
        pos += len(record)
        end = _END.pack(pos)
        os.pwrite(head, _FRAME.pack(zlib.crc32(end), len(end)) + end, 0)
        fcntl.flock(lock, fcntl.LOCK_UN)
        time.sleep(gap)
    for fd in (segment, head, lock):
        os.close(fd)


def bare_protocol(root: str, n: int, gap: float) -> list[int]:
    """Stamp to callback through the bare protocol (see the module docstring), in ns."""
    folder = os.path.join(root, "protocol")
    os.makedirs(folder)
    for name in ("segment", "lock"):
        open(os.path.join(folder, name), "wb").close()
    end = _END.pack(0)
    head_path = os.path.join(folder, "head")
    with open(head_path, "wb") as f:
        f.write(_FRAME.pack(zlib.crc32(end), len(end)) + end)
    fd, poller = _inotify(head_path)
    head_fd = os.open(head_path, os.O_RDONLY)
    head = mmap.mmap(head_fd, _FRAME.size + _END.size, mmap.MAP_SHARED, mmap.PROT_READ)
    segment = os.open(os.path.join(folder, "segment"), os.O_RDONLY)
    store: dict[bytes, bytes] = {}
    spans: list[int] = []

    def callback(key: bytes, value: bytes) -> None:
        spans.append(time.monotonic_ns() - int(value))

    pos = 0
    proc = mp.get_context("spawn").Process(target=_bare_protocol_writer, args=(folder, n, gap))
    proc.start()
    try:
        while len(spans) < n and poller.poll(5000):
            os.read(fd, 4096)
            raw = head[:]
            crc, _ = _FRAME.unpack_from(raw)
            if zlib.crc32(raw[_FRAME.size :]) != crc:
                continue  # a head write under way: its event comes next
            (end_pos,) = _END.unpack_from(raw, _FRAME.size)
            data = os.pread(segment, end_pos - pos, pos)
            at = 0
            while at < len(data):
                crc, size = _FRAME.unpack_from(data, at)
                body = data[at + _FRAME.size : at + _FRAME.size + size]
                if zlib.crc32(body) != crc:
                    raise AssertionError(f"the bare protocol's record at {pos + at} is damaged")
                klen, vlen = _PAIR.unpack_from(body)
                start = _PAIR.size + klen
                key, value = body[_PAIR.size : start], body[start : start + vlen]
                store[key] = value
                callback(key, value)
                at += _FRAME.size + size
            pos = end_pos
    finally:
        proc.join(60)
        head.close()
        for descriptor in (head_fd, segment, fd):
            os.close(descriptor)
    return spans[WARM:]


def cold(root: str, n: int) -> dict[str, dict[str, float]]:
    appends: list[int] = []
    _note_appends(appends)
    db = kafkakv.connect(os.path.join(root, "cold"), background_cleaner=False)
    m = db.map("profile", value_codec="bytes", flush_period=5000)

    def spin() -> None:
        end = time.perf_counter() + GAP_S
        while time.perf_counter() < end:
            pass

    modes: dict[str, Callable[[], None] | None] = {
        "back to back": None,
        "2 ms asleep": lambda: time.sleep(GAP_S),
        "2 ms spinning": spin,
    }
    out: dict[str, dict[str, float]] = {}
    try:
        for mode, pause in modes.items():
            parts: dict[str, list[int]] = {"before": [], "append": [], "after": [], "put": []}
            for i in range(n + WARM):
                appends.clear()
                start = time.monotonic_ns()
                m.put("ping", b"v" * 20)
                end = time.monotonic_ns()
                if i >= WARM and len(appends) >= 2:
                    parts["before"].append(appends[0] - start)
                    parts["append"].append(appends[-1] - appends[0])
                    parts["after"].append(end - appends[-1])
                    parts["put"].append(end - start)
                if pause is not None:
                    pause()
            out[mode] = {part: lat(values)["p50_us"] for part, values in parts.items()}
    finally:
        db.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--dir", default=None)
    parser.add_argument(
        "--gap-ms", type=float, default=GAP_S * 1e3, help="between two updates of part 1"
    )
    args = parser.parse_args()
    gap = args.gap_ms / 1e3
    n = max(args.updates, 2 * WARM)
    root = tempfile.mkdtemp(prefix="kafkakv-profile-", dir=args.dir)
    try:
        print(f"machine: {machine()}; load average (1 min) {os.getloadavg()[0]:.2f}")
        print(f"1. stages of {n - WARM} updates, one every {args.gap_ms:g} ms (us)")
        found = stages(root, n, gap)
        print(f"   {'stage':18s} {'p50':>8s} {'p90':>8s} {'p99':>8s}")
        for name, figures in found.items():
            print(
                f"   {name:18s} {figures['p50_us']:8.1f} {figures['p90_us']:8.1f} "
                f"{figures['p99_us']:8.1f}"
            )
        print("2. m.put in one process, p50 of each part (us)")
        warmth = cold(root, n)
        print(f"   {'':14s} {'before':>8s} {'append':>8s} {'after':>8s} {'put':>8s}")
        for mode, parts in warmth.items():
            print(
                f"   {mode:14s} {parts['before']:8.1f} {parts['append']:8.1f} "
                f"{parts['after']:8.1f} {parts['put']:8.1f}"
            )
        print(
            json.dumps(
                {
                    "machine": machine(),
                    "load_1m_end": os.getloadavg()[0],
                    "stages": found,
                    "cold": warmth,
                }
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
