"""The embedded log's compiled sequential read (``frame.read_plain``, called from
``Partition._read_from``): a reader that goes on from where its last read stopped gets the
records, next offsets and errors the Python path gives, whatever the batches hold; the
compiled path takes the batches an append leaves and declines the rest to the Python path."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkakv.errors import CorruptLogError
from kafkakv.log import EmbeddedLog, Record
from kafkakv.log.embedded import frame
from kafkakv.log.embedded import partition as partition_module
from tests.leaks import growth

pytestmark = pytest.mark.skipif(
    not frame.COMPILED, reason="the C module is not built (or KAFKAKV_PURE_PYTHON=1)"
)


def _batch(rng: random.Random, i: int) -> list[Record]:
    """Records of every kind a batch can hold: keys and values or None, empty, large; now
    and then headers (which the compiled path leaves to Python)."""
    out = []
    for _ in range(rng.choice([1, 1, 2, 7, 60])):
        key = rng.choice([None, b"", b"k%d" % rng.randrange(30)])
        value = rng.choice([None, b"", rng.randbytes(rng.choice([1, 100, 5000]))])
        headers = [("h", b"x")] if rng.random() < 0.05 else ()
        out.append(Record(key, value, headers, 1_700_000_000_000 + rng.randrange(-5, 5) * i))
    return out


def _fill(path: Path, seed: int, segment_bytes: int = 1 << 20) -> None:
    rng = random.Random(seed)
    with EmbeddedLog(path, background_cleaner=False) as log:
        log.create_topic("t", 1, config={"segment.bytes": segment_bytes})
        for i in range(rng.choice([40, 300])):
            log.append("t", 0, _batch(rng, i))


class _Counted:
    """frame.read_plain, counting the calls that took batches."""

    def __init__(self) -> None:
        self.took = 0

    def __call__(self, *args: Any) -> Any:
        assert frame.read_plain is not None
        got = frame.read_plain(*args)
        if got is not None:
            self.took += 1
        return got


def _reads(log: EmbeddedLog, seed: int) -> Iterator[tuple[list[Record], int] | str]:
    """A sequential reader's reads, each of random size, to the end: (records, next offset),
    or the error's type and message."""
    rng = random.Random(seed)
    position = 0
    for _ in range(2000):
        try:
            records, after = log.read_batch(
                "t",
                0,
                position,
                max_records=rng.choice([1, 3, 50, 400]),
                max_bytes=rng.choice([1, 200, 4096, 1 << 16]),
            )
        except CorruptLogError as exc:
            yield f"{type(exc).__name__}: {exc}"
            return
        yield list(records), after
        if after == position:
            return
        position = after


def _both(path: Path, seed: int, damage: Callable[[], None] | None = None) -> tuple[Any, Any, int]:
    """The reads of ``_reads`` through the compiled path and through Python alone, on the
    log at ``path`` (``damage`` runs after each reader's first read); and how many reads the
    compiled path took batches in."""
    counted = _Counted()
    results = []
    for compiled in (True, False):
        with EmbeddedLog(path, background_cleaner=False) as log:
            log._partition("t", 0)._read_plain = counted if compiled else None
            reads = _reads(log, seed)
            first = next(reads)
            if damage is not None:
                damage()
            results.append([first, *reads])
    return results[0], results[1], counted.took


@pytest.mark.parametrize("seed", range(12))
def test_sequential_reads_give_what_the_python_path_gives(tmp_path: Path, seed: int) -> None:
    _fill(tmp_path, seed, segment_bytes=[1 << 20, 64 << 10][seed % 2])
    fast, slow, took = _both(tmp_path, seed)
    assert fast == slow
    assert took > 0, "the compiled path took no batch: this test would check nothing"
    assert sum(len(r[0]) for r in fast if not isinstance(r, str)) > 0


