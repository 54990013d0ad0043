"""The local read path of a replica map: ``m[k]``, ``m.get(k)`` and ``k in m``.

A read of a map whose replica holds every partition, while its engine is open, has failed in
nothing and has no stalled partition (its read gate is open), takes one of two short paths:

- the local path, with local consistency over a store that keeps a dict
  (:meth:`kafkakv.store.base.Store.table`): one key encoding and one dict lookup;
- the direct path otherwise (a linearizable map, a store without a dict): encode the key,
  catch up with the log's end for a linearizable map, call the store's lookup. Catching up
  is skipped while the engine's end watches (:class:`PyEndWatch`, one per partition) all find
  the replica at the log's end: the head bytes each noted with its partition's end offset are
  still what the log's shared mapping holds, and the replica has applied up to that offset.
  (All of them, not the key's partition's alone: which partition a key is in is the keyspace's
  to say, in Python; a read that finds any partition moved catches up its own.)

:class:`LocalReads` takes them and hands every other read to the map's checked path
(``_checked_getitem``, ``_checked_get``, ``_checked_contains``): a sharded replica, a closed,
failed or stalled engine, a key its codec refuses.

Two implementations with one behaviour:

- ``kafkakv.map._reads``, a C type built from ``_reads.c`` when kafkakv is installed where a C
  compiler is (the build is optional: without one, installing still succeeds). A read through
  it makes no Python call for a ``str`` key and an as-is value codec (``bytes``), and what
  Python calls it makes (another key codec's encode, a value codec's decode) are made from C.
- :class:`PyLocalReads` and :class:`PyReadGate` below, the same in Python, used when the C type
  is not built or ``KAFKAKV_PURE_PYTHON=1`` is set in the environment.

:data:`COMPILED` says which one this process uses. ``tests/map/test_local_reads.py`` runs the
same reads through both and compares every result and error.

The fields (``_table``, ``_lookup``, ``_catch_up``, ``_end_watches``, ``_prefix``, ``_gate``,
``_key_bytes``, ``_decode``) are set by the map's ``__init__``; until then every read takes the
checked path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kafkakv._native import compiled

__all__ = [
    "COMPILED",
    "EndWatch",
    "LocalReads",
    "PyEndWatch",
    "PyLocalReads",
    "PyReadGate",
    "ReadGate",
]


class PyReadGate:
    """Whether a local read may skip every check: shared by the maps of one engine, which
    closes it on close, failure or a stall (see ``ReplicaEngine._checks_changed``). A read
    tests ``open`` every time, never a copy of it."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = True


class PyEndWatch:
    """Whether a linearizable map's replica is at the log's end, found without asking the
    log: the engine notes each end offset it catches up to, with the bytes of the log's shared
    mapping that showed it (:meth:`kafkakv.log.base.Log.end_mark`). While the mapping holds
    the same bytes nothing was appended, so once the partition's machine has applied up to
    that offset a read needs no catching up. Anything amiss (nothing noted, a closed mapping)
    answers False, and the read catches up the long way, which reports it."""

    __slots__ = ("_machine", "_mark")

    def __init__(self, machine: Any) -> None:
        self._machine = machine  # the partition's machine: its ``applied``
        self._mark: tuple[int, Any, bytes] | None = None  # one attribute: set as a whole

    def note(self, end: int, mapping: Any, raw: bytes) -> None:
        """Note that ``end`` was read from ``raw``, the first bytes of ``mapping``."""
        if type(raw) is not bytes:
            raise TypeError("note(): raw must be bytes")
        self._mark = (end, mapping, raw)

    def clear(self) -> None:
        self._mark = None

    def at_end(self) -> bool:
        mark = self._mark
        if mark is None:
            return False
        end, mapping, raw = mark
        try:
            same = mapping[: len(raw)] == raw
        except (ValueError, TypeError):  # a closed mapping
            return False
        applied = self._machine.applied
        return same and isinstance(applied, int) and applied >= end


_SHUT = PyReadGate()
_SHUT.open = False
_CHECKED = object()  # PyLocalReads._direct_data: take the checked path


