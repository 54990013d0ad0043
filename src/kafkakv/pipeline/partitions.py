"""Kafka's partitioner for a whole batch of keys at once, with numpy.

:func:`kafkakv.log.partitioner.partition_for` hashes one key in Python (about 2-4 µs for a
short key); a Spark write task partitions tens of thousands of keys per Arrow batch, so it
hashes them together instead: keys of equal length form a matrix of 32-bit words, and murmur2's
steps run column by column over all of them (numpy's ``uint32`` arithmetic wraps modulo 2**32
like Java's ``int``). The result is the same partition the Java producer picks, key for key.

>>> from kafkakv.log.partitioner import partition_for
>>> keys = [b"21", b"terminal-42", b"", b"\\xff" * 9]
>>> partitions_for(keys, 7) == [partition_for(k, 7) for k in keys]
True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["partitions_for"]

_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C


def partitions_for(keys: Sequence[bytes], partitions: int) -> list[int]:
    """The partition of each key among ``partitions`` (Kafka's default partitioner).

    Costs O(total key bytes) numpy work plus one group per distinct key length.
    """
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    if partitions == 1:
        return [0] * len(keys)
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    out = np.empty(len(keys), dtype=np.int64)
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        group = keys if len(rows) == len(keys) else [keys[i] for i in rows.tolist()]
        hashes = _murmur2_equal_length(group, length)
        out[rows] = (hashes & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions
    result: list[int] = out.tolist()
    return result


def _murmur2_equal_length(keys: Sequence[bytes], length: int) -> np.ndarray:
    """murmur2 (unsigned 32-bit) of keys that all have ``length`` bytes."""
    n = len(keys)
    h = np.full(n, (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
    if length == 0:
        data = np.zeros((n, 0), dtype=np.uint8)
    else:
        data = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(n, length)
    whole = length - (length & 3)
    if whole:
        words = np.ascontiguousarray(data[:, :whole]).view("<u4").astype(np.uint32)
        for j in range(words.shape[1]):
            k = words[:, j] * _M
            k ^= k >> np.uint32(24)
            k *= _M
            h *= _M
            h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[:, whole + 2].astype(np.uint32) << np.uint32(16)
    if rest >= 2:
        h ^= data[:, whole + 1].astype(np.uint32) << np.uint32(8)
    if rest >= 1:
        h ^= data[:, whole].astype(np.uint32)
        h *= _M
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h
