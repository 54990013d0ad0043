"""partition_for must agree with the Java client's default partitioner."""

from __future__ import annotations

import pytest

from kafkakv.log import murmur2, partition_for

# Expected values from Apache Kafka's clients UtilsTest.testMurmur2 (signed Java ints).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS.items())
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_partition_masks_the_sign_bit_like_java() -> None:
    # murmur2(b"21") is negative: Java's toPositive clears the sign bit (not abs()).
    assert partition_for(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert partition_for(b"21", 7) != abs(-973932308) % 7
    for key, h in KAFKA_VECTORS.items():
        for n in (1, 2, 3, 12, 100):
            assert partition_for(key, n) == (h & 0x7FFFFFFF) % n


def test_empty_key_and_bad_input() -> None:
    assert 0 <= partition_for(b"", 5) < 5
    with pytest.raises(TypeError):
        partition_for("text", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        partition_for(b"k", 0)
