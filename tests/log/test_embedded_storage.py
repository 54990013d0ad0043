"""Storage behaviour particular to the embedded log: files, index, compaction, recovery."""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

import kafkakv
from kafkakv.errors import (
    ConfigError,
    CorruptLogError,
    LockTimeoutError,
    NotALogError,
    OffsetOutOfRangeError,
)
from kafkakv.log import EmbeddedLog, MemoryLog, Record
from kafkakv.log.embedded import format as fmt
from kafkakv.log.embedded import frame, partition
from kafkakv.log.embedded.format import HEADER_SIZE
from tests.records import offset_of
from tests.waiting import wait_for


def open_log(path: Path, **kw: object) -> EmbeddedLog:
    kw.setdefault("background_cleaner", False)
    return EmbeddedLog(path, **kw)  # type: ignore[arg-type]


def segment_files(path: Path, topic: str, partition: int = 0) -> list[str]:
    return sorted(glob.glob(str(path / "topics" / topic / str(partition) / "*.log")))


def latest_by_key(records: list[Record]) -> dict[bytes | None, Record]:
    out: dict[bytes | None, Record] = {}
    for r in records:
        out[r.key] = r
    return out


def read_all(log: EmbeddedLog, topic: str, partition: int = 0) -> list[Record]:
    return log.read(
        topic, partition, log.start_offset(topic, partition), max_records=10**7, max_bytes=1 << 40
    )


# -- directories --------------------------------------------------------------------------
def test_an_end_mark_shows_the_end_offset_until_an_append_rewrites_its_bytes(
    tmp_path: Path,
) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"k", b"1")])
        mark = log.end_mark("t", 0)
        assert mark is not None and mark.end == log.end_offset("t", 0) == 1
        assert mark.mapping[: len(mark.raw)] == mark.raw
        assert log.end_mark("t", 0) == mark  # nothing appended: the same bytes
        with open_log(tmp_path) as other:  # another handle on the log, as another process
            other.append("t", 0, [Record(b"k", b"2")])
        assert mark.mapping[: len(mark.raw)] != mark.raw  # seen through the shared mapping
        again = log.end_mark("t", 0)
        assert again is not None and again.end == 2
        assert again.mapping[: len(again.raw)] == again.raw
    with pytest.raises(ValueError):  # closed with the log: nobody reads a stale mapping
        mark.mapping[:1]
    with MemoryLog() as memory:  # no shared mapping: no mark
        memory.create_topic("t", 1)
        assert memory.end_mark("t", 0) is None


def test_a_directory_that_is_not_a_log_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NotALogError, match="not a kafkakv log"):
        EmbeddedLog(tmp_path)
    target = tmp_path / "a-file"
    target.write_text("x")
    with pytest.raises(NotALogError):
        EmbeddedLog(target)


def test_a_path_with_a_nul_byte_is_a_config_error_naming_it(tmp_path: Path) -> None:
    for path in (f"{tmp_path}/a\0b", Path(f"{tmp_path}/a\0b")):
        with pytest.raises(ConfigError, match=r"NUL byte: .*a\\x00b"):
            EmbeddedLog(path, background_cleaner=False)
    assert os.listdir(tmp_path) == []


def test_a_temporary_marker_left_by_a_killed_creator_does_not_stop_creation(
    tmp_path: Path,
) -> None:
    (tmp_path / "kafkakv-log.json.tmp.4242").write_text('{"format": 1}')
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("t")
    assert (tmp_path / "kafkakv-log.json").exists()


def test_reopen_sees_everything(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 2, {"segment.bytes": 4096})
        for i in range(300):
            log.append("t", i % 2, [Record(b"k%d" % i, b"v%d" % i)])
    with open_log(tmp_path) as log:
        assert log.topics() == ["t"]
        assert log.end_offset("t", 0) == 150
        assert [r.value for r in read_all(log, "t", 1)][-1] == b"v299"
        assert log.check() == []


# -- segments and the sparse index ---------------------------------------------------------
def test_segments_roll_and_the_index_avoids_scanning(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1, {"segment.bytes": 64 * 1024, "index.interval.bytes": 1024})
        for i in range(2000):
            log.append("t", 0, [Record(b"key-%05d" % i, b"x" * 100)])
        assert len(segment_files(tmp_path, "t")) > 3
        part = log._partition("t", 0)
        head = part.published()
        seg = part.manifest().active
        target = head.next_offset - 3
        # The index sends a read near the end of the active segment close to its batch,
        # not to the start of the segment.
        pos = part._position_for(seg, target, head.active_pos).position
        assert head.active_pos - pos < 2 * 1024 + 200
        assert [r.offset for r in log.read("t", 0, target)] == [target, target + 1, target + 2]
        # Every offset can be read from, in every segment.
        for off in range(0, 2000, 37):
            assert log.read("t", 0, off, max_records=1)[0].offset == off
        assert log.check() == []


def test_segment_ms_rolls_an_old_segment(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1, {"segment.ms": 50})
        log.append("t", 0, [Record(b"a", b"1")])
        time.sleep(0.08)
        log.append("t", 0, [Record(b"b", b"2")])
        assert len(segment_files(tmp_path, "t")) == 2
        assert [r.value for r in read_all(log, "t")] == [b"1", b"2"]


