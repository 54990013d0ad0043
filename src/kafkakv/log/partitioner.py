"""Key → partition, exactly as Apache Kafka's Java client does it.

The Java producer's default partitioner hashes the serialized key with murmur2 (seed
``0x9747b28c``), clears the sign bit, and takes the result modulo the partition count. Using the
same function means a key written by a Java service and by kafkakv lands on the same partition.
"""

from __future__ import annotations

__all__ = ["murmur2", "partition_for"]

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: the 32-bit hash as a signed Java ``int``.

    >>> murmur2(b"21")
    -973932308
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - (length & 3)
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner picks for ``key``.

    Costs one pass over the key. Raises ``TypeError`` for a non-bytes key and ``ValueError``
    for a partition count below 1.

    >>> partition_for(b"21", 3)
    0
    """
    if not isinstance(key, bytes | bytearray | memoryview):
        raise TypeError(f"partition_for needs a bytes key, not {type(key).__name__}")
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, not {partitions}")
    return (murmur2(bytes(key)) & 0x7FFFFFFF) % partitions
