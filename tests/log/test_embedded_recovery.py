"""Recovery of an active segment in bounded memory (recovery.py), against the whole-buffer scan."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv.errors import CorruptLogError
from kafkakv.log import EmbeddedLog, Record
from kafkakv.log.embedded import format as fmt
from kafkakv.log.embedded.head import HeadFile
from kafkakv.log.embedded.recovery import index_entries, valid_prefix

BASE = 1000


def _batches(sizes: list[int]) -> bytes:
    out = []
    offset = BASE
    for i, n in enumerate(sizes):
        count = 1 + i % 3
        out.append(
            fmt.encode_batch(
                offset,
                bytes([i % 251]) * n,
                record_count=count,
                last_offset_delta=count - 1,
                base_timestamp=i,
                max_timestamp=i,
            )
        )
        offset += count
    return b"".join(out)


def _accept(pos: int, h: fmt.BatchHeader) -> bool:
    return h.base_offset >= BASE


def _whole_buffer_recovery(
    buf: bytes, interval: int, base: int = BASE
) -> tuple[int, int, int, int | None, bytes]:
    """What recovery computed before it streamed: every check over the whole segment in memory,
    and a valid batch whose offset does not follow the one before refused (the CRC does not
    cover it)."""

    def accept(pos: int, h: fmt.BatchHeader) -> bool:
        return h.base_offset >= base

    pos = 0
    next_offset = base
    entries = []
    last_index = 0
    while True:
        h = fmt.valid_batch_at(buf, pos)
        if h is None or not accept(pos, h):
            break
        if h.base_offset != next_offset:
            raise CorruptLogError(f"batch at offset {h.base_offset}, expected {next_offset}")
        if pos > 0 and pos - last_index >= interval:
            entries.append(fmt.INDEX_ENTRY.pack(h.base_offset - base, pos))
            last_index = pos
        next_offset = h.last_offset + 1
        pos += h.size
    later = fmt.next_valid_batch(buf, pos + 1, accept) if pos < len(buf) else None
    return pos, next_offset, last_index, later, b"".join(entries)


def _streamed_recovery(
    buf: bytes, interval: int, window: int
) -> tuple[int, int, int, int | None, bytes]:
    def read(n: int, at: int) -> bytes:
        assert n <= window
        return buf[at : at + n]

    found = valid_prefix(read, len(buf), BASE, interval, _accept, window)
    index = b"".join(index_entries(read, found.end, BASE, interval, window))
    return found.end, found.next_offset, found.last_index_pos, found.later, index


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 700), max_size=12),
    window=st.integers(fmt.HEADER_SIZE, 1500),
    interval=st.integers(1, 1500),
    damage=st.one_of(
        st.none(),
        st.tuples(st.just("cut"), st.integers(0, 10_000)),
        st.tuples(st.just("flip"), st.integers(0, 10_000)),
        st.tuples(st.just("garbage"), st.binary(max_size=300)),
    ),
)
def test_streamed_recovery_finds_what_the_whole_buffer_scan_finds(
    sizes: list[int],
    window: int,
    interval: int,
    damage: tuple[str, object] | None,
) -> None:
    buf = _batches(sizes)
    if damage is not None and buf:
        kind, arg = damage
        if kind == "cut":
            assert isinstance(arg, int)
            buf = buf[: arg % len(buf)]
        elif kind == "flip":
            assert isinstance(arg, int)
            at = arg % len(buf)
            buf = buf[:at] + bytes([buf[at] ^ 0x40]) + buf[at + 1 :]
        else:
            assert isinstance(arg, bytes)
            buf += arg
    assert _outcome(_streamed_recovery, buf, interval, window) == _outcome(
        _whole_buffer_recovery, buf, interval
    )


def _outcome(recover: Callable[..., object], *args: object) -> object:
    """What ``recover`` returns, or the type of what it raises. (A flipped bit in a base offset,
    which the CRC does not cover, can make an index entry overflow: both raise then.)"""
    try:
        return recover(*args)
    except Exception as exc:
        return type(exc)


def test_a_valid_batch_after_damage_is_found_across_windows() -> None:
    buf = _batches([300, 5000, 40])
    first = fmt.valid_batch_at(buf, 0)
    assert first is not None
    damaged = buf[: first.size + 20] + b"\xff" + buf[first.size + 21 :]
    for window in (fmt.HEADER_SIZE, 100, 4096, 1 << 20):
        got = _streamed_recovery(damaged, 64, window)
        assert got == _whole_buffer_recovery(damaged, 64)
        assert got[3] == first.size + 5056  # the third batch


def test_recovering_a_large_torn_segment_keeps_memory_bounded(tmp_path: Path) -> None:
    """A 64 MiB active segment with a torn tail: the reference result, in under 4 MiB."""
    value = os.urandom(4000)
    with EmbeddedLog(tmp_path, fsync="never", background_cleaner=False) as log:
        log.create_topic("t", 1, {"segment.bytes": 256 << 20})
        batch = [Record(b"k%d" % i, value) for i in range(16)]  # about 64 KiB a batch
        while os.path.getsize(tmp_path / "topics/t/0/00000000000000000000-0.log") < 64 << 20:
            log.append("t", 0, batch)
        end = log.end_offset("t", 0)
    pdir = tmp_path / "topics" / "t" / "0"
    segment = pdir / "00000000000000000000-0.log"
    index = pdir / "00000000000000000000-0.index"
    with open(segment, "r+b") as f:  # tear the last batch
        f.truncate(segment.stat().st_size - 1000)
    interval = 4096
    before = segment.read_bytes()
    expected = _whole_buffer_recovery(before, interval, base=0)
    assert expected[3] is None  # a torn tail, nothing valid after it
    del before
    hf = HeadFile(str(pdir / "head"))  # as if written before the machine restarted
    state = hf.read()
    assert state is not None
    hf.publish(state._replace(boot_id=b"\x01" * 16))
    hf.close()

    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        tracemalloc.start()
        try:
            recovered = log.end_offset("t", 0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 4 << 20
        assert recovered == end - 16 == expected[1]
        assert segment.stat().st_size == expected[0]
        assert index.read_bytes() == expected[4]
        head = log._partition("t", 0)._head.read()
        assert head is not None
        assert (head.active_pos, head.last_index_pos) == (expected[0], expected[2])
        assert log.read("t", 0, recovered - 1)[0].value == value
        assert log.check() == []
