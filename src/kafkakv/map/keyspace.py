"""Where a map's keys live in records: the one rule for record keys, prefixes and partitions.

A map that has its topics to itself writes each key as its codec encodes it. Maps that share
topics put their name before it: one byte with the name's length, then the name in UTF-8, so
that the first byte of any record key says how long its prefix is. The partition of a record
is the Java client's default partitioner applied to the whole record key (murmur2), so Java
producers and every kafkakv replica agree. Each flush also adds one record of its own to the
data topic, under :data:`FLUSH_POINT_KEY`, which no map key can equal: it starts with a zero
byte, the prefix of a map with an empty name (map names are never empty), and updates of a
plain map refuse it (:func:`check_update_key`).

>>> space = KeySpace(3)
>>> prefix = map_prefix("users")
>>> prefix
b'\\x05users'
>>> record_key = prefix + b"alice"
>>> space.partition_of(record_key) in range(3), prefix_of(record_key) == prefix
(True, True)

Pure functions, no I/O.
"""

from __future__ import annotations

from kafkakv.errors import EncodeError
from kafkakv.log.partitioner import partition_for

__all__ = [
    "FLUSH_POINT_KEY",
    "KeySpace",
    "check_update_key",
    "map_prefix",
    "prefix_of",
]

#: Key of the record that each flush adds to the data topic: its value is msgpack ``[X]``, the
#: last ops offset the flush covers. Compaction keeps the newest one per partition.
FLUSH_POINT_KEY = b"\x00kafkakv:flush-point"


def check_update_key(record_key: bytes) -> None:
    """Refuse an update of ``record_key`` when it is the flush point's key (a plain map's key
    can be any bytes): flushed, it would read as a flush point. Raises
    :class:`~kafkakv.errors.EncodeError`.

    >>> check_update_key(b"\\x00other")
    >>> check_update_key(FLUSH_POINT_KEY)
    Traceback (most recent call last):
    ...
    kafkakv.errors.EncodeError: the key b'\\x00kafkakv:flush-point' is reserved for the data topic's flush points
    """
    if record_key == FLUSH_POINT_KEY:
        raise EncodeError(f"the key {record_key!r} is reserved for the data topic's flush points")


def map_prefix(name: str) -> bytes:
    """What precedes every key of map ``name`` in records when it shares its topics.

    >>> map_prefix("ab")
    b'\\x02ab'
    """
    encoded = name.encode()
    if not 0 < len(encoded) < 256:
        raise ValueError(f"a map name of 1 to 255 UTF-8 bytes, not {name!r}")
    return bytes([len(encoded)]) + encoded


def prefix_of(record_key: bytes) -> bytes:
    """The map prefix a record key of shared topics starts with (its first byte says its
    length); for an empty key, ``b""``.

    >>> prefix_of(b"\\x02abxyz")
    b'\\x02ab'
    """
    return record_key[: record_key[0] + 1] if record_key else b""


class KeySpace:
    """The partitions of a set of map topics: which partition holds each record key."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count

    def partition_of(self, record_key: bytes) -> int:
        """The partition of ``record_key`` (murmur2, as Kafka's producer); O(len(key))."""
        if self.count == 1:
            return 0
        return partition_for(record_key, self.count)
