"""The replicated map as Python sees it: a ``MutableMapping`` plus atomic operations.

Reads are local (a dict or store lookup, no I/O) unless the map was opened with
``consistency="linearizable"``, which first waits for a barrier shared with concurrent readers.
Every update is one ops record appended to the log and applied by every replica in log order;
the calling thread returns once its own record is applied here (one append plus one read).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import operator
import time
from collections.abc import (
    Callable,
    ItemsView,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
    ValuesView,
)
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import msgpack

from kafkakv import functions
from kafkakv.errors import (
    ConfigError,
    CrossPartitionError,
    CursorError,
    DecodeError,
    EncodeError,
    OperationTimeoutError,
    PartitionStalledError,
    UnknownFunctionError,
    WrongPartitionError,
)
from kafkakv.lifecycle import Closeable
from kafkakv.map.deepcheck import deep_check
from kafkakv.map.engine import ReplicaEngine
from kafkakv.map.expiry import view_of
from kafkakv.map.feed import ChangeFeed, Cursor, Snapshot
from kafkakv.map.futures import OpFuture
from kafkakv.map.keyspace import check_update_key
from kafkakv.map.machine import ApplyError, Listener, MapState
from kafkakv.map.ops import OpCode
from kafkakv.map.reads import LocalReads
from kafkakv.store.base import OrderedStore

__all__ = ["ReplicaMap", "SortedReplicaMap"]

K = TypeVar("K")
V = TypeVar("V")
_MISSING: Any = object()


class ReplicaMap(LocalReads, MutableMapping[K, V], Closeable, Generic[K, V]):
    """One replica of a replicated map; open it with :meth:`kafkakv.Database.map`.

    Dict behaviour: ``m[k]``, ``get``, ``in``, ``len``, iteration, ``keys/items/values``,
    ``pop``, ``popitem``, ``setdefault``, ``update``, ``clear`` and ``==`` work as on a dict;
    each update is decided in log order, so ``pop`` and ``setdefault`` are atomic. ``None`` is
    not a value (it means "absent" in results and in compute functions).

    Raises :class:`~kafkakv.errors.EncodeError` (a ``TypeError``) for a key or value its codec
    cannot encode, before anything is appended; :class:`~kafkakv.errors.WrongPartitionError`
    for a key outside a sharded replica's partitions;
    :class:`~kafkakv.errors.OperationTimeoutError` when an update or barrier does not finish
    within the map's timeout; :class:`~kafkakv.errors.ClosedError` after :meth:`close`.
    """

    def __init__(self, engine: ReplicaEngine, state: MapState) -> None:
        self._engine = engine
        self._state = state
        # Reads of a map with expiry skip keys past their deadline (see kafkakv.map.expiry).
        self._store = (
            state.store
            if state.expiries is None
            else view_of(state.store, state.expiries, engine.paused(), engine.read_now)
        )
        self._keys = state.keys
        self._values = state.values
        self._prefix = state.prefix
        self._linearizable = engine.settings.consistency == "linearizable"
        self._direct = len(engine.held) == engine.partition_count
        self._single = engine.partition_count == 1
        # The short read paths (kafkakv.map.reads), for a replica that holds every partition
        # (so only the engine's read gate is left to check per read): the local path, over
        # the store's dict for local consistency, else the direct path, the store's lookup
        # after catching up with the log's end for a linearizable map.
        self._gate = engine.read_gate
        self._key_bytes = self._keys.fast_encode or self._keys.encode
        self._decode = None if self._values.decodes_as_is else self._values.decode
        local = self._direct and not self._linearizable
        self._table = self._store.table() if local else None
        self._lookup = self._store.lookup() if self._direct else None
        self._catch_up = engine.catch_up if self._linearizable else None
        self._end_watches = engine.end_watches if self._linearizable else None

    # -- identity -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._state.name

    @property
    def partitions(self) -> tuple[int, ...]:
        """The partitions this replica holds (all of them unless sharded)."""
        return self._engine.held

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self._engine.topics.data!r}>"

    # -- keys ---------------------------------------------------------------------------
    def _locate(self, key: K) -> tuple[bytes, bytes, int]:
        encoded = self._keys.encode(key)
        record_key = self._prefix + encoded
        engine = self._engine
        p = 0 if engine.partition_count == 1 else engine.partition_of(record_key)
        if not engine.holds(p):
            raise WrongPartitionError(
                f"key {key!r} is in partition {p}; this replica holds {list(self.partitions)}"
            )
        return encoded, record_key, p

    def partition_of(self, key: K) -> int:
        """The log partition of ``key`` (murmur2 of its record key, as Kafka's producer)."""
        return self._engine.partition_of(self._prefix + self._keys.encode(key))

    def _value(self, value: V) -> bytes:
        if value is None:
            raise EncodeError("None is not a value: use remove() to delete a key")
        return self._values.encode(value)

    # -- reads --------------------------------------------------------------------------
    def _barrier(self, p: int | None = None) -> None:
        engine = self._engine
        engine.check_usable()
        if engine.stalled:  # reads of a stalled partition raise PartitionStalledError
            engine.check_partitions(self.partitions if p is None else (p,))
        if self._linearizable:
            engine.sync(self.partitions if p is None else (p,), None)

    # m[k], get and `in` are LocalReads' (kafkakv.map.reads, in C where built): the local
    # and direct paths. The _checked_* methods take every other read (_locate, _barrier).
    if TYPE_CHECKING:  # at run time LocalReads' own (C slots where built) are the ones

        def __getitem__(self, key: K) -> V: ...

        def get(self, key: K, default: Any = None) -> Any:
            """The value of ``key`` or ``default``. A local lookup: O(1), no I/O."""

        def __contains__(self, key: object) -> bool: ...

    def _checked_getitem(self, key: K) -> V:
        encoded, _, p = self._locate(key)
        self._barrier(p)
        data = self._store.get(encoded)
        if data is None:
            raise KeyError(key)
        return cast("V", self._values.decode(data))

    def _checked_get(self, key: K, default: Any) -> Any:
        encoded, _, p = self._locate(key)
        self._barrier(p)
        data = self._store.get(encoded)
        return default if data is None else self._values.decode(data)

    def _checked_contains(self, key: object) -> bool:
        try:
            encoded, _, p = self._locate(cast("K", key))
        except EncodeError:
            return False
        self._barrier(p)
        return encoded in self._store

    def __len__(self) -> int:
        """The number of keys, those that do not decode here left out (see :meth:`errors`)."""
        self._barrier()
        with self._engine.paused():  # counts from one state: see LiveView.__len__
            return len(self._store) - len(self._state.unreadable)

    def __iter__(self) -> Iterator[K]:
        self._barrier()
        decode, unreadable = self._keys.decode, self._state.unreadable
        for encoded in self._store:
            if unreadable and encoded in unreadable:
                continue
            try:
                yield decode(encoded)
            except DecodeError:  # stored before this process ran (a persistent store)
                self._note_unreadable(encoded)

    def items(self) -> ItemsView[K, V]:
        """A view whose iteration reads the store once (not one lookup per key)."""
        return _Items(self)

    def values(self) -> ValuesView[V]:
        return _Values(self)

    def _pairs(self) -> Iterator[tuple[K, V]]:
        self._barrier()
        return self._decoded()

    def _decoded(self) -> Iterator[tuple[K, V]]:
        kd, vd, unreadable = self._keys.decode, self._values.decode, self._state.unreadable
        for k, v in self._store.items():
            if unreadable and k in unreadable:
                continue
            try:
                yield kd(k), vd(v)
            except DecodeError:  # stored before this process ran (a persistent store)
                self._note_unreadable(k)

    def _note_unreadable(self, encoded: bytes) -> None:
        """A key or value found unreadable by a read rather than when it was applied: it sits
        in a persistent store since an earlier run. Reported once, offset unknown (-1)."""
        if encoded not in self._state.unreadable:
            error = ApplyError(
                self._engine.partition_of(self._prefix + encoded),
                -1,
                "stored as written (before this process started), but this replica's codecs "
                "cannot read it",
                self._prefix + encoded,
            )
            self._state.unreadable[encoded] = error
            self._engine.errors.append(error)

    # -- updates (sync) -----------------------------------------------------------------
    def _submit(
        self, code: OpCode, key: K, args: Sequence[Any], wait: bool, decode: bool = True
    ) -> OpFuture:
        _, record_key, p = self._locate(key)
        state = self._state if decode else None  # None: the future keeps the result's bytes
        return self._engine.submit(state, code, record_key, p, args, wait)

    def _call(self, code: OpCode, key: K, *args: Any, decode: bool = True) -> Any:
        _, record_key, p = self._locate(key)  # as _submit, one call fewer per sync update
        state = self._state if decode else None
        future = self._engine.submit(state, code, record_key, p, args, True)
        try:
            return future.result(timeout=self._engine.settings.timeout)
        except concurrent.futures.TimeoutError:
            raise OperationTimeoutError(f"{code.name} on {key!r} did not complete") from None

    def put(self, key: K, value: V, ttl: float | None = None) -> V | None:
        """Set ``key``; return the previous value or None. One append, one read. With ``ttl``
        (a map with ``expiry=True``), the key expires ``ttl`` seconds after the log stamped
        the update (the log's clock decides, not this process's): it then reads as
        absent everywhere and is removed (see docs/maps.md, "Expiry"); a put without
        ``ttl`` clears an expiry."""
        if ttl is not None:
            return cast("V | None", self._call(OpCode.PUT_FOR, key, *self._with_ttl(value, ttl)))
        return self._call(OpCode.PUT, key, self._value(value))  # type: ignore[no-any-return]

    def _with_ttl(self, value: V, ttl: float) -> tuple[bytes, int]:
        """The args of a ``PUT_FOR``: the value, and ``ttl`` in ms (every replica adds it to
        the record's timestamp: no clock of the writer's takes part)."""
        return self._value(value), self._ttl_ms(ttl)

    def _ttl_ms(self, ttl: float) -> int:
        if self._state.expiries is None:
            raise ConfigError(
                f"map {self.name!r} has no expiry: create it with expiry=True (every replica "
                "opens it so) to put keys with a ttl"
            )
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < 10**9:
            raise ConfigError(f"ttl is a positive number of seconds, not {ttl!r}")
        return max(1, round(ttl * 1000))

    def ttl(self, key: K) -> float | None:
        """The seconds ``key`` has left to live, or None when it does not expire. Raises
        KeyError when it is absent (or expired already). A map with ``expiry=True``. Counted
        by the log's clock as this replica can tell (see docs/maps.md, "Clocks and skew")."""
        if self._state.expiries is None:
            raise ConfigError(f"map {self.name!r} has no expiry: create it with expiry=True")
        encoded, _, p = self._locate(key)
        self._barrier(p)
        with self._engine.paused():
            deadline = self._state.expiries.get(encoded)
            present = self._store.get(encoded) is not None
        if not present:
            raise KeyError(key)
        if deadline is None:
            return None
        now = self._engine.log_now()
        if now is None:  # nothing learned of the log's clock yet: this process's clock
            now = time.time() * 1000
        return max(0.0, (deadline - now) / 1000)

    def __setitem__(self, key: K, value: V) -> None:
        # The previous value is not returned, so not decoded: replacing one that does not
        # decode here is no error.
        self._call(OpCode.PUT, key, self._value(value), decode=False)

    def put_if_absent(self, key: K, value: V) -> V | None:
        """Set ``key`` only if absent; return the value it already had (None: it was set).

        With local consistency a key already present here answers without an append."""
        encoded = self._value(value)
        if not self._linearizable:
            local = self._store.get(self._locate(key)[0])
            if local is not None:
                return cast("V", self._values.decode(local))
        return cast("V | None", self._call(OpCode.PUT_IF_ABSENT, key, encoded))

    def replace(self, key: K, value: V) -> V | None:
        """Set ``key`` only if present; return the previous value (None: nothing changed)."""
        return cast("V | None", self._call(OpCode.REPLACE, key, self._value(value)))

    def compare_and_set(self, key: K, expected: V | None, new: V) -> bool:
        """Set ``key`` to ``new`` if its value equals ``expected`` (None: if absent)."""
        old = None if expected is None else self._values.encode(expected)
        return bool(self._call(OpCode.COMPARE_AND_SET, key, old, self._value(new)))

    def transaction(
        self,
        expect: Mapping[K, V | None] | None = None,
        put: Mapping[K, V] | None = None,
        remove: Iterable[K] = (),
        *,
        expect_version: Mapping[K, int | None] | None = None,
    ) -> bool:
        """If every key of ``expect`` has its expected value (None: absent), and every key of
        ``expect_version`` its expected version (None: absent; a map with ``versions``),
        apply all of ``put`` and ``remove``, and return True; otherwise change nothing and
        return False. Decided in log order, the same on every replica: the whole
        transaction is one ops record, so it is atomic by construction. Values compare as in
        :meth:`compare_and_set`.

        Every key must lie in one partition (:meth:`partition_of`): keys that share a hash
        tag, the part between the first ``{`` and the next ``}`` when the map was opened
        with ``hash_tags=True``, always do. Raises
        :class:`~kafkakv.errors.CrossPartitionError` (naming the partitions and their keys)
        otherwise, ``ConfigError`` for a key both put and removed, nothing to do, or
        versions on a map without them, ``RecordTooLargeError`` when it does not fit one
        record; nothing is appended then. See docs/maps.md, "Transactions".
        """
        return bool(self._transaction(expect, put, remove, expect_version, True).result())

    def transaction_async(
        self,
        expect: Mapping[K, V | None] | None = None,
        put: Mapping[K, V] | None = None,
        remove: Iterable[K] = (),
        *,
        expect_version: Mapping[K, int | None] | None = None,
    ) -> OpFuture[bool]:
        """:meth:`transaction` without waiting: a future of its bool."""
        return self._transaction(expect, put, remove, expect_version, False)

    def _transaction(
        self,
        expect: Mapping[K, V | None] | None,
        put: Mapping[K, V] | None,
        remove: Iterable[K],
        expect_version: Mapping[K, int | None] | None,
        wait: bool,
    ) -> OpFuture[bool]:
        expect, put, removed = dict(expect or {}), dict(put or {}), list(dict.fromkeys(remove))
        versions = dict(expect_version or {})
        if versions:
            self._need_versions()
            for version in versions.values():
                _check_version(version)
        both = [k for k in removed if k in put]
        if both:
            raise ConfigError(f"a transaction cannot both put and remove {both!r}")
        if not (expect or versions or put or removed):
            raise ConfigError("an empty transaction: give expect, expect_version, put or remove")
        where: dict[int, list[object]] = {}
        located: dict[Any, tuple[bytes, bytes]] = {}
        for key in (*expect, *versions, *put, *removed):
            if key not in located:
                encoded, record_key, p = self._locate(key)
                located[key] = encoded, record_key
                where.setdefault(p, []).append(key)
        if len(where) > 1:
            listed = "; ".join(f"partition {p}: {keys!r}" for p, keys in sorted(where.items()))
            raise CrossPartitionError(
                f"the keys of a transaction must lie in one partition, not {len(where)} "
                f"({listed}); place them together with a hash tag (see docs/maps.md)",
                where,
            )
        if not self._prefix:
            for encoded, _ in located.values():
                check_update_key(encoded)
        encode = self._values.encode
        args = (
            [located[k][0] for k in expect],
            [None if v is None else encode(v) for v in expect.values()],
            [located[k][0] for k in versions],
            list(versions.values()),
            [located[k][0] for k in (*put, *removed)],
            [*map(self._value, put.values()), *([None] * len(removed))],
        )
        (p,) = where
        record_key = next(iter(located.values()))[1]
        return self._engine.submit(None, OpCode.TRANSACT, record_key, p, args, wait)

    # -- versions -------------------------------------------------------------------------
    def _need_versions(self) -> None:
        if self._state.versions is None:
            raise ConfigError(
                f"map {self.name!r} keeps no versions: create it with versions=True "
                "(every replica opens it so)"
            )

    def get_versioned(self, key: K) -> tuple[V, int] | None:
        """``(value, version)`` of ``key``, or None when absent, read together. The version is
        the ops offset of the key's last change (-1: loaded from a data record written
        without versions), the same on every replica. Needs a map with ``versions=True``.
        Local, like ``m[k]`` (after a barrier when the map is linearizable)."""
        self._need_versions()
        encoded, _, p = self._locate(key)
        self._barrier(p)
        versions = self._state.versions
        assert versions is not None
        with self._engine.paused():  # the value and its version from one state
            self._engine.check_usable()
            raw, version = self._store.get(encoded), versions.get(encoded)
        if raw is None or version is None:
            return None
        return self._values.decode(raw), version

    def compare_version_and_set(self, key: K, version: int | None, new: V) -> bool:
        """Set ``key`` to ``new`` if its version (:meth:`get_versioned`) is ``version``
        (None: if absent). Unlike :meth:`compare_and_set`, a value that changed and changed
        back does not match. Needs a map with ``versions=True``."""
        return bool(self._set_if_version(key, version, new, True).result())

    def compare_version_and_set_async(self, key: K, version: int | None, new: V) -> OpFuture[bool]:
        """:meth:`compare_version_and_set` without waiting."""
        return self._set_if_version(key, version, new, False)

    def _set_if_version(self, key: K, version: int | None, new: V, wait: bool) -> OpFuture[bool]:
        self._need_versions()
        _check_version(version)
        return self._submit(OpCode.SET_IF_VERSION, key, (version, self._value(new)), wait, False)

    def remove(self, key: K) -> V | None:
        """Delete ``key``; return the value it had or None."""
        return cast("V | None", self._call(OpCode.REMOVE, key))

    def remove_if(self, key: K, expected: V) -> bool:
        """Delete ``key`` if its value equals ``expected``."""
        return bool(self._call(OpCode.REMOVE_IF, key, self._value(expected)))

    def compute(
        self, key: K, fn: str | functions.RegisteredFunction[..., V | None], *args: Any
    ) -> V | None:
        """Run the registered function ``fn(key, old, *args)`` on every replica, once, in log
        order; its result becomes the value (None removes the key). Returns the new value.
        ``fn`` is a name, or the :class:`~kafkakv.functions.RegisteredFunction` that
        :func:`~kafkakv.functions.register` returned (typed: its result must fit ``V``).

        Only the name and ``args`` (msgpack-encodable) travel. Raises
        :class:`~kafkakv.errors.UnknownFunctionError` before appending when ``fn`` is not
        registered here, :class:`~kafkakv.errors.FunctionError` when it raised, and
        :class:`~kafkakv.errors.ResultTooLargeError` when its result, with the key, is larger
        than a record of the map's topics may hold (nothing changed).
        """
        return cast("V | None", self._call(OpCode.COMPUTE, key, *self._compute_args(fn, args)))

    def _compute_args(
        self, fn: str | functions.RegisteredFunction[..., V | None], args: tuple[Any, ...]
    ) -> tuple[str, bytes, int]:
        """The args of a ``COMPUTE``: the function's name, its extra args packed, the room."""
        name = _function_name(fn)
        try:
            packed = msgpack.packb(list(args), use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise EncodeError(f"compute arguments must be msgpack values: {exc}") from exc
        return name, packed, self._result_room()

    def _result_room(self) -> int:
        """The room of a computed value (see :mod:`kafkakv.map.ops`): what an update of this
        map may take, its prefix left out, as for a put."""
        return self._engine.max_record_bytes - len(self._state.prefix)

    def merge(
        self, key: K, value: V, fn: str | functions.RegisteredFunction[..., V | None]
    ) -> V | None:
        """Set ``value`` if ``key`` is absent, else ``fn(old, value)`` (None removes); raises
        as :meth:`compute` does."""
        name = _function_name(fn)
        args = (name, self._value(value), self._result_room())
        return cast("V | None", self._call(OpCode.MERGE, key, *args))

    def __delitem__(self, key: K) -> None:
        if self._call(OpCode.REMOVE, key, decode=False) is None:  # only "was it there?"
            raise KeyError(key)

    def pop(self, key: K, default: Any = _MISSING) -> Any:
        previous = self.remove(key)
        if previous is None:
            if default is _MISSING:
                raise KeyError(key)
            return default
        return previous

    def popitem(self) -> tuple[K, V]:
        """Remove and return some (key, value); KeyError when empty. Retries if another
        replica removes the chosen key first."""
        while True:
            key = next(iter(self), _MISSING)
            if key is _MISSING:
                raise KeyError("popitem(): map is empty")
            previous = self.remove(key)
            if previous is not None:
                return key, previous

    def setdefault(self, key: K, default: Any = None) -> Any:
        previous = self.put_if_absent(key, default)
        return default if previous is None else previous

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        """Put every pair, as :meth:`put_all` does (much faster than one by one)."""
        pairs: Iterable[tuple[Any, Any]]
        if isinstance(other, Mapping):
            pairs = other.items()
        elif hasattr(other, "keys"):
            # As dict.update: keys() and [] suffice; the object itself need not iterate (ruff's
            # SIM118 would drop the keys() call, which broke such objects once).
            keys = other.keys()
            pairs = ((k, other[k]) for k in keys)
        else:
            pairs = other
        self.put_all(itertools.chain(pairs, cast("Iterable[tuple[K, V]]", kwargs.items())))

    def put_all(
        self, pairs: Mapping[K, V] | Iterable[tuple[K, V]], ttl: float | None = None
    ) -> int:
        """Set each key to its value, as :meth:`put` would one by one, in a few large records:
        the fast way to write many keys. Returns how many of the keys had a value before.

        A key given twice takes its last value. The pairs of one partition go in records of
        up to 4,096 pairs, each applied at once by every replica; the batch as a whole is not
        atomic: when it fails (OperationTimeoutError, a log error), records before the failing
        one may have been applied. Raises EncodeError for a key or value the codecs refuse,
        and RecordTooLargeError for a pair over the topic's record limit, before anything is
        appended. ``ttl``: as for :meth:`put`, the same for every key."""
        return cast("int", self._wait(self._put_all(pairs, True, ttl), "put_all"))

    def remove_all(self, keys: Iterable[K]) -> int:
        """Delete each of ``keys``, as :meth:`remove` would one by one, in a few large records
        (see :meth:`put_all`). Returns how many of them had a value."""
        return cast("int", self._wait(self._remove_all(keys, True), "remove_all"))

    def _wait(self, future: OpFuture, what: str) -> Any:
        try:
            return future.result(timeout=self._engine.settings.timeout)
        except concurrent.futures.TimeoutError:
            raise OperationTimeoutError(f"{what} did not complete") from None

    def _put_all(
        self, pairs: Mapping[K, V] | Iterable[tuple[K, V]], wait: bool, ttl: float | None = None
    ) -> OpFuture:
        # One snapshot of the pairs (a mapping that changes meanwhile, another replica say,
        # could list its keys and its values in two orders); the last value of a key wins.
        latest = pairs if type(pairs) is dict else dict(_pairs_of(pairs))
        given = list(latest.values())
        if any(map(operator.is_, given, itertools.repeat(None))):  # C-level, identity only
            raise EncodeError("None is not a value: use remove_all() to delete keys")
        values = self._values.encode_many(given)
        ttl_ms = None if ttl is None else self._ttl_ms(ttl)
        return self._many(list(latest), values, wait, ttl_ms)

    def _remove_all(self, keys: Iterable[K], wait: bool) -> OpFuture:
        distinct = list(dict.fromkeys(keys))
        return self._many(distinct, [None] * len(distinct), wait)

    def _many(
        self,
        keys: list[K],
        values: Sequence[bytes | None],
        wait: bool,
        ttl_ms: int | None = None,
    ) -> OpFuture:
        encoded = self._keys.encode_many(keys)
        engine, prefix = self._engine, self._prefix
        partitions = None
        if engine.partition_count > 1:
            partitions = engine.keyspace.partitions_of(encoded, prefix)
            holds = engine.holds
            outside = sorted({p for p in partitions if not holds(p)})
            if outside:
                raise WrongPartitionError(
                    f"keys in partitions {outside}; this replica holds {list(self.partitions)}"
                )
        return engine.submit_many(self._state, encoded, values, partitions, wait, ttl_ms)

    def clear(self) -> None:
        """Remove every key this replica holds, as :meth:`remove_all` does."""
        self.remove_all(list(self))

    # -- updates (async) ----------------------------------------------------------------
    def put_async(self, key: K, value: V, ttl: float | None = None) -> OpFuture[V | None]:
        """Like :meth:`put`, returning at once a future of the previous value. At most
        ``max_in_flight`` are unapplied; beyond that the call waits (back-pressure)."""
        if ttl is not None:
            return self._submit(OpCode.PUT_FOR, key, self._with_ttl(value, ttl), False)
        if value is None:  # the hot path of bulk loads: _value and _submit inlined
            raise EncodeError("None is not a value: use remove() to delete a key")
        if self._single:  # one partition, held: no partition to find
            try:
                encoded, p = self._key_bytes(key), 0
            except Exception:  # _locate raises the typed error
                encoded, _, p = self._locate(key)
        else:
            encoded, _, p = self._locate(key)
        return self._engine.submit_put(self._state, encoded, self._values.encode(value), p)

    def put_all_async(
        self, pairs: Mapping[K, V] | Iterable[tuple[K, V]], ttl: float | None = None
    ) -> OpFuture[int]:
        """Like :meth:`put_all`, returning at once one future of the count. Its records take
        slots of ``max_in_flight`` (one per record)."""
        return self._put_all(pairs, False, ttl)

    def remove_all_async(self, keys: Iterable[K]) -> OpFuture[int]:
        """Like :meth:`remove_all`, returning at once one future of the count."""
        return self._remove_all(keys, False)

    def put_if_absent_async(self, key: K, value: V) -> OpFuture[V | None]:
        return self._submit(OpCode.PUT_IF_ABSENT, key, (self._value(value),), False)

    def replace_async(self, key: K, value: V) -> OpFuture[V | None]:
        return self._submit(OpCode.REPLACE, key, (self._value(value),), False)

    def compare_and_set_async(self, key: K, expected: V | None, new: V) -> OpFuture[bool]:
        old = None if expected is None else self._values.encode(expected)
        return self._submit(OpCode.COMPARE_AND_SET, key, (old, self._value(new)), False)

    def remove_async(self, key: K) -> OpFuture[V | None]:
        return self._submit(OpCode.REMOVE, key, (), False)

    def remove_if_async(self, key: K, expected: V) -> OpFuture[bool]:
        return self._submit(OpCode.REMOVE_IF, key, (self._value(expected),), False)

    def compute_async(
        self, key: K, fn: str | functions.RegisteredFunction[..., V | None], *args: Any
    ) -> OpFuture[V | None]:
        return self._submit(OpCode.COMPUTE, key, self._compute_args(fn, args), False)

    def merge_async(
        self, key: K, value: V, fn: str | functions.RegisteredFunction[..., V | None]
    ) -> OpFuture[V | None]:
        name = _function_name(fn)
        args = (name, self._value(value), self._result_room())
        return self._submit(OpCode.MERGE, key, args, False)

    # -- replica control ----------------------------------------------------------------
    def sync(self, timeout: float | None = None) -> None:
        """Afterwards this replica reflects every update completed anywhere before the call.

        One barrier per held partition, shared with concurrent callers. Raises
        :class:`~kafkakv.errors.OperationTimeoutError` after ``timeout`` (default: the map's).
        """
        self._engine.check_usable()
        self._engine.sync(self.partitions, timeout)

    # -- asyncio ----------------------------------------------------------------------
    # Updates have awaitable forms already (the *_async methods return futures that a
    # coroutine awaits without blocking); these are the calls that wait in the caller.
    async def sync_async(self, timeout: float | None = None) -> None:
        """:meth:`sync` without blocking the event loop (the barrier waits in a thread)."""
        await asyncio.to_thread(self.sync, timeout)

    async def get_async(self, key: K, default: Any = None) -> Any:
        """:meth:`get` for a coroutine: a local map answers at once; a linearizable map waits
        for its barrier in a worker thread, not on the event loop."""
        if not self._linearizable:
            return self.get(key, default)
        return await asyncio.to_thread(self.get, key, default)

    async def get_versioned_async(self, key: K) -> tuple[V, int] | None:
        """:meth:`get_versioned` without blocking the event loop."""
        return await asyncio.to_thread(self.get_versioned, key)

    async def snapshot_async(self) -> Snapshot[K, V]:
        """:meth:`snapshot` (every key and value, with its cursor) without blocking the event
        loop: O(n), in a worker thread."""
        return await asyncio.to_thread(self.snapshot)

    async def close_async(self) -> None:
        """:meth:`close` without blocking the event loop (draining runs in a worker thread)."""
        await asyncio.to_thread(self.close)

    def flush(self) -> None:
        """Flush every held partition to the data topic now (normally automatic), within the
        map's ``timeout`` for them all (then OperationTimeoutError)."""
        deadline = time.monotonic() + self._engine.settings.timeout
        for p in self.partitions:
            self._engine.flush(p, deadline)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(key, old, new, mine)`` once per real change, in log order per
        partition, on the thread that applied it; ``old``/``new`` are None when absent and
        ``mine`` is True for this replica's own updates. Keep listeners quick: updates of
        the map wait while one runs. An exception is logged and does not stop the replica.
        ``sync()`` promises the state, not that listeners running on another thread have
        returned."""
        self._state.listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._state.listeners.remove(listener)

    # -- the change feed (kafkakv.map.feed) ---------------------------------------------
    def cursor(self) -> Cursor:
        """This replica's position: for each partition held, the next ops offset to apply.
        Every change before it is in the local state; ``changes(since=...)`` resumes there."""
        return Cursor(self.applied_offsets())

    def changes(
        self, since: Cursor | str | None = None, timeout: float | None = None
    ) -> ChangeFeed[K, V]:
        """The changes of this map, in log order per partition, from cursor ``since`` (a
        :class:`~kafkakv.map.feed.Cursor` or its text; None: from now on), as
        :class:`~kafkakv.map.feed.Change` ``(key, old, new, cursor)``. Iterate it with
        ``for`` or ``async for``; each step waits at most ``timeout`` seconds for a change
        (None: for ever) before the iteration ends. Close it, or use ``with``.

        A consumer that stores the cursor of the last change it handled, and restarts with
        it, sees every later change once and none before. A cursor behind this replica is
        served by replaying the log from the last flush (the cost of opening a replica);
        one that a flush already covered raises
        :class:`~kafkakv.errors.CursorExpiredError` (here or, if a flush overtakes the
        replay, from the iteration): restart from :meth:`snapshot`. A cursor that does not
        parse, names other partitions or points past the log raises
        :class:`~kafkakv.errors.CursorError`. See docs/maps.md, "Change feed"."""
        if isinstance(since, str):
            since = Cursor.parse(since)
        elif since is not None and not isinstance(since, Cursor):
            raise CursorError(f"since takes a Cursor, its text or None, not {since!r}")
        if timeout is not None and timeout < 0:
            raise ConfigError(f"timeout must be >= 0 or None, not {timeout!r}")
        return ChangeFeed(self._engine, self._state, since, timeout)

    def snapshot(self) -> Snapshot[K, V]:
        """Every key and value (decoded, as ``dict(m.items())``) with the cursor of the
        position they were read at, taken with applying paused: ``changes(since=
        snapshot.cursor)`` goes on exactly from there. O(n) with updates waiting meanwhile;
        after a barrier when the map is linearizable."""
        self._barrier()
        with self._engine.paused():
            self._engine.check_usable()
            return Snapshot(dict(self._decoded()), self.cursor())

    def encoded_snapshot(self) -> Snapshot[bytes, bytes]:
        """As :meth:`snapshot`, with every key and value as its codec encoded it: nothing
        decoded, nothing left out (keys this replica's codecs cannot read included). What a
        backup writes (:mod:`kafkakv.map.backup`). O(n) with updates waiting meanwhile, but
        only to copy references: no encoding, no I/O."""
        self._barrier()
        with self._engine.paused():
            self._engine.check_usable()
            return Snapshot(dict(self._store.items()), self.cursor())

    @property
    def partition_count(self) -> int:
        """The number of partitions of the map's topics (:attr:`partitions`: those held)."""
        return self._engine.partition_count

    @property
    def codec_names(self) -> tuple[str, str]:
        """The names of this replica's key and value codecs, as ``("str", "json")``; a codec
        without a name is named by its class."""
        keys, values = self._keys, self._values
        return keys.name or type(keys).__name__, values.name or type(values).__name__

    @property
    def creation_options(self) -> dict[str, bool]:
        """The options fixed when the map was created, which every replica passes to
        :meth:`~kafkakv.Database.map` alike: ``{"hash_tags": ..., "versions": ...,
        "expiry": ...}``."""
        settings = self._engine.settings
        return {
            "hash_tags": bool(settings.hash_tags),
            "versions": bool(settings.versions),
            "expiry": bool(settings.expiry),
        }

    def encoded_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) pair as its codecs encoded it, for exporters that copy bytes
        (the Spark data source): no decoding, one pass over the store. Local, like ``items``
        (after a barrier when the map is linearizable)."""
        self._barrier()
        return self._store.items()

    def applied_offsets(self) -> dict[int, int]:
        """For each partition held, the ops offset the replica has applied up to (the next
        one it will apply): everything before it is reflected in the local state."""
        return {p: positions.applied for p, positions in self._engine.positions().items()}

    def flushed_offsets(self) -> dict[int, int]:
        """For each partition held, the last ops offset that the last flush this replica
        knows of covers (-1: none): the data topic holds every change up to it, that op's
        included."""
        return {p: positions.flushed for p, positions in self._engine.positions().items()}

    def end_offsets(self) -> dict[int, int]:
        """For each partition held, the end offset of the ops topic: one log request per
        partition (a round trip to the brokers on Kafka). ``end - applied`` is the lag."""
        engine = self._engine
        return {p: engine.log.end_offset(engine.topics.ops, p) for p in engine.held}

    def errors(self) -> list[ApplyError]:
        """Records refused or noted when applied (the latest 1000), oldest first: ops that
        failed or did not decode, keys and values stored as written that this replica's
        codecs cannot read (left out of iteration and ``len``; ``m[k]`` raises
        :class:`~kafkakv.errors.DecodeError`), and the record a partition stalled at."""
        return list(self._engine.errors)

    def unreadable(self) -> list[ApplyError]:
        """The keys this replica holds as written but leaves out of reads, because its codecs
        cannot read the key or its value: one error each, with partition, offset and key."""
        return list(self._state.unreadable.values())

    def stalled(self) -> dict[int, PartitionStalledError]:
        """The partitions this replica stopped applying, each with the error that says where
        and why (a compute or merge function not registered here). Empty as a rule."""
        return dict(self._engine.stalled)

    def check(self, deep: bool = False) -> list[str]:
        """Problems found by the store's self-check (empty: sound): its structure, O(n) in
        the store with no I/O.

        With ``deep``, also compare every key and value with the state the log gives at the
        position this replica has applied, and report each key that differs, is missing or
        is extra, as ``"partition P, key K: ..."``. That catches what the structure cannot
        show, such as a byte flipped inside a value on disk. It reads the data topic and the
        unflushed ops as opening a fresh replica does, holds a copy of the map in memory
        while it runs, and reads the store twice; the replica keeps applying, pausing only
        for the ops applied meanwhile and the keys found different (see
        :mod:`kafkakv.map.deepcheck` and docs/maps-operations.md for figures). Raises DataLossError when
        retention removed unflushed ops, OperationTimeoutError, ClosedError after close."""
        problems = self._store.check()
        if deep:
            problems += deep_check(self._engine, self._state)
        return problems

    def close(self) -> None:
        """Close this replica (and the other maps sharing its engine); pending updates fail
        with :class:`~kafkakv.errors.ClosedError`. Idempotent."""
        self._engine.close()

    def copy(self) -> dict[K, V]:
        """A plain dict of every (key, value) this replica holds now: a snapshot, that later
        updates leave as it is and whose own changes go nowhere. Local, like ``items()``
        (after a barrier when the map is linearizable): one pass over the store, decoding
        every pair, O(n). A sorted map gives its keys in order."""
        return dict(self._pairs())

    def __copy__(self) -> ReplicaMap[K, V]:
        """Refuse ``copy.copy(m)``: a copy would be a second handle on this replica (closing
        either would close both), and a dict in its place is not what ``copy.copy`` is
        typed to return. The TypeError says to take ``m.copy()``, a dict snapshot."""
        raise TypeError(self._not_copied("copy.copy"))

    def __deepcopy__(self, memo: dict[int, Any]) -> ReplicaMap[K, V]:
        """Refuse ``copy.deepcopy(m)``, as ``copy.copy(m)``: a replica cannot be duplicated;
        ``copy.deepcopy(m.copy())`` copies its contents."""
        raise TypeError(self._not_copied("copy.deepcopy"))

    def _not_copied(self, how: str) -> str:
        return (
            f"{how}() cannot copy a {type(self).__name__}: it is a live replica of map "
            f"{self.name!r}, and a copy would share it. Use m.copy() for a dict snapshot of "
            "its contents, or open the map again for another replica"
        )

    def __getstate__(self) -> object:
        """Refuse to pickle: a replica is threads and a log connection of this process. The
        TypeError says what to do instead: open the map in the other process, or pickle
        ``m.copy()`` to ship its contents."""
        raise TypeError(
            f"a {type(self).__name__} cannot be pickled: it is a live replica of map "
            f"{self.name!r} in this process. Open the map in the other process "
            f"(kafkakv.connect(...).map({self.name!r}, ...)), or pickle m.copy(), a dict "
            "snapshot of its contents"
        )


class SortedReplicaMap(ReplicaMap[K, V]):
    """A replicated map kept in key order (by the key codec's bytes, which for ``str``,
    ``bytes`` and ``int`` keys is their natural order), with range queries. O(log n) each."""

    _store: OrderedStore

    def _one(self, found: bytes | None) -> K | None:
        return None if found is None else cast("K", self._keys.decode(found))

    def first_key(self) -> K | None:
        self._barrier()
        return self._one(self._store.first())

    def last_key(self) -> K | None:
        self._barrier()
        return self._one(self._store.last())

    def floor_key(self, key: K) -> K | None:
        """The largest key ``<= key``, or None."""
        self._barrier()
        return self._one(self._store.floor(self._keys.encode(key)))

    def ceiling_key(self, key: K) -> K | None:
        """The smallest key ``>= key``, or None."""
        self._barrier()
        return self._one(self._store.ceiling(self._keys.encode(key)))

    def lower_key(self, key: K) -> K | None:
        self._barrier()
        return self._one(self._store.lower(self._keys.encode(key)))

    def higher_key(self, key: K) -> K | None:
        self._barrier()
        return self._one(self._store.higher(self._keys.encode(key)))

    def range(
        self,
        start: K | None = None,
        stop: K | None = None,
        *,
        inclusive: tuple[bool, bool] = (True, False),
        reverse: bool = False,
    ) -> Iterator[tuple[K, V]]:
        """(key, value) pairs from ``start`` to ``stop`` (None: unbounded), in key order or
        reversed; ``inclusive`` says whether each bound is included."""
        self._barrier()
        lo = None if start is None else self._keys.encode(start)
        hi = None if stop is None else self._keys.encode(stop)
        kd, vd = self._keys.decode, self._values.decode
        for k, v in self._store.range(lo, hi, inclusive=inclusive, reverse=reverse):
            yield kd(k), vd(v)

    def _pop_end(self, last: bool) -> tuple[K, V]:
        while True:
            self._barrier()
            found = self._store.last() if last else self._store.first()
            if found is None:
                raise KeyError("map is empty")
            key = cast("K", self._keys.decode(found))
            previous = self.remove(key)
            if previous is not None:  # else another replica removed it first: next one
                return key, previous

    def pop_first(self) -> tuple[K, V]:
        """Remove and return the smallest (key, value); KeyError when empty."""
        return self._pop_end(last=False)

    def pop_last(self) -> tuple[K, V]:
        """Remove and return the largest (key, value); KeyError when empty."""
        return self._pop_end(last=True)


class _Items(ItemsView[K, V]):
    _mapping: ReplicaMap[K, V]

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return self._mapping._pairs()


class _Values(ValuesView[V]):
    _mapping: ReplicaMap[Any, V]

    def __iter__(self) -> Iterator[V]:
        for _, v in self._mapping._pairs():
            yield v


def _pairs_of(pairs: Mapping[K, V] | Iterable[tuple[K, V]]) -> Iterable[tuple[K, V]]:
    return pairs.items() if isinstance(pairs, Mapping) else pairs


def _function_name(fn: str | Callable[..., Any]) -> str:
    """The registered name of ``fn``; UnknownFunctionError (nothing appended) if it has none."""
    if isinstance(fn, functions.RegisteredFunction):
        fn = fn.name
    if isinstance(fn, str):
        functions.lookup(fn)
        return fn
    for name in functions.registered():
        if functions.lookup(name) is fn:
            return name
    raise UnknownFunctionError(getattr(fn, "__qualname__", repr(fn)))


def _check_version(version: object) -> None:
    if version is not None and (type(version) is not int or version < -1):
        raise ConfigError(f"a version is an int >= -1 or None (absent), not {version!r}")
