"""A map over a damaged embedded log fails with a typed error, never a silent stall."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import kafkakv
from kafkakv.errors import CorruptLogError
from kafkakv.log.embedded.format import scan_batches


def test_a_flipped_offset_in_the_last_ops_batch_is_an_error_not_a_stall(tmp_path: Path) -> None:
    """Regression: a fresh replica jumped its position to the flipped offset (near 2**38) and
    every later update timed out after the map's timeout, with no error naming the damage."""
    with kafkakv.connect(str(tmp_path)) as db:
        m = db.map("m", flush_period=10**6)
        for i in range(5):
            m[f"k{i}"] = i
    (segment,) = [
        p for p in (tmp_path / "topics" / "m_ops" / "0").glob("*.log") if p.stat().st_size
    ]
    data = bytearray(segment.read_bytes())
    last = [pos for pos, _ in scan_batches(bytes(data))][-1]
    data[last + 4] ^= 0x40  # bit 38 of the last batch's base offset
    segment.write_bytes(bytes(data))
    start = time.monotonic()
    with kafkakv.connect(str(tmp_path)) as db, pytest.raises(CorruptLogError) as info:
        fresh = db.map("m", timeout=5)
        fresh["k9"] = 9
    assert info.value.path == str(segment) and info.value.position == last
    assert time.monotonic() - start < 5
