"""Where a map's keys live in records: the one rule for record keys, prefixes and partitions.

A map that has its topics to itself writes each key as its codec encodes it. Maps that share
topics put their name before it: one byte with the name's length, then the name in UTF-8, so
that the first byte of any record key says how long its prefix is. The partition of a record
is the Java client's default partitioner applied to the whole record key (murmur2), so Java
producers and every kafkakv replica agree. Each flush also adds one record of its own to the
data topic, under :data:`FLUSH_POINT_KEY`, which no map key can equal: it starts with a zero
byte, the prefix of a map with an empty name (map names are never empty), and updates of a
plain map refuse it (:func:`check_update_key`). So does :data:`SETTINGS_KEY`, the first record
of the data topic's partition 0 in a map created with hash tags.

**Hash tags.** A map opened with ``hash_tags=True`` places a key that holds a tag, the bytes
between its first ``{`` and the next ``}`` when there are any, by the tag alone, so that keys
sharing a tag share a partition (Redis Cluster's convention: ``{user42}:balance`` and
``{user42}:orders``) and can change together in one transaction. Keys without a tag are placed
as always. The choice is made when the map is created and recorded in the data topic;
every replica must open the map with the same one (see
:func:`~kafkakv.map.topics.check_map_settings`).

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

from collections.abc import Sequence

from kafkakv.errors import EncodeError
from kafkakv.log.partitioner import partition_each, partition_for

__all__ = [
    "FLUSH_POINT_KEY",
    "RESERVED_KEYS",
    "SETTINGS_KEY",
    "KeySpace",
    "check_update_key",
    "hash_tag",
    "map_prefix",
    "prefix_of",
]

#: Key of the record that each flush adds to the data topic: its value is msgpack ``[X]``, the
#: last ops offset the flush covers. Compaction keeps the newest one per partition.
FLUSH_POINT_KEY = b"\x00kafkakv:flush-point"

#: Key of the record that holds the settings a map was created with, when they are not the
#: defaults: the first record of the data topic's partition 0, value msgpack
#: ``{"placement": "murmur2" | "hash-tags", "versions": bool}``.
SETTINGS_KEY = b"\x00kafkakv:settings"

#: The record keys of the data topic that are not map keys.
RESERVED_KEYS = (FLUSH_POINT_KEY, SETTINGS_KEY)


def check_update_key(record_key: bytes) -> None:
    """Refuse an update of ``record_key`` when it is the flush point's key (a plain map's key
    can be any bytes): flushed, it would read as a flush point. Raises
    :class:`~kafkakv.errors.EncodeError`.

    >>> check_update_key(b"\\x00other")
    >>> check_update_key(FLUSH_POINT_KEY)
    Traceback (most recent call last):
    ...
    kafkakv.errors.EncodeError: the key b'\\x00kafkakv:flush-point' is reserved for the data topic's own records
    """
    if record_key in RESERVED_KEYS:
        raise EncodeError(f"the key {record_key!r} is reserved for the data topic's own records")


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


def hash_tag(key: bytes) -> bytes | None:
    """The hash tag of ``key``: the bytes between its first ``{`` and the next ``}``, when
    there is such a pair with something between; else None.

    >>> hash_tag(b"{user42}:balance"), hash_tag(b"a{b}c{d}"), hash_tag(b"{}x"), hash_tag(b"{x")
    (b'user42', b'b', None, None)
    """
    start = key.find(b"{")
    if start < 0:
        return None
    end = key.find(b"}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1 : end]


class KeySpace:
    """The partitions of a set of map topics: which partition holds each record key.

    With ``hash_tags``, a record key's tag (looked for after the map prefix when ``shared``)
    places it instead of the whole key.

    >>> space = KeySpace(8, hash_tags=True)
    >>> space.partition_of(b"{u1}:a") == space.partition_of(b"{u1}:b") == space.partition_of(b"u1")
    True
    """

    __slots__ = ("count", "hash_tags", "skip")

    def __init__(self, count: int, hash_tags: bool = False, shared: bool = False) -> None:
        self.count = count
        self.hash_tags = hash_tags
        self.skip = shared  # the first byte says how long the prefix is

    def partition_of(self, record_key: bytes) -> int:
        """The partition of ``record_key`` (murmur2, as Kafka's producer); O(len(key))."""
        if self.count == 1:
            return 0
        if self.hash_tags:
            tag = hash_tag(record_key[record_key[0] + 1 :] if self.skip else record_key)
            if tag is not None:
                return partition_for(tag, self.count)
        return partition_for(record_key, self.count)

    def partitions_of(self, keys: Sequence[bytes], prefix: bytes = b"") -> list[int]:
        """The partition of the record key ``prefix + key`` of each of ``keys``: what
        :meth:`partition_of` says of each, in one call where no hash tags are involved.

        >>> space = KeySpace(8)
        >>> space.partitions_of([b"a", b"b"], b"\\x01m") == [
        ...     space.partition_of(b"\\x01ma"), space.partition_of(b"\\x01mb")]
        True
        """
        if self.count == 1:
            return [0] * len(keys)
        if self.hash_tags:
            return [self.partition_of(prefix + key) for key in keys]
        return partition_each(keys, self.count, prefix)