# -- compaction ----------------------------------------------------------------------------
def fill_compacted(
    log: EmbeddedLog, topic: str, n: int, keys: int, **config: object
) -> list[Record]:
    cfg = {"cleanup.policy": "compact", "segment.bytes": 4096, "min.cleanable.dirty.ratio": 0.01}
    cfg.update({k.replace("_", "."): v for k, v in config.items()})
    log.create_topic(topic, 1, cfg)
    for i in range(n):
        log.append(topic, 0, [Record(b"key-%d" % (i % keys), b"value-%d" % i)])
    return read_all(log, topic)


def test_compaction_keeps_the_latest_record_of_each_key_at_its_offset(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        before = fill_compacted(log, "c", 600, 20)
        part = log._partition("c", 0)
        active_name = part.manifest().active.name
        active_before = [r for r in before if offset_of(r) >= part.manifest().active.base]
        size_before = sum(os.path.getsize(f) for f in segment_files(tmp_path, "c"))
        (result,) = log.compact("c")
        after = read_all(log, "c")
        assert result.records_out < result.records_in
        assert sum(os.path.getsize(f) for f in segment_files(tmp_path, "c")) < size_before / 3
        # Every surviving record is an original record at its original offset.
        by_offset = {r.offset: r for r in before}
        assert all(by_offset[r.offset] == r for r in after)
        # The latest value of every key survived.
        assert latest_by_key(after) == latest_by_key(before)
        # Offsets never change and keep increasing; gaps appear.
        offsets = [offset_of(r) for r in after]
        assert offsets == sorted(offsets) and len(offsets) < len(before)
        # The active segment is never compacted: all its records are still there.
        assert part.manifest().active.name == active_name
        assert [r for r in after if offset_of(r) >= part.manifest().active.base] == active_before
        assert log.end_offset("c", 0) == 600
        assert log.check() == []
        # Appending after a compaction continues the offsets.
        assert log.append("c", 0, [Record(b"key-0", b"new")]) == 600


def test_min_compaction_lag_protects_young_records(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        before = fill_compacted(log, "c", 300, 5, min_compaction_lag_ms=3_600_000)
        (result,) = log.compact("c")
        assert result.records_in == 0
        assert read_all(log, "c") == before


def test_tombstones_survive_until_delete_retention_passes(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic(
            "c",
            1,
            {
                "cleanup.policy": "compact",
                "segment.bytes": 2048,
                "min.cleanable.dirty.ratio": 0.01,
                "delete.retention.ms": 300,
            },
        )
        log.append("c", 0, [Record(b"gone", b"v1")])
        log.append("c", 0, [Record(b"gone", None)])
        for i in range(200):  # push the tombstone out of the active segment
            log.append("c", 0, [Record(b"other-%d" % (i % 3), b"x" * 20)])
        log.compact("c")
        keys = latest_by_key(read_all(log, "c"))
        assert keys[b"gone"].value is None  # the tombstone is still there: readers must see it
        assert [r.value for r in read_all(log, "c") if r.key == b"gone"] == [None]
        time.sleep(0.4)
        log.compact("c")
        assert b"gone" not in latest_by_key(read_all(log, "c"))
        assert log.check() == []


def test_background_cleaner_compacts_when_the_dirty_ratio_passes(tmp_path: Path) -> None:
    with open_log(tmp_path, background_cleaner=True, cleaner_interval_s=0.05) as log:
        fill_compacted(log, "c", 500, 5, min_cleanable_dirty_ratio=0.5)
        wait_for(lambda: len(read_all(log, "c")) <= 200, 10, "a compaction", interval=0.05)
        assert log.background_errors == []


def test_a_lock_a_writer_holds_for_a_while_delays_the_background_cleaner_without_error(
    tmp_path: Path,
) -> None:
    """A writer of this process holds the partition's lock for many cleaner rounds, far below
    lock_timeout: the cleaner cleans once it is free and reports nothing (under load, a busy
    writer's lock was reported round after round as LockTimeoutError, in a fresh-clone run).
    Out of reach for lock_timeout, it is reported."""
    with open_log(tmp_path, background_cleaner=True, cleaner_interval_s=0.05) as log:
        fill_compacted(log, "c", 500, 5, min_cleanable_dirty_ratio=0.5)
        with log._partition("c", 0).locked():
            time.sleep(0.5)  # ten cleaner rounds that find the lock taken
        wait_for(lambda: len(read_all(log, "c")) <= 200, 10, "a compaction", interval=0.05)
        assert log.background_errors == []
    with open_log(
        tmp_path / "held", background_cleaner=True, cleaner_interval_s=0.05, lock_timeout=0.2
    ) as log:
        fill_compacted(log, "c", 500, 5, min_cleanable_dirty_ratio=0.5)
        with log._partition("c", 0).locked():
            wait_for(lambda: log.background_errors, 10, "the lock reported", interval=0.05)
        assert all(isinstance(e, LockTimeoutError) for e in log.background_errors)


def test_compact_refuses_a_delete_policy_topic(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("d", 1)
        with pytest.raises(ValueError, match="not compacted"):
            log.compact("d")


# -- retention -------------------------------------------------------------------------------
def test_retention_bytes_drops_oldest_segments_and_moves_the_start(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("d", 1, {"segment.bytes": 2048, "retention.bytes": 6000})
        for i in range(400):
            log.append("d", 0, [Record(None, b"%05d" % i + b"y" * 30)])
        removed = log.enforce_retention("d")
        assert removed > 0
        start = log.start_offset("d", 0)
        assert start > 0
        kept = read_all(log, "d")
        assert kept[0].offset == start and kept[-1].offset == 399
        total = sum(os.path.getsize(f) for f in segment_files(tmp_path, "d"))
        assert total < 6000 + 2048 + 200
        with pytest.raises(OffsetOutOfRangeError):
            log.read("d", 0, 0)
        assert log.check() == []


def test_retention_ms_drops_old_segments_only(tmp_path: Path) -> None:
    # The old records are 10 s past, 5 s beyond retention.ms; the new ones stay inside it
    # however slowly a loaded machine appends them (with 200 ms, a first segment of new
    # records could age past it before enforce_retention ran).
    with open_log(tmp_path) as log:
        log.create_topic("d", 1, {"segment.bytes": 2048, "retention.ms": 5_000})
        old = int(time.time() * 1000) - 10_000
        for _i in range(100):
            log.append("d", 0, [Record(None, b"z" * 40, timestamp=old)])
        for _i in range(100):
            log.append("d", 0, [Record(None, b"n" * 40)])
        log.enforce_retention("d")
        kept = read_all(log, "d")
        assert all(r.value == b"n" * 40 for r in kept[-100:])
        assert log.start_offset("d", 0) > 0
        assert len(kept) >= 100


# -- crash recovery and corruption ------------------------------------------------------------
def test_a_torn_tail_is_truncated_by_the_next_writer(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"a", b"1")])
        log.append("t", 0, [Record(b"b", b"2")])
    (seg,) = segment_files(tmp_path, "t")
    size = os.path.getsize(seg)
    with open(seg, "ab") as f:  # half a batch, as if the writer died during its write
        f.write(b"\x02" + b"\x00" * 30)
    with open_log(tmp_path) as log:
        assert [r.value for r in read_all(log, "t")] == [b"1", b"2"]  # never past the head
        assert log.append("t", 0, [Record(b"c", b"3")]) == 2
        assert [r.value for r in read_all(log, "t")] == [b"1", b"2", b"3"]
        assert os.path.getsize(seg) > size
        assert log.check() == []


def test_a_lost_head_is_rebuilt_from_the_segment(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1, {"index.interval.bytes": 64})
        for i in range(50):
            log.append("t", 0, [Record(b"k", b"%d" % i)])
    (seg,) = segment_files(tmp_path, "t")
    whole = os.path.getsize(seg)
    with open(seg, "r+b") as f:  # the last batch torn by a power loss
        f.truncate(whole - 5)
    head = tmp_path / "topics" / "t" / "0" / "head"
    head.write_bytes(b"\x00" * 10)  # and the head record lost
    with open_log(tmp_path) as log:
        got = read_all(log, "t")
        assert [r.value for r in got] == [b"%d" % i for i in range(49)]
        assert log.end_offset("t", 0) == 49
        assert log.check() == []
        assert log.append("t", 0, [Record(b"k", b"again")]) == 49


def test_corruption_in_the_middle_is_reported_and_never_drops_later_data(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        for i in range(30):
            log.append("t", 0, [Record(b"k%d" % i, b"value-%d" % i * 5)])
        sizes = [len(r.value or b"") for r in read_all(log, "t")]
    assert len(sizes) == 30
    (seg,) = segment_files(tmp_path, "t")
    data = bytearray(Path(seg).read_bytes())
    batch = len(data) // 30
    spot = 10 * batch + HEADER_SIZE + 5  # inside the 11th batch's records
    data[spot] ^= 0xFF
    Path(seg).write_bytes(bytes(data))
    with open_log(tmp_path) as log:
        problems = log.check()
        assert problems and "checksum" in str(problems[0])
        assert any("valid data resumes" in str(p) for p in problems)
        assert [r.value for r in log.read("t", 0, 0, max_records=10)][-1] == b"value-9" * 5
        with pytest.raises(CorruptLogError) as info:
            log.read("t", 0, 10)
        assert info.value.position is not None
        with pytest.raises(CorruptLogError):  # a loader's read checks every batch as well
            log.read_latest("t", 0, 0, max_records=100)
        # Reading past the damaged batch still works, and appends keep everything.
        assert log.read("t", 0, 11)[0].value == b"value-11" * 5
        assert log.append("t", 0, [Record(b"k", b"after")]) == 30
        assert log.end_offset("t", 0) == 31


def test_a_batch_whose_records_do_not_decode_is_reported_where_it_is(tmp_path: Path) -> None:
    """A batch with a sound checksum whose records are not rows (a writer's bug, not a torn
    write): every read says which file and byte, as for a checksum mismatch."""
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"a", b"1")])
        log.append("t", 0, [Record(b"k", b"ab")])
    (seg,) = segment_files(tmp_path, "t")
    data = Path(seg).read_bytes()
    start = len(data) - len(frame.pack_rows([(0, 0, b"k", b"ab", None)])) - HEADER_SIZE
    header = fmt.parse_header(data, start)
    body = data[start + HEADER_SIZE :].replace(b"\xc4\x02ab", b"\xa3abc")  # value: a str
    batch = fmt.encode_batch(
        header.base_offset,
        body,
        record_count=1,
        last_offset_delta=0,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
    )
    assert len(batch) == header.size
    Path(seg).write_bytes(data[:start] + batch)
    with open_log(tmp_path) as log:
        for read in (log.read, log.read_entries, log.read_latest):
            with pytest.raises(CorruptLogError, match="undecodable records") as info:
                read("t", 0, 0)
            assert (info.value.path, info.value.position) == (seg, start)
            assert seg in str(info.value)
        assert log.read_latest("t", 0, 0, max_records=1).values == {b"a": b"1"}


def test_head_rebuild_refuses_to_truncate_valid_data_after_corruption(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        for _i in range(10):
            log.append("t", 0, [Record(b"k", b"v" * 50)])
    (seg,) = segment_files(tmp_path, "t")
    data = bytearray(Path(seg).read_bytes())
    data[HEADER_SIZE + 3] ^= 0xFF  # damage the first batch
    Path(seg).write_bytes(bytes(data))
    (tmp_path / "topics" / "t" / "0" / "head").write_bytes(b"")
    with open_log(tmp_path) as log, pytest.raises(CorruptLogError, match="refusing to truncate"):
        log.end_offset("t", 0)
    assert Path(seg).read_bytes() == bytes(data)  # nothing was thrown away


def test_a_cleaned_log_without_due_tombstones_is_left_alone(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic(
            "c", 1, {"cleanup.policy": "compact", "segment.bytes": 2048, "delete.retention.ms": 100}
        )
        log.append("c", 0, [Record(b"gone", None)])
        for i in range(200):
            log.append("c", 0, [Record(b"k%d" % (i % 3), b"x" * 20)])
        log.compact("c")
        time.sleep(0.2)
        log.compact("c")  # drops the expired tombstone
        part = log._partition("c", 0)
        manifest = part.manifest()
        assert all(s.tombstone_horizon is None for s in manifest.sealed)
        from kafkakv.log.embedded.cleaner import clean_partition

        # Nothing dirty, no tombstone due: the background cleaner has nothing to do.
        assert clean_partition(part, force=False) is None


def test_compaction_by_two_log_objects_on_one_directory_keeps_every_segment(
    tmp_path: Path,
) -> None:
    """Regression: the leftover sweep used a cached manifest and deleted segments that another
    log object's swap had just created."""
    a = EmbeddedLog(tmp_path, background_cleaner=False)
    b = EmbeddedLog(tmp_path, background_cleaner=False)
    try:
        a.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": 1024})
        for i in range(300):
            (a if i % 2 else b).append("c", 0, [Record(b"k%d" % (i % 20), b"v%d" % i)])
        a.compact("c")
        for i in range(300, 400):
            b.append("c", 0, [Record(b"k%d" % (i % 20), b"v%d" % i)])
        b.compact("c")
        a.compact("c")
        assert a.check() == [] and b.check() == []
        latest: dict[bytes, bytes | None] = {}
        pos = 0
        while got := b.read("c", 0, pos):
            latest.update((r.key or b"", r.value) for r in got)
            pos = (got[-1].offset or 0) + 1
        assert latest == {b"k%d" % k: b"v%d" % (380 + k) for k in range(20)}
    finally:
        a.close()
        b.close()


# -- reading a large batch in slices ------------------------------------------------------------
def test_a_large_batch_read_in_slices_gives_each_record_once_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that takes a 20,000-record batch 300 records at a time gets every record once,
    in order (the batch is decoded once and sliced, not decoded again per slice), and reads at
    arbitrary offsets inside it, or after a compaction rewrote it, give the right records."""
    with open_log(tmp_path) as log:
        log.create_topic("big", 1, {"cleanup.policy": "compact", "segment.bytes": 1 << 20})
        batch = [Record(f"k{i % 5000}".encode(), f"v{i}".encode()) for i in range(20_000)]
        log.append("big", 0, batch)
        log.append("big", 0, [Record(b"after", b"x")])
        got: list[Record] = []
        offset = 0
        while offset < log.end_offset("big", 0):
            records = log.read("big", 0, offset, max_records=300)
            assert records, f"nothing read at {offset}"
            got.extend(records)
            offset = records[-1].offset + 1  # type: ignore[operator]
        assert [r.offset for r in got] == list(range(20_001))
        assert [r.value for r in got[:20_000]] == [r.value for r in batch]
        assert got[-1].key == b"after"
        # As the last value per key, in slices too; the batch decoded once for all of them.
        decoded: list[int] = []

        def decode_rows(*args: Any) -> list[fmt.Row]:
            decoded.append(1)
            return fmt.decode_rows(*args)

        monkeypatch.setattr(partition, "decode_rows", decode_rows)
        latest: dict[bytes | None, bytes | None] = {}
        offset, slices = 0, 0
        while (stretch := log.read_latest("big", 0, offset, max_records=300)).values:
            latest.update(stretch.values)
            offset, slices = stretch.next_offset, slices + 1
        assert offset == 20_001 and slices == 67 and len(decoded) == 1
        assert latest == {**{r.key: r.value for r in batch}, b"after": b"x"}
        # Random access inside the batch, around a sequential reader's slices.
        for start in (19_999, 7, 12_345, 0):
            (one,) = log.read("big", 0, start, max_records=1)
            assert (one.offset, one.value) == (start, f"v{start}".encode())
        log.read("big", 0, 100, max_records=50)  # leave a reader inside the batch
        for _ in range(3):  # roll the segment so that the cleaner may rewrite the batch
            log.append("big", 0, [Record(b"pad", b"p" * 400_000)])
        log.compact("big")
        after = log.read("big", 0, 100, max_records=10**6, max_bytes=1 << 30)
        by_key = latest_by_key(after)
        assert by_key[b"k7"].value == b"v15007"  # the latest of k7, at its own offset
        assert by_key[b"k7"].offset == 15_007
        assert len([r for r in after if r.key and r.key.startswith(b"k")]) == 5000
        assert log.check() == []


def test_the_last_value_per_key_of_a_whole_batch_is_read_from_its_bytes_after_a_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A map's open reads one record of the data topic (its settings), then the last value
    per key of the whole topic: the first read leaves the big batch decoded, and the second
    must not go on from those rows in Python, but take the batch from its bytes in C."""
    with open_log(tmp_path) as log:
        log.create_topic("big", 1)
        batch = [Record(f"k{i % 5000}".encode(), f"v{i}".encode()) for i in range(20_000)]
        log.append("big", 0, batch)
        (first,) = log.read("big", 0, 0, max_records=1)  # stops inside the batch
        assert first.value == b"v0"
        decoded: list[int] = []

        def decode_rows(*args: Any) -> list[fmt.Row]:
            decoded.append(1)
            return fmt.decode_rows(*args)

        monkeypatch.setattr(partition, "decode_rows", decode_rows)
        monkeypatch.setattr(partition, "_take_latest_rows", None)  # the rows path: not taken
        stretch = log.read_latest("big", 0, 0, max_records=10**9)
        assert stretch.values == {r.key: r.value for r in batch}
        assert stretch.next_offset == 20_000 and decoded == []


def _wrong_modes(root: Path) -> dict[str, str]:
    """``root`` and everything under it that is not a 0700 directory or a 0600 file."""
    wrong = {}
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        if mode != (0o700 if path.is_dir() else 0o600):
            wrong[str(path)] = oct(mode)
    return wrong


def test_a_private_log_and_its_lmdb_stores_are_created_owner_only(tmp_path: Path) -> None:
    """Under umask 022: every directory 0700 and every file 0600, whatever made it (topics,
    rolls, compaction, transactions, locks, the marker, a map's LMDB store)."""
    old = os.umask(0o022)
    try:
        log_dir, store_dir = tmp_path / "log", tmp_path / "store"
        with kafkakv.connect(log_dir, private=True, background_cleaner=False) as db:
            assert db.log.private
            m = db.map("m", store="lmdb", store_path=store_dir)
            for i in range(200):
                m[f"k{i % 20}"] = "v" * 100
            m.flush()
            log = db.log
            log.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": 2048})
            for i in range(100):
                log.append("c", 0, [Record(b"k%d" % (i % 5), b"x" * 50)])
            assert log.compact("c")[0].segments_in > 0
            with log.writer("w") as w:
                w.append({("c", 0): [Record(b"k", b"tx")]})
        names = {p.name for p in log_dir.rglob("*")} | {p.name for p in store_dir.rglob("*")}
        for made in ("kafkakv-log.json", "topic.json", "lock", "clean.lock", "head"):
            assert made in names
        for made in ("manifest.json", "data.mdb", "lock.mdb"):
            assert made in names
        assert {".journal", ".lock", ".index", ".log"} <= {Path(n).suffix for n in names}
        assert _wrong_modes(log_dir) == {}
        assert _wrong_modes(store_dir) == {}
    finally:
        os.umask(old)


def test_a_log_is_not_private_by_default(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with EmbeddedLog(tmp_path / "log", background_cleaner=False) as log:
            assert not log.private
            log.create_topic("t", 1)
        assert (tmp_path / "log").stat().st_mode & 0o777 == 0o755
        assert (tmp_path / "log" / "topics" / "t" / "0" / "head").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def test_private_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="private"):
        EmbeddedLog(tmp_path, private="yes")  # type: ignore[arg-type]


# -- damaged base offsets ------------------------------------------------------------------
def _batch_positions(seg: str) -> list[int]:
    from kafkakv.log.embedded.format import scan_batches

    return [pos for pos, _ in scan_batches(Path(seg).read_bytes())]


@pytest.mark.parametrize("which", ["first-of-sealed", "indexed", "middle", "last-of-log"])
def test_a_flipped_base_offset_is_never_read_as_data(tmp_path: Path, which: str) -> None:
    """A read checks each batch's offsets against the index entry or batch before it and the
    segment's range (and the CRC covers them), and names the file and byte."""
    with open_log(tmp_path) as log:
        log.create_topic("t", 1, {"segment.bytes": 8192, "index.interval.bytes": 1024})
        for i in range(200):
            log.append("t", 0, [Record(b"k%d" % i, b"v" * 100)])
        end = log.end_offset("t", 0)
    segs = segment_files(tmp_path, "t")
    seg = segs[-1] if which == "last-of-log" else segs[1]
    positions = _batch_positions(seg)
    index = Path(seg[: -len(".log")] + ".index").read_bytes()
    indexed = [int.from_bytes(index[k + 4 : k + 8], "little") for k in range(0, len(index), 8)]
    assert positions[3] not in indexed
    spot = {
        "first-of-sealed": 0,
        "indexed": indexed[len(indexed) // 2],
        "middle": positions[3],
        "last-of-log": positions[-1],
    }[which]
    data = bytearray(Path(seg).read_bytes())
    data[spot + 4] ^= 0x40  # bit 38 of the base offset
    Path(seg).write_bytes(bytes(data))
    with open_log(tmp_path) as log:
        assert log.check() != []
        bad = int.from_bytes(data[spot : spot + 8], "little") ^ (1 << 38)
        for off in range(end):  # random access: each read is right or refused
            try:
                got = log.read("t", 0, off, max_records=3)
            except CorruptLogError as exc:
                assert exc.path == seg and exc.position == spot
                continue
            assert [r.offset for r in got] == list(range(off, off + len(got)))
            assert off + len(got) - 1 < bad or off > bad
        with pytest.raises(CorruptLogError):
            log.read("t", 0, bad, max_records=1)
    with open_log(tmp_path) as log:  # a sequential reader (the read cursor) is refused too
        off, seen = 0, []
        with pytest.raises(CorruptLogError) as info:
            while off < end:
                got = log.read("t", 0, off, max_records=7)
                seen += [offset_of(r) for r in got]
                off = seen[-1] + 1
        assert info.value.path == seg and info.value.position == spot
        assert seen == list(range(len(seen)))


@pytest.mark.parametrize("size", ["past the end", "short"])
def test_a_wrong_batch_size_is_never_read_as_data(tmp_path: Path, size: str) -> None:
    """The CRC does not cover a batch's size either: a read that steps over the batch toward a
    later offset (without reading its bytes) refuses a size that runs past the published end,
    and one too short lands on bytes that are no batch header."""
    with open_log(tmp_path) as log:
        log.create_topic("t", 1, {"index.interval.bytes": 1 << 20})  # no index: reads step
        for i in range(40):
            log.append("t", 0, [Record(b"k%d" % i, b"v" * 100)])
        end = log.end_offset("t", 0)
    (seg,) = segment_files(tmp_path, "t")
    spot = _batch_positions(seg)[3]
    data = bytearray(Path(seg).read_bytes())
    stored = int.from_bytes(data[spot + 8 : spot + 12], "little")
    wrong = stored + len(data) if size == "past the end" else stored - 40
    data[spot + 8 : spot + 12] = wrong.to_bytes(4, "little")
    Path(seg).write_bytes(bytes(data))
    with open_log(tmp_path) as log:
        for off in range(end):  # each read is right or refused, naming the file
            try:
                got = log.read("t", 0, off, max_records=2)
            except CorruptLogError as exc:
                assert exc.path == seg
                continue
            assert [r.offset for r in got] == list(range(off, off + len(got)))
            assert [r.value for r in got] == [b"v" * 100] * len(got)
            assert off < 3, f"offset {off} read past a batch of a wrong size"


def test_head_rebuild_refuses_a_batch_whose_offset_does_not_follow(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        for _i in range(10):
            log.append("t", 0, [Record(b"k", b"v" * 50)])
    (seg,) = segment_files(tmp_path, "t")
    data = bytearray(Path(seg).read_bytes())
    last = _batch_positions(seg)[-1]
    data[last + 4] ^= 0x40  # the last batch claims an offset near 2**38
    # ... with a CRC that agrees (the CRC covers the offset: only a writer could do this).
    size = fmt.parse_header(bytes(data), last).size
    body = bytes(data[last + frame.CRC_START : last + size])
    crc = zlib.crc32(body, zlib.crc32(bytes(data[last : last + 8])))
    data[last + 12 : last + 16] = crc.to_bytes(4, "little")
    Path(seg).write_bytes(bytes(data))
    (tmp_path / "topics" / "t" / "0" / "head").write_bytes(b"")
    with open_log(tmp_path) as log, pytest.raises(CorruptLogError, match="refusing to rebuild"):
        log.end_offset("t", 0)
    assert Path(seg).read_bytes() == bytes(data)


def test_a_flipped_base_offset_inside_a_gap_is_an_error_not_a_record_elsewhere(
    tmp_path: Path,
) -> None:
    """Compaction leaves gaps in the offsets, where a batch's base offset with one bit
    flipped still lies between its neighbours'. Before the CRC covered the base offset, a read
    returned such a batch's record at the flipped offset (found by test_embedded_fuzz)."""
    with open_log(tmp_path) as log:
        log.create_topic(
            "t",
            1,
            {
                "cleanup.policy": "compact",
                "segment.bytes": 2048,
                "min.cleanable.dirty.ratio": 0.01,
            },
        )
        for i in range(120):
            log.append("t", 0, [Record(b"k%d" % (i % 7), b"v%d" % i * 8)])
        log.compact("t")
        expected = {r.offset: (r.key, r.value) for r in log.read("t", 0, 0, max_records=1000)}
    damaged = None
    for seg in segment_files(tmp_path, "t")[:-1]:  # sealed, compacted segments
        data = bytearray(Path(seg).read_bytes())
        previous_last = int(Path(seg).name.split("-")[0]) - 1
        for pos in _batch_positions(seg):
            h = fmt.parse_header(bytes(data), pos)
            for bit in range(8):
                flipped = h.base_offset ^ (1 << bit)
                if previous_last < flipped < h.base_offset:  # inside the gap before it
                    damaged = (seg, data, pos, bit)
                    break
            previous_last = h.last_offset
            if damaged:
                break
        if damaged:
            break
    assert damaged is not None, "compaction left no gap a one-bit flip lands in"
    seg, data, pos, bit = damaged
    true_base = fmt.parse_header(bytes(data), pos).base_offset
    data[pos] ^= 1 << bit
    Path(seg).write_bytes(bytes(data))
    with open_log(tmp_path) as log:
        # A read from its true offset steps over it (its offset now looks lower): not silently
        # past its record.
        with pytest.raises(CorruptLogError, match="checksum"):
            log.read("t", 0, true_base, max_records=9)
        offset, read = 0, 0
        while offset < log.end_offset("t", 0):
            try:
                got = log.read("t", 0, offset, max_records=9)
            except CorruptLogError as exc:
                assert exc.path == seg
                offset += 1
                continue
            for r in got:  # never a record at an offset it was not written at
                assert expected.get(r.offset) == (r.key, r.value), r
            read += len(got)
            offset = offset_of(got[-1]) + 1 if got else offset + 1
        assert read < len(expected)  # the damaged batch was not read as data


# -- damaged metadata files ----------------------------------------------------------------------
def test_a_manifest_with_a_non_utf8_byte_is_a_corrupt_log_error_naming_it(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"k", b"v")])
    manifest = tmp_path / "topics" / "t" / "0" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes() + b"\xff")
    with open_log(tmp_path) as log:
        for call in (
            lambda: log.read("t", 0, 0),
            lambda: log.append("t", 0, [Record(b"k", b"v")]),
            lambda: log.read_entries("t", 0, 0),
            lambda: log.read_latest("t", 0, 0),
        ):
            with pytest.raises(CorruptLogError) as info:
                call()
            assert info.value.path == str(manifest)
        assert any(p.where == "manifest.json" and str(manifest) in p.message for p in log.check())


def test_a_lost_topic_description_is_reported_not_hidden(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        log.create_topic("u", 1)
        log.append("t", 0, [Record(b"k", b"v")])
    description = tmp_path / "topics" / "t" / "topic.json"
    description.unlink()
    with open_log(tmp_path) as log:
        assert log.topics() == ["t", "u"]
        with pytest.raises(CorruptLogError, match="description is lost") as info:
            log.partitions("t")
        assert info.value.path == str(description)
        with pytest.raises(CorruptLogError):
            log.read("t", 0, 0)
        (problem,) = log.check()
        assert (problem.topic, problem.where) == ("t", "topic.json")


def _crashed_compaction(path: Path) -> list[Path]:
    """A compacted topic with what a cleaner killed before its swap leaves: a new generation
    of a segment, written in full, that the manifest does not list."""
    with open_log(path) as log:
        log.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": 1024})
        for i in range(40):
            log.append("t", 0, [Record(b"k%d" % (i % 3), b"v" * 60)])
    first = Path(segment_files(path, "t")[0])
    stem = first.name.split("-")[0] + "-999"
    leftovers = [first.with_name(stem + ".log"), first.with_name(stem + ".index")]
    leftovers[0].write_bytes(first.read_bytes())
    leftovers[1].write_bytes(first.with_suffix(".index").read_bytes() or b"\0" * 8)
    return leftovers


def test_check_removes_what_a_crashed_compaction_left_instead_of_failing(tmp_path: Path) -> None:
    leftovers = _crashed_compaction(tmp_path)
    with open_log(tmp_path) as log:
        assert log.check() == []
        assert not any(p.exists() for p in leftovers)
        assert len(read_all(log, "t")) == 40


def test_check_leaves_a_running_cleaners_output_alone(tmp_path: Path) -> None:
    import fcntl

    leftovers = _crashed_compaction(tmp_path)
    fd = os.open(tmp_path / "topics" / "t" / "0" / "clean.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another cleaner is at work
        with open_log(tmp_path) as log:
            assert log.check() == []
            assert all(p.exists() for p in leftovers)
    finally:
        os.close(fd)


# -- concurrent readers ---------------------------------------------------------------------------
def test_a_read_waiting_on_the_disk_does_not_hold_up_other_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partition's cache lock covers cache lookups only, not a read's I/O and decoding."""
    import threading

    real_pread = os.pread
    stuck, release = threading.Event(), threading.Event()

    def pread(fd: int, n: int, pos: int) -> bytes:
        if threading.current_thread().name == "stuck-reader":
            stuck.set()
            assert release.wait(10)
        return real_pread(fd, n, pos)

    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        for i in range(50):
            log.append("t", 0, [Record(b"k%d" % i, b"v%d" % i)])
        monkeypatch.setattr(os, "pread", pread)
        slow: list[Record] = []
        reader = threading.Thread(
            target=lambda: slow.extend(log.read("t", 0, 0)), name="stuck-reader"
        )
        reader.start()
        try:
            assert stuck.wait(10)
            done = threading.Event()

            def read_fast() -> None:
                if log.read("t", 0, 10):
                    done.set()

            fast = threading.Thread(target=read_fast)
            fast.start()
            assert done.wait(5), "a second thread waited for the first one's disk read"
            fast.join()
        finally:
            release.set()
            reader.join()
        assert [r.offset for r in slow] == list(range(50))


def test_threads_reading_one_partition_while_it_is_written_and_compacted_read_it_right(
    tmp_path: Path,
) -> None:
    import threading

    with open_log(tmp_path) as log:
        log.create_topic(
            "t",
            1,
            {"cleanup.policy": "compact", "segment.bytes": 4096, "index.interval.bytes": 512},
        )

        def append(i: int) -> None:
            assert log.append("t", 0, [Record(b"k%d" % (i % 50), b"v%d" % i)]) == i

        for i in range(500):
            append(i)
        errors: list[BaseException] = []
        stop = threading.Event()

        def read(step: int) -> None:
            try:
                while not stop.is_set():
                    off = log.start_offset("t", 0)
                    while True:
                        got = log.read("t", 0, off, max_records=step)
                        if not got:
                            break
                        offsets = [offset_of(r) for r in got]
                        assert offsets == sorted(set(offsets))
                        for r, offset in zip(got, offsets, strict=True):
                            assert offset >= off and r.value == b"v%d" % offset
                        off = offsets[-1] + 1
            except BaseException as exc:
                errors.append(exc)

        readers = [threading.Thread(target=read, args=(n,)) for n in (1, 7, 100)]
        for t in readers:
            t.start()
        try:
            for i in range(500, 1500):
                append(i)
                if i % 250 == 0:
                    log.compact("t")
        finally:
            stop.set()
            for t in readers:
                t.join()
        assert errors == []
        assert log.check() == []


def _as_magic_1(data: bytearray) -> int:
    """Rewrite every batch in ``data`` (a segment's bytes) as kafkakv wrote them before the
    CRC covered the base offset: magic 1, the CRC of bytes 16..size. Returns how many."""
    count = 0
    for pos in _batch_positions_in(bytes(data)):
        size = fmt.parse_header(bytes(data), pos).size
        data[pos + 16] = frame.BATCH_MAGIC_V1
        crc = zlib.crc32(bytes(data[pos + 16 : pos + size]))
        data[pos + 12 : pos + 16] = crc.to_bytes(4, "little")
        count += 1
    return count


def _batch_positions_in(data: bytes) -> list[int]:
    return [pos for pos, _ in fmt.scan_batches(data)]


def test_batches_of_magic_1_read_check_and_compact_as_before(tmp_path: Path) -> None:
    """A log written before the CRC covered the base offset: read, checked and compacted as
    it was, its re-encoded batches then written in the new format."""
    config = {"cleanup.policy": "compact", "segment.bytes": 2048, "min.cleanable.dirty.ratio": 0.01}
    with open_log(tmp_path) as log:
        log.create_topic("t", 1, config)
        for i in range(0, 120, 3):  # batches of 3: compaction keeps some of a batch's records
            batch = [Record(b"k%d" % (j % 7), b"v%d" % j * 8) for j in range(i, i + 3)]
            log.append("t", 0, batch)
        written = [(r.offset, r.key, r.value) for r in log.read("t", 0, 0, max_records=1000)]
    rewritten = 0
    for seg in segment_files(tmp_path, "t"):
        data = bytearray(Path(seg).read_bytes())
        rewritten += _as_magic_1(data)
        Path(seg).write_bytes(bytes(data))
    assert rewritten == 40
    marker = tmp_path / "kafkakv-log.json"
    marker.write_text('{"format": 1}')  # as that kafkakv wrote it
    with open_log(tmp_path) as log:
        assert json.loads(marker.read_text()) == {"format": 2}  # earlier versions now refuse
        assert [(r.offset, r.key, r.value) for r in log.read("t", 0, 0, max_records=1000)] == (
            written
        )
        assert log.check() == []
        log.compact("t")
        latest = {key: (offset, value) for offset, key, value in written}
        got = [(r.offset, r.key, r.value) for r in log.read("t", 0, 0, max_records=1000)]
        assert {key: (offset, value) for offset, key, value in got} == latest
        assert log.check() == []
    magics = {
        data[pos + 16]
        for seg in segment_files(tmp_path, "t")
        for data in [Path(seg).read_bytes()]
        for pos in _batch_positions_in(data)
    }
    assert magics == {frame.BATCH_MAGIC_V1, frame.BATCH_MAGIC}  # old kept, re-encoded new


def test_a_damaged_batch_larger_than_a_read_chunk_is_not_stepped_over_unchecked(
    tmp_path: Path,
) -> None:
    """A read steps over the batches before its offset. One larger than the chunk it read is
    read whole for its CRC: otherwise a flip of its offset into a gap would hide its record."""
    big = 3 * partition._READ_CHUNK // 2  # past the first chunk a read takes
    config = {
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": 0.01,
        "segment.bytes": 4 * big,
        "index.interval.bytes": 64 * big,  # no index entry: reads start at the segment's start
        "max.message.bytes": 2 * big,
    }
    with open_log(tmp_path) as log:
        log.create_topic("t", 1, config)
        log.append("t", 0, [Record(b"a", b"1" * big)])  # 0: superseded by 2, compacted away
        log.append("t", 0, [Record(b"b", b"2" * big)])  # 1: the batch to damage
        log.append("t", 0, [Record(b"a", b"3")])  # 2
        for i in range(4):  # roll: the first segment is sealed and can be compacted
            log.append("t", 0, [Record(b"c%d" % i, b"4" * big)])
        log.compact("t")
        assert [r.offset for r in log.read("t", 0, 0, max_records=2)] == [1, 2]
    seg = segment_files(tmp_path, "t")[0]
    data = bytearray(Path(seg).read_bytes())
    (first,) = [pos for pos, h in fmt.scan_batches(bytes(data)) if h.base_offset == 1]
    data[first] ^= 0x01  # offset 1 -> 0, inside the gap compaction left
    Path(seg).write_bytes(bytes(data))
    with open_log(tmp_path) as log, pytest.raises(CorruptLogError, match="checksum"):
        log.read("t", 0, 1, max_records=5)  # not [offset 2] as if offset 1 were not there


def test_a_topic_removed_between_listing_and_counting_is_left_out(tmp_path: Path) -> None:
    """``topic_partitions`` asks each topic after listing the names: one that is gone by
    then (its directory removed by hand, as another process could) is left out, the rest
    counted."""
    with open_log(tmp_path) as first:
        first.create_topic("kept", 2)
        first.create_topic("gone", 1)
    log = open_log(tmp_path)  # a fresh log: nothing cached
    listed = log.topics

    def then_removed() -> list[str]:
        names = listed()
        shutil.rmtree(tmp_path / "topics" / "gone")
        return names

    log.topics = then_removed  # type: ignore[method-assign]
    try:
        assert log.topic_partitions() == {"kept": 2}
    finally:
        log.close()