def test_batches_larger_than_a_chunk_are_taken_whole_by_the_compiled_path(
    tmp_path: Path,
) -> None:
    """A bulk append's batch (65,536 records of a data source write: 7 MB) is larger than the
    4 MiB a read takes at once: the compiled path reads exactly it, as the Python path does,
    and gives the same records (it declined every such batch once, so replays of bulk loads
    built their records in Python)."""
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("t", 1, config={"segment.bytes": 64 << 20})
        for i in range(3):
            log.append("t", 0, [Record(b"k%d" % j, bytes([i]) * 5000) for j in range(1200)])
    reads = []
    counted = _Counted()
    for compiled in (True, False):
        with EmbeddedLog(tmp_path, background_cleaner=False) as log:
            log._partition("t", 0)._read_plain = counted if compiled else None
            position, got = 0, []
            while True:
                records, after = log.read_batch("t", 0, position, max_records=5000)
                if not records:
                    break
                got.append((list(records), after))
                position = after
            reads.append(got)
    assert reads[0] == reads[1] and [len(r) for r, _ in reads[0]] == [1200, 1200, 1200]
    assert counted.took == 2  # the first read has no cursor yet: the Python path


def test_a_few_records_from_the_start_of_a_large_batch_decode_no_more_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of at most 1/64 of a batch from its first offset takes those records in C with
    the rest of the batch left undecoded (a map's open reads one record of a data topic whose
    first batch may be a flush of 500,000 keys, and decoded all of them); the reads and next
    offsets are those of the Python path, also for the reads that go on inside the batch, a
    larger read decodes the batch (once: a sequential reader would decode its start twice),
    and a batch whose rows have headers is declined to Python."""
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("t", 1, config={"segment.bytes": 64 << 20})
        log.append("t", 0, [Record(b"k%d" % j, b"v%d" % j, (), 1000 + j) for j in range(4000)])
        log.append("t", 0, [Record(b"h", b"x", [("h", b"1")]), *[Record(b"k", b"y")] * 199])
    took: list[bool] = []

    def counted(*args: Any) -> Any:
        assert frame.first_records is not None
        got = frame.first_records(*args)
        took.append(got is not None)
        return got

    reads = []
    for first in (counted, None):
        monkeypatch.setattr(partition_module, "first_records", first)
        with EmbeddedLog(tmp_path, background_cleaner=False) as log:
            got = []
            reads_made = [(0, 1), (1, 5), (0, 3), (4000, 2), (4001, 3), (0, 50), (0, 1000), (6, 9)]
            for position, n in reads_made:
                records, after = log.read_batch("t", 0, position, max_records=n)
                got.append((list(records), after))
            reads.append(got)
    assert reads[0] == reads[1]
    assert [len(r) for r, _ in reads[0]] == [1, 5, 3, 2, 3, 50, 1000, 9]
    assert reads[0][0] == ([Record(b"k0", b"v0", (), 1000, 0, 0)], 1)
    # (1, 5) and (6, 9) begin inside the batch; (0, 3) goes on from the rows (1, 5) decoded;
    # (4000, 2) is declined (headers); (0, 1000) is more than 1/64 of its batch.
    assert took == [True, False, True]


def _random_seed() -> int:
    seed = int(os.environ.get("KAFKAKV_SEED") or random.randrange(1 << 32))
    print(f"seed: {seed} (replay with KAFKAKV_SEED={seed})")
    return seed


def test_damaged_logs_read_alike_both_ways(tmp_path: Path) -> None:
    """A byte flipped in a segment under a reader, after its first read: the compiled path
    and the Python path give the same records, next offsets and errors."""
    seed = _random_seed()
    rng = random.Random(seed)
    counted = _Counted()
    for round_ in range(8):
        path = tmp_path / str(round_)
        _fill(path, rng.randrange(1 << 30), segment_bytes=1 << 20)
        segment = sorted((path / "topics" / "t" / "0").glob("*.log"))[0]
        original = segment.read_bytes()
        flipped = bytearray(original)
        at = rng.randrange(len(original))
        flipped[at] ^= 1 << rng.randrange(8)

        def damage(flipped: bytes = bytes(flipped), segment: Path = segment) -> None:
            segment.write_bytes(flipped)

        def restore(original: bytes = original, segment: Path = segment) -> None:
            segment.write_bytes(original)

        results = []
        for compiled in (True, False):
            restore()
            with EmbeddedLog(path, background_cleaner=False) as log:
                log._partition("t", 0)._read_plain = counted if compiled else None
                reads = _reads(log, seed + round_)
                first = next(reads)
                damage()
                results.append([first, *reads])
        assert results[0] == results[1], f"seed {seed}, round {round_}, byte {at}"
    assert counted.took > 0, "the compiled path took no batch: this test would check nothing"


def test_a_damaged_batch_raises_as_on_the_python_path(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("t", 1)
        for i in range(20):
            log.append("t", 0, [Record(b"k%d" % i, b"v" * 50), Record(b"x", b"y")])
    segment = next((tmp_path / "topics" / "t" / "0").glob("*.log"))
    data = segment.read_bytes()
    size = int.from_bytes(data[8:12], "little")  # every batch here is the same size
    where = 10 * size + 70  # inside the 11th batch's body: after a reader's first reads

    def flip() -> None:
        with open(segment, "r+b") as f:
            f.seek(where)
            byte = f.read(1)
            f.seek(where)
            f.write(bytes([byte[0] ^ 0x10]))

    def restore() -> None:
        segment.write_bytes(data)

    fast: list[Any] = []
    slow: list[Any] = []
    for compiled, out in ((True, fast), (False, slow)):
        restore()
        with EmbeddedLog(tmp_path, background_cleaner=False) as log:
            log._partition("t", 0)._read_plain = frame.read_plain if compiled else None
            assert len(log.read("t", 0, 0, max_records=4)) == 4
            flip()
            position = 4
            while True:
                try:
                    got = log.read("t", 0, position, max_records=2)  # a batch a read
                except CorruptLogError as exc:
                    out.append(str(exc))
                    break
                out.append([r.offset for r in got])
                position = (got[-1].offset or 0) + 1
    assert fast == slow
    assert "checksum" in fast[-1] and f"at byte {10 * size}" in fast[-1]


def test_records_built_in_c_are_records(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"a", b"1", (), 5)])
        log.append("t", 0, [Record(None, None, (), 7), Record(b"", b"", (), 9)])
        assert log.read("t", 0, 0, max_records=1) == [Record(b"a", b"1", (), 5, 0, 0)]
        got = log.read("t", 0, 1)  # on from the last read: the compiled path
        assert got == [Record(None, None, (), 7, 0, 1), Record(b"", b"", (), 9, 0, 2)]
        assert all(type(r) is Record for r in got)
        assert got[0].headers == () and got[1].key == b"" and got[0].key is None


def test_read_plain_declines_what_it_cannot_take_and_leaks_nothing(tmp_path: Path) -> None:
    fast = frame.read_plain
    assert fast is not None
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"k", b"v" * 100)] * 3)
        log.append("t", 0, [Record(b"k", b"v", [("h", b"x")])])  # headers: not plain
        part = log._partition("t", 0)
        head = part.published()
        fd = part._read_fd(part.manifest().active.name)
        first = fast(fd, 0, head.active_pos, 0, head.next_offset, 0, 100, 1 << 20)
        records, after, position, low, room, budget = first
        assert [r.offset for r in records] == [0, 1, 2] and (after, low, room) == (3, 3, 97)
        assert 0 < position < head.active_pos and budget == (1 << 20) - position
        # The batch with headers, a wrong expected offset, too little room, past the end:
        assert fast(fd, position, head.active_pos, 3, head.next_offset, 0, 100, 1 << 20) is None
        assert fast(fd, 0, head.active_pos, 1, head.next_offset, 0, 100, 1 << 20) is None
        assert fast(fd, 0, head.active_pos, 0, head.next_offset, 0, 2, 1 << 20) is None
        assert fast(fd, 0, head.active_pos, 0, 2, 0, 100, 1 << 20) is None
        assert fast(fd, 0, 10, 0, head.next_offset, 0, 100, 1 << 20) is None
        assert fast(-1, 0, head.active_pos, 0, head.next_offset, 0, 100, 1 << 20) is None
        with pytest.raises(TypeError):
            fast(fd, 0, head.active_pos)

        def work() -> None:
            for _ in range(2000):
                fast(fd, 0, head.active_pos, 0, head.next_offset, 0, 100, 1 << 20)
                fast(fd, position, head.active_pos, 3, head.next_offset, 0, 100, 1 << 20)

        marker = b"v" * 100
        found = growth(work, (marker,))
        assert found.allocated < 64 * 1024, f"{found.allocated} bytes still allocated"
