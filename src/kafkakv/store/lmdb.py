"""A store on disk: :class:`LmdbStore`, an LMDB environment that survives restarts.

Layout: one directory (``data.mdb``, ``lock.mdb``) with two named databases. ``data`` maps
``b"k" + key`` to the value; the one-byte prefix lets the empty key be stored (LMDB refuses
empty keys) and keeps byte order. ``meta`` maps ``b"p" + partition`` (4 bytes, big-endian) to
``applied`` and ``flushed`` (two signed 8-byte big-endian ints). :meth:`LmdbStore.write` puts the
changes and the positions in one LMDB write transaction, so after a crash a reopened store
holds a batch and its offsets together, or neither.

Reads use a short read transaction each; iterations read chunks (32 growing to 1024 pairs), a
fresh transaction per chunk continuing after the last key seen, so a slow consumer never pins
old pages while writes go on. Keys are at most 510 bytes (LMDB's limit minus the prefix).

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as tmp, LmdbStore(tmp, sync=False) as store:
...     store.write({b"": b"empty", b"a": b"1"}, {3: Positions(applied=2)})
...     store.get(b""), store.last(), len(store), store.positions()
(b'empty', b'a', 2, {3: Positions(applied=2, flushed=-1)})
"""

from __future__ import annotations

import functools
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Concatenate, ParamSpec, TypeVar

import lmdb

from kafkakv.errors import ClosedError, StoreError
from kafkakv.store.base import OrderedStore, Positions
from kafkakv.store.memory import Bound, Inclusive, iter_chunks, position_problems

