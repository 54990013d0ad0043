"""Turning log records into directory changes: pure, no threads, no I/O.

:class:`RecordDecoder` decides, for each record of a batch, the change it stands for:

* a record whose key is one of a map's own (its flush points, its settings:
  :data:`~kafkakv.map.keyspace.RESERVED_KEYS`) is skipped, so a directory on a replicated
  map's data topic shows only the map's entries;
* a tombstone (``value is None``, or a value that decodes to ``None`` such as JSON ``null``)
  deletes the record's decoded key (the transform is not called: there is no row);
* otherwise key and value are decoded, then, with a transform, ``transform(record)`` decides:
  ``(key, value)`` sets the key, ``(key, None)`` deletes it, ``None`` deletes the record's
  own key;
* a record that fails any of these steps becomes a :class:`~kafkakv.directory.RecordError`
  and changes nothing.

>>> from kafkakv.codecs import codec_for
>>> from kafkakv.log import Record
>>> def active_only(r):
...     return (r.key, r.value["acquirerId"]) if r.value["isActive"] else None
>>> decoder = RecordDecoder(codec_for("str"), codec_for("json"), active_only)
>>> changes, errors = decoder.decode([
...     Record(b"t1", b'{"acquirerId": "a1", "isActive": true}', partition=0, offset=0),
...     Record(b"t2", b'{"acquirerId": "a2", "isActive": false}', partition=0, offset=1),
...     Record(b"t3", b"not json", partition=0, offset=2),
...     Record(b"t1", None, partition=0, offset=3),
... ])
>>> changes, [(e.offset, e.error.split(":")[0]) for e in errors]
([('t1', 'a1'), ('t2', None), ('t1', None)], [(2, 'JSONDecodeError')])
"""

from __future__ import annotations

import operator
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from kafkakv.codecs import Codec, JsonCodec, StrCodec
from kafkakv.directory.base import Change, DirectoryRecord, RecordError, Transform
from kafkakv.log.base import Entry, Record, new_tuple
from kafkakv.map.keyspace import RESERVED_KEYS

_RESERVED = frozenset(RESERVED_KEYS)  # a map's flush points and settings: not entries

__all__ = ["RecordDecoder", "fast_decoder"]

Encode = Callable[[Any, Any], tuple[bytes, bytes | None]]


_first = operator.itemgetter(0)
_key_value = operator.itemgetter(0, 1)


def fast_decoder(codec: Codec[Any]) -> Callable[[bytes], Any]:
    """The cheapest callable that decodes like ``codec``: ``orjson.loads`` for JSON and
    ``bytes.decode`` for str (the same results, one Python frame less per record), else
    ``codec.decode``. The callable may raise any exception for bad bytes.

    >>> from kafkakv.codecs import codec_for
    >>> fast_decoder(codec_for("json"))(b'{"a": 1}'), fast_decoder(codec_for("int"))(bytes(8))
    ({'a': 1}, -9223372036854775808)
    """
    if type(codec) is JsonCodec:
        return orjson.loads
    if type(codec) is StrCodec:
        return bytes.decode  # UTF-8, strict: what StrCodec.decode does for bytes
    return codec.decode


class RecordDecoder:
    """Decides the change each record stands for (see the module docstring).

    ``encode``, when given, also turns each change into bytes (a table that keeps bytes); a
    change that cannot be encoded is a record error too. Costs one key and one value decode
    per record, plus the transform and the encode when given.
    """

    def __init__(
        self,
        keys: Codec[Any],
        values: Codec[Any],
        transform: Transform | None = None,
        encode: Encode | None = None,
    ) -> None:
        self.keys = keys
        self.values = values
        self.transform = transform
        self.encode = encode
        self._key = fast_decoder(keys)
        self._value = fast_decoder(values)

    @property
    def plain(self) -> bool:
        """No transform and no encode: :meth:`decode_entries` can do the work."""
        return self.transform is None and self.encode is None

    def decode_entries(self, entries: Sequence[Entry]) -> list[Change] | None:
        """The changes of plain ``(key, value, offset)`` entries, or None when one of them
        fails: :meth:`decode_each` on the batch's full records then says which and why."""
        if not _RESERVED.isdisjoint(map(_first, entries)):  # a map's own records: no entries
            entries = [e for e in entries if e[0] not in _RESERVED]
        dkey: Callable[[Any], Any] = self._key  # a null key raises: the batch goes slow
        dvalue = self._value
        try:  # unpacked in place: no (key, value) pair built per entry, as _fast must
            return [(dkey(kb), None if vb is None else dvalue(vb)) for kb, vb, _ in entries]
        except Exception:
            return None

    def decode(self, records: Sequence[Record]) -> tuple[list[Change], list[RecordError]]:
        """The changes of ``records`` in order, and the records that failed."""
        if self.plain:
            changes = self._fast(records)
            if changes is not None:
                return changes, []
        return self.decode_each(records)

    def _fast(self, records: Sequence[Record]) -> list[Change] | None:
        """The common case at C speed: one comprehension over the key and value of records;
        flush points are dropped. None when any record fails."""
        if not _RESERVED.isdisjoint(map(_first, records)):  # a map's own records: no entries
            records = [r for r in records if r[0] not in _RESERVED]
        dkey, dvalue = self._key, self._value
        try:
            return [
                (dkey(kb), None if vb is None else dvalue(vb))
                for kb, vb in map(_key_value, records)
            ]
        except Exception:
            return None

    def decode_each(self, records: Sequence[Record]) -> tuple[list[Change], list[RecordError]]:
        """Record by record: the transform and encode, and an error for each record that
        fails (the others still count)."""
        changes: list[Change] = []
        errors: list[RecordError] = []
        dkey, dvalue = self._key, self._value
        transform, encode = self.transform, self.encode
        for kb, vb, headers, ts, p, offset in records:
            if kb in _RESERVED:
                continue
            try:
                if kb is None and transform is None:
                    raise ValueError(_NO_KEY)
                key = None if kb is None else dkey(kb)
                if vb is None:
                    value = None
                else:
                    value = dvalue(vb)
                    if transform is not None and value is not None:
                        row = new_tuple(
                            DirectoryRecord, (key, value, p or 0, offset or 0, headers, ts)
                        )
                        entry = transform(row)
                        if entry is None:
                            value = None
                        elif type(entry) is tuple and len(entry) == 2:
                            key, value = entry
                        else:
                            raise TypeError(
                                f"a transform returns (key, value) or None, not {entry!r:.80}"
                            )
                if key is None:
                    if value is None:
                        continue  # nothing to delete: a keyless record the transform dropped
                    raise ValueError("the transform gave the key None")
                if encode is None:
                    changes.append((key, value))
                else:
                    changes.append((key, value, *encode(key, value)))
            except Exception as exc:
                errors.append(_failure(p, offset, kb, exc))
        return changes, errors


_NO_KEY = "a record without a key (and no transform to give it one)"


def _failure(p: int | None, offset: int | None, key: bytes | None, exc: Exception) -> RecordError:
    error = f"{type(exc).__name__}: {exc}"
    text = "".join(traceback.format_exception(exc))
    return RecordError(p or 0, offset or 0, key, error, text)