class PyLocalReads:
    """``__getitem__``, ``get`` and ``__contains__`` of a replica map (see the module doc)."""

    __slots__ = (
        "_catch_up",
        "_decode",
        "_end_watches",
        "_gate",
        "_key_bytes",
        "_lookup",
        "_prefix",
        "_table",
    )

    # The local path: the store's dict. None: the map has none (see the direct path).
    _table: Mapping[bytes, Any] | None
    # The direct path, for a replica that holds every partition and has no local path (a
    # linearizable map, a store without a dict): the store's lookup (None: the map has no
    # direct path), and for a linearizable map what catches the replica up with the log's
    # end for a record key first (the engine's catch_up; None: local consistency).
    _lookup: Callable[[bytes], Any] | None
    _catch_up: Callable[[bytes], None] | None
    # Catching up is skipped while every one (one per partition) is at the end.
    _end_watches: tuple[PyEndWatch, ...] | None
    _prefix: bytes  # the map's record-key prefix (several maps per topic set)
    _gate: PyReadGate
    _key_bytes: Callable[[Any], bytes]  # the key codec's encode (may raise anything)
    _decode: Callable[[Any], Any] | None  # the value codec's decode; None: values as stored

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # As the C type's fields start out: no path until the map's __init__ sets one.
        self = super().__new__(cls)
        self._table = self._lookup = self._catch_up = self._end_watches = self._decode = None
        self._gate = _SHUT
        self._prefix = b""
        return self

    # The checked paths, which the map provides.
    def _checked_getitem(self, key: Any) -> Any:
        raise NotImplementedError

    def _checked_get(self, key: Any, default: Any) -> Any:
        raise NotImplementedError

    def _checked_contains(self, key: Any) -> bool:
        raise NotImplementedError

    def _direct_data(self, key: Any) -> Any:
        """The direct path: the stored data of ``key`` (None: absent), or _CHECKED when its
        codec refuses it (the checked path raises the typed error)."""
        lookup = self._lookup
        try:
            encoded = self._key_bytes(key)
        except Exception:
            return _CHECKED
        catch_up = self._catch_up
        if catch_up is not None:
            watches = self._end_watches
            if not watches or not all([watch.at_end() for watch in watches]):
                catch_up(self._prefix + encoded)
        return lookup(encoded)  # type: ignore[misc]

    # Each read on the local path: one call to encode the key and one lookup with [] or in,
    # no other call. A key its codec refuses takes the checked path, which raises the typed
    # error.
    def __getitem__(self, key: Any) -> Any:
        if self._gate.open:
            table = self._table
            if table is not None:
                try:
                    encoded = self._key_bytes(key)
                except Exception:
                    pass
                else:
                    try:
                        data = table[encoded]
                    except KeyError:
                        raise KeyError(key) from None
                    decode = self._decode
                    return data if decode is None else decode(data)
            elif self._lookup is not None:
                data = self._direct_data(key)
                if data is not _CHECKED:
                    if data is None:
                        raise KeyError(key) from None
                    decode = self._decode
                    return data if decode is None else decode(data)
        return self._checked_getitem(key)

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key`` or ``default``. A local lookup: O(1), no I/O."""
        if self._gate.open:
            table = self._table
            if table is not None:
                try:
                    encoded = self._key_bytes(key)
                except Exception:
                    pass
                else:
                    data = table.get(encoded)
                    if data is None:
                        return default
                    decode = self._decode
                    return data if decode is None else decode(data)
            elif self._lookup is not None:
                data = self._direct_data(key)
                if data is not _CHECKED:
                    if data is None:
                        return default
                    decode = self._decode
                    return data if decode is None else decode(data)
        return self._checked_get(key, default)

    def __contains__(self, key: object) -> bool:
        if self._gate.open:
            table = self._table
            if table is not None:
                try:
                    encoded = self._key_bytes(key)
                except Exception:
                    pass
                else:
                    return encoded in table
            elif self._lookup is not None:
                data = self._direct_data(key)
                if data is not _CHECKED:
                    return data is not None
        return self._checked_contains(key)


COMPILED = False
if TYPE_CHECKING:
    LocalReads = PyLocalReads
    ReadGate = PyReadGate
    EndWatch = PyEndWatch
else:
    LocalReads, ReadGate, EndWatch = PyLocalReads, PyReadGate, PyEndWatch
    _reads = compiled("kafkakv.map._reads")
    if _reads is not None:
        LocalReads, ReadGate, EndWatch = _reads.LocalReads, _reads.ReadGate, _reads.EndWatch
        COMPILED = True