__all__ = ["LmdbStore"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

_K = b"k"  # prefix of every data key
_PARTITION = struct.Struct(">I")
_POSITIONS = struct.Struct(">qq")

_OPEN: set[str] = set()  # real paths of the environments open in this process
_OPEN_LOCK = threading.Lock()


def _meta_key(partition: int) -> bytes:
    return b"p" + _PARTITION.pack(partition)


def _guarded(
    method: Callable[Concatenate[LmdbStore, _P], _R],
) -> Callable[Concatenate[LmdbStore, _P], _R]:
    """Raise ClosedError after close(); translate lmdb.Error into StoreError."""

    @functools.wraps(method)
    def wrapper(self: LmdbStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self._closed:
            raise ClosedError(f"the store at {self.path} is closed")
        try:
            return method(self, *args, **kwargs)
        except lmdb.Error as exc:
            raise self._failure(exc) from exc

    return wrapper


class LmdbStore(OrderedStore):
    """An ordered, persistent store in the directory ``path`` (created if missing).

    ``map_size`` is the most the file may grow to (address space, not disk: the file grows as
    needed); ``sync=False`` skips fsync per write, which survives a process crash but may lose
    the last writes (or, per LMDB, corrupt the store) on an OS crash. One instance per
    directory per process. Costs: ``get`` and ``in`` O(log n) with no I/O when cached; ``len``
    O(1); :meth:`write` one transaction and, with ``sync``, one fsync. ``private=True`` creates
    the directory 0700 and the files 0600 (else 0777 and 0755, less the umask). Raises StoreError when
    ``path`` cannot be opened or is not an LMDB store, or is already open in this process.
    """

    persistent = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        map_size: int = 1 << 40,
        sync: bool = True,
        private: bool = False,
    ):
        self.path = os.fspath(path)
        self._sync = sync
        self._closed = True  # until open
        real = os.path.realpath(self.path)
        with _OPEN_LOCK:
            if real in _OPEN:
                raise StoreError(f"the LMDB store at {self.path} is already open in this process")
            try:
                os.makedirs(self.path, 0o700 if private else 0o777, exist_ok=True)
                self._env = lmdb.open(
                    self.path,
                    map_size=map_size,
                    subdir=True,
                    max_dbs=4,
                    lock=True,
                    writemap=False,
                    metasync=sync,
                    sync=sync,
                    readahead=False,
                    mode=0o600 if private else 0o755,  # 0o755: py-lmdb's default
                )
            except lmdb.InvalidError as exc:
                raise StoreError(f"{self.path} holds something that is not an LMDB store") from exc
            except (lmdb.Error, OSError) as exc:
                raise StoreError(f"cannot open the LMDB store at {self.path}: {exc}") from exc
            try:
                self._data = self._env.open_db(b"data")
                self._meta = self._env.open_db(b"meta")
            except lmdb.Error as exc:
                self._env.close()
                raise StoreError(f"cannot open the LMDB store at {self.path}: {exc}") from exc
            _OPEN.add(real)
        self._real = real
        self._max_key = self._env.max_key_size() - len(_K)
        self._closed = False

    def _failure(self, exc: lmdb.Error) -> Exception:
        if self._closed:
            return ClosedError(f"the store at {self.path} is closed")
        return StoreError(f"LMDB store at {self.path}: {exc}")

    # -- reads ------------------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` or ``None``: one read transaction, O(log n)."""
        try:
            if self._closed:
                raise ClosedError(f"the store at {self.path} is closed")
            with self._env.begin(db=self._data) as txn:
                return txn.get(_K + key)
        except lmdb.BadValsizeError:
            return None  # longer than any stored key
        except lmdb.Error as exc:
            raise self._failure(exc) from exc

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self.get(key) is not None

    @_guarded
    def __len__(self) -> int:
        """O(1): the entry count LMDB keeps."""
        with self._env.begin() as txn:
            return txn.stat(self._data)["entries"]

    @_guarded
    def keys(self) -> Iterator[bytes]:
        """Every key in order, lazily, one read transaction per chunk; values are not read."""
        read = functools.partial(self._read, values=False)
        return (k for k, _ in iter_chunks(read, None, None, (True, True), False))

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) in key order, lazily, one read transaction per chunk."""
        return self.range()

    @_guarded
    def range(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        inclusive: tuple[bool, bool] = (True, False),
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs in ``[start, stop)`` (per ``inclusive``), lazily: one read transaction and
        O(log n + chunk) per chunk. Raises ClosedError/StoreError, also while iterating."""
        return iter_chunks(self._read, start, stop, inclusive, reverse)

    @_guarded
    def _read(
        self, lo: Bound, hi: Bound, inc: Inclusive, reverse: bool, limit: int, values: bool = True
    ) -> list[tuple[bytes, bytes]]:
        """At most ``limit`` pairs in range, in one read transaction (values ``b""`` unless
        ``values``)."""
        n = self._max_key  # a bound longer than any key: compare with its prefix instead
        if lo is not None and len(lo) > n:
            lo, inc = lo[:n], (False, inc[1])
        if hi is not None and len(hi) > n:
            hi, inc = hi[:n], (inc[0], True)
        out: list[tuple[bytes, bytes]] = []
        with self._env.begin(db=self._data) as txn:
            cur = txn.cursor()
            if not reverse:
                ok = cur.first() if lo is None else cur.set_range(_K + lo)
                if ok and lo is not None and not inc[0] and cur.key() == _K + lo:
                    ok = cur.next()
                while ok and len(out) < limit:
                    k = cur.key()[1:]
                    if hi is not None and (k > hi or (k == hi and not inc[1])):
                        break
                    out.append((k, cur.value() if values else b""))
                    ok = cur.next()
            else:
                if hi is None or not cur.set_range(_K + hi):
                    ok = cur.last()
                else:
                    ok = True if cur.key() == _K + hi and inc[1] else cur.prev()
                while ok and len(out) < limit:
                    k = cur.key()[1:]
                    if lo is not None and (k < lo or (k == lo and not inc[0])):
                        break
                    out.append((k, cur.value() if values else b""))
                    ok = cur.prev()
        return out

    def _edge(self, lo: Bound, hi: Bound, inc: Inclusive, reverse: bool) -> bytes | None:
        found = self._read(lo, hi, inc, reverse, 1, values=False)
        return found[0][0] if found else None

    @_guarded
    def positions(self) -> dict[int, Positions]:
        """Every partition's positions: one read transaction, O(partitions). Raises
        StoreError for an entry that does not decode."""
        with self._env.begin(db=self._meta) as txn:
            entries = list(txn.cursor())
        found = {}
        for key, value in entries:
            if len(key) != 5 or key[:1] != b"p" or len(value) != _POSITIONS.size:
                raise StoreError(f"LMDB store at {self.path}: unreadable meta entry {key!r}")
            found[_PARTITION.unpack(key[1:])[0]] = Positions(*_POSITIONS.unpack(value))
        return found

    # -- writes -----------------------------------------------------------------------
    @_guarded
    def write(
        self, changes: Mapping[bytes, bytes | None], positions: Mapping[int, Positions]
    ) -> None:
        """Apply ``changes`` and ``positions`` in one write transaction (all or nothing), then
        fsync when ``sync``. O(len(changes) · log n). Raises StoreError (nothing written) for
        a key over 510 bytes, a full map (raise ``map_size``) or an I/O error."""
        with self._env.begin(write=True) as txn:
            data, limit = self._data, self._max_key
            for key, value in changes.items():
                if len(key) > limit:
                    raise StoreError(f"a key of {len(key)} bytes is over LMDB's {limit}")
                if value is None:
                    txn.delete(_K + key, db=data)
                else:
                    txn.put(_K + key, value, db=data)
            for p, pos in positions.items():
                txn.put(_meta_key(p), _POSITIONS.pack(pos.applied, pos.flushed), db=self._meta)

    @_guarded
    def drop_partition(self, partition: int, keys: Iterable[bytes] | None = None) -> None:
        """Forget ``partition``'s positions and delete ``keys`` in one write transaction."""
        with self._env.begin(write=True) as txn:
            txn.delete(_meta_key(partition), db=self._meta)
            for key in keys or ():
                if len(key) <= self._max_key:
                    txn.delete(_K + key, db=self._data)

    # -- lifecycle --------------------------------------------------------------------
    @_guarded
    def check(self) -> list[str]:
        """Decode every meta entry, check the positions' invariants and that every data key
        has the prefix and LMDB's entry count matches a full scan. O(n) in one read
        transaction (which holds old pages while it runs). Values are not read: a flipped
        byte inside one goes unseen here (``ReplicaMap.check(deep=True)`` compares them with
        the log)."""
        problems = []
        with self._env.begin() as txn:
            positions = {}
            for key, value in txn.cursor(self._meta):
                if len(key) != 5 or key[:1] != b"p" or len(value) != _POSITIONS.size:
                    problems.append(f"unreadable meta entry {key!r} = {value!r}")
                else:
                    positions[_PARTITION.unpack(key[1:])[0]] = Positions(*_POSITIONS.unpack(value))
            problems += position_problems(positions)
            count = unprefixed = 0
            for key in txn.cursor(self._data).iternext(values=False):
                count += 1
                unprefixed += not key.startswith(_K)
            if unprefixed:
                problems.append(f"{unprefixed} data keys lack the {_K!r} prefix")
            entries = txn.stat(self._data)["entries"]
            if entries != count:
                problems.append(f"LMDB counts {entries} entries but a scan finds {count}")
        return problems

    def close(self) -> None:
        """Flush (when not ``sync``) and close the environment. Idempotent."""
        with _OPEN_LOCK:
            if self._closed:
                return
            self._closed = True
            _OPEN.discard(self._real)
            try:
                if not self._sync:
                    self._env.sync(True)
            except lmdb.Error as exc:
                raise StoreError(f"LMDB store at {self.path}: {exc}") from exc
            finally:
                self._env.close()
