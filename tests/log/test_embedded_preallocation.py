"""Preallocated active segments under ``fsync=always`` (see ``_PREALLOCATE`` in partition.py):
the file grows ahead of its data, every process and every recovery tells the zeros past the
published position from a tail, and a sealed segment ends at its data."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kafkakv.log import EmbeddedLog, Record
from kafkakv.log.embedded import format as fmt
from kafkakv.log.embedded import partition as partition_module
from kafkakv.log.embedded.head import HeadFile
from kafkakv.log.embedded.recovery import valid_prefix

SEGMENT = "00000000000000000000-0.log"


def _records(n: int, start: int = 0) -> list[Record]:
    return [Record(b"k%d" % i, b"v" * 100) for i in range(start, start + n)]


def _published(log: EmbeddedLog, topic: str = "t") -> int:
    head = log._partition(topic, 0)._head.read()
    assert head is not None
    return head.active_pos


def _reboot(pdir: Path) -> None:
    """Make the head look written before the machine restarted: the next user recovers."""
    hf = HeadFile(str(pdir / "head"))
    state = hf.read()
    assert state is not None
    hf.publish(state._replace(boot_id=b"\x01" * 16))
    hf.close()


def test_under_fsync_always_the_active_segment_grows_ahead_of_its_data(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path, fsync="always", background_cleaner=False) as log:
        log.create_topic("t", 1)
        for r in _records(20):
            log.append("t", 0, [r])
        end = _published(log)
        size = os.path.getsize(tmp_path / "topics/t/0" / SEGMENT)
        assert size >= partition_module._PREALLOCATE > end
        assert [r.key for r in log.read("t", 0, 0)] == [r.key for r in _records(20)]
        assert log.check() == []


def test_other_policies_do_not_preallocate(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path, fsync="interval", background_cleaner=False) as log:
        log.create_topic("t", 1)
        log.append("t", 0, _records(3))
        assert os.path.getsize(tmp_path / "topics/t/0" / SEGMENT) == _published(log)


def test_an_append_does_not_stat_the_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stat of the segment between appends makes each fdatasync commit the journal on
    Linux 6.13 and later (fine-grained timestamps): the append path reads, never stats."""
    with EmbeddedLog(tmp_path, fsync="always", background_cleaner=False) as log:
        log.create_topic("t", 1)
        log.append("t", 0, _records(1))  # opens the segment (one fstat there is fine)
        segment_fd = log._partition("t", 0)._wfd
        stats: list[int] = []
        real = os.fstat

        def counting(fd: int) -> os.stat_result:
            stats.append(fd)
            return real(fd)

        monkeypatch.setattr(os, "fstat", counting)
        for r in _records(50, 1):
            log.append("t", 0, [r])
        monkeypatch.undo()
        assert segment_fd not in stats
        assert log.end_offset("t", 0) == 51


def test_a_process_under_another_policy_appends_into_the_preallocated_space(
    tmp_path: Path,
) -> None:
    always = EmbeddedLog(tmp_path, fsync="always", background_cleaner=False)
    always.create_topic("t", 1)
    always.append("t", 0, _records(5))
    size = os.path.getsize(tmp_path / "topics/t/0" / SEGMENT)
    with EmbeddedLog(tmp_path, fsync="never", background_cleaner=False) as other:
        other.append("t", 0, _records(5, 5))  # the zeros after the data are not a tail
        assert os.path.getsize(tmp_path / "topics/t/0" / SEGMENT) == size
    always.append("t", 0, _records(5, 10))
    assert [r.key for r in always.read("t", 0, 0)] == [r.key for r in _records(15)]
    assert always.check() == []
    always.close()


def test_a_torn_tail_in_preallocated_space_is_cut(tmp_path: Path) -> None:
    """A writer that died after writing a batch and before publishing it leaves bytes past the
    published position, inside the file's size: the next append still finds and cuts them."""
    with EmbeddedLog(tmp_path, fsync="always", background_cleaner=False) as log:
        log.create_topic("t", 1)
        log.append("t", 0, _records(3))
        end = _published(log)
        torn = fmt.encode_batch(
            3, b"x" * 500, record_count=1, last_offset_delta=0, base_timestamp=0, max_timestamp=0
        )[:300]
        with open(tmp_path / "topics/t/0" / SEGMENT, "r+b") as f:
            f.seek(end)
            f.write(torn)
        assert log.append("t", 0, _records(1, 3)) == 3
        assert [r.key for r in log.read("t", 0, 0)] == [r.key for r in _records(4)]
        assert log.check() == []


def test_recovery_after_a_reboot_cuts_the_zeros_at_once(tmp_path: Path) -> None:
    pdir = tmp_path / "topics" / "t" / "0"
    with EmbeddedLog(tmp_path, fsync="always", background_cleaner=False) as log:
        log.create_topic("t", 1)
        for r in _records(10):
            log.append("t", 0, [r])
        end = _published(log)
    assert os.path.getsize(pdir / SEGMENT) > end
    _reboot(pdir)
    with EmbeddedLog(tmp_path, fsync="always", background_cleaner=False) as log:
        assert log.end_offset("t", 0) == 10
        assert os.path.getsize(pdir / SEGMENT) >= end  # cut to the data, maybe grown again
        assert [r.key for r in log.read("t", 0, 0)] == [r.key for r in _records(10)]
        log.append("t", 0, _records(1, 10))
        assert log.check() == []


def test_looking_for_valid_data_after_the_end_skips_trailing_zeros() -> None:
    """Recovery looks for a valid batch after the first invalid byte (to refuse truncating
    corruption); over a preallocated tail it stops at the last byte that is not zero instead of
    trying a header at each of millions of positions."""
    data = fmt.encode_batch(
        0, b"v" * 100, record_count=1, last_offset_delta=0, base_timestamp=0, max_timestamp=0
    )
    segment = data + bytes(8 << 20)
    started = time.monotonic()
    found = valid_prefix(
        lambda n, at: segment[at : at + n], len(segment), 0, 4096, lambda p, h: True
    )
    assert time.monotonic() - started < 1.0
    assert (found.end, found.next_offset, found.later) == (len(data), 1, None)


def test_a_roll_seals_the_segment_at_its_data(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path, fsync="always", background_cleaner=False) as log:
        log.create_topic("t", 1, {"segment.bytes": 300_000})
        offset = 0
        while len(log._partition("t", 0).manifest().segments) < 2:
            log.append("t", 0, _records(100, offset))
            offset += 100
        sealed = log._partition("t", 0).manifest().segments[0]
        assert sealed.size is not None
        assert os.path.getsize(tmp_path / "topics/t/0" / (sealed.name + ".log")) == sealed.size
        assert log.check() == []
        assert len(log.read("t", 0, 0, max_records=10**6)) == offset
