"""The batch partitioner agrees with Kafka's, key for key."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkakv.log.partitioner import partition_for
from kafkakv.pipeline.partitions import partitions_for


@given(st.lists(st.binary(max_size=40), max_size=200), st.integers(1, 1000))
def test_every_key_gets_the_partition_the_java_producer_picks(keys: list[bytes], n: int) -> None:
    assert partitions_for(keys, n) == [partition_for(k, n) for k in keys]


def test_known_values_of_kafkas_murmur2() -> None:
    # Partitions Kafka's Java client gives these keys (see tests/log/test_partitioner.py).
    keys = [b"21", b"foobar", b"a-little-bit-long-string", b""]
    assert partitions_for(keys, 3) == [partition_for(k, 3) for k in keys]
    assert partitions_for([b"21"], 3) == [0]


def test_no_partitions_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        partitions_for([b"k"], 0)
