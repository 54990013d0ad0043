"""``Directory``: a read-only replica of any topic, loaded up to its end, then followed.

The thread shell around :mod:`kafkakv.directory.decode` (what each record means) and
:mod:`kafkakv.directory.table` (where entries live). One daemon thread per directory

1. captures the end offset of every partition it holds (the *targets*);
2. resumes from the positions a persistent table kept, or reads from the start;
3. reads each partition in large batches until its position reaches its target. Positions
   advance by :meth:`Log.read_batch`'s ``next_offset``, never by "the last record seen", so
   offsets that hold nothing to read (transaction markers, aborted or compacted records) at
   any place, the end included, cannot stall loading; an empty read is never taken for the
   end (a Kafka consumer may not have fetched up to the target yet). Then it is *ready*;
4. follows: waits for new records on all its partitions at once (:meth:`Log.wait_any`),
   applies them, calls listeners, and refreshes end offsets for the metrics once a second.

A log that is briefly unavailable (brokers down, a leader moving) is retried; reads keep
serving what was loaded. Any other log failure stops following and is kept in
:attr:`Directory.failure`; :meth:`Directory.wait_ready` raises it when it came before ready.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import (
    Callable,
    ItemsView,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    ValuesView,
)
from typing import Any, Generic, TypeVar, cast

from prometheus_client import CollectorRegistry

from kafkakv.codecs import Codec, codec_for
from kafkakv.directory.base import DirectoryState, Listener, RecordError, Table, Transform
from kafkakv.directory.decode import RecordDecoder
from kafkakv.directory.metrics import DirectoryMetrics
from kafkakv.directory.table import MemoryTable, StoreTable
from kafkakv.errors import (
    ClosedError,
    ConfigError,
    LogUnavailableError,
    OperationTimeoutError,
)
from kafkakv.gcpause import gc_paused
from kafkakv.lifecycle import Closeable
from kafkakv.log.base import Log
from kafkakv.log.follow import Follower
from kafkakv.store import Store, open_store

__all__ = ["Directory"]

log = logging.getLogger("kafkakv.directory")

K = TypeVar("K")
V = TypeVar("V")

_READ_RECORDS = 50_000  # records asked for per read while loading and following
_READ_BYTES = 64 << 20  # bytes asked for per read
_BATCHES_PER_TURN = 4  # batches read from one partition before looking at the others
_EMPTY_READ_PAUSE = 0.005  # before reading again below the target after an empty read
_WAIT_SLICE = 0.5  # the follower re-checks close() this often
_END_REFRESH = 1.0  # end offsets are asked for the metrics at most this often
_RETRY_PAUSE = 1.0  # after the log could not answer
_LOGGED_ERRORS = 5  # record errors logged per batch (all are kept in errors())


class Directory(Mapping[K, V], Closeable, Generic[K, V]):
    """A read-only mapping that holds every entry of ``topic`` and follows it.

    Open one with :meth:`kafkakv.Database.directory` (which also waits until it is ready), or
    construct it on a :class:`~kafkakv.log.Log` and call :meth:`start`. Each record becomes
    one change, as :class:`~kafkakv.directory.decode.RecordDecoder` decides: keys and values
    are decoded by ``key_codec`` and ``value_codec``; ``transform(record) -> (key, value) |
    None`` maps rows to entries; ``None`` values and tombstones delete.

    ``store``: ``"dict"`` (decoded objects in memory: the fastest reads), ``"sorted"`` or
    ``"lmdb"`` (bytes on disk in ``store_path``: survives restarts, which then read only the
    records added since, and may be larger than memory), or a
    :class:`~kafkakv.store.Store` (owned by the directory from then on).
    ``partitions``: the partitions to hold (default: all). ``name``: the label of its
    metrics (default: the topic); ``metrics``: the prometheus registry (default: the
    global one). ``max_errors``: how many record errors :meth:`errors` keeps (the oldest go).

    Reads (``[]``, ``get``, ``in``, ``len``, iteration, ``items``) are safe from any
    thread while the directory follows; each sees a batch of records entirely or not at all.
    Costs: with the dict store one dict operation, no I/O; with a store one lookup and one
    decode. Every read raises :class:`~kafkakv.errors.ClosedError` after :meth:`close`.

    Raises :class:`~kafkakv.errors.UnknownTopicError` for a missing topic,
    :class:`~kafkakv.errors.ConfigError` for a bad codec, store or partition, and
    :class:`~kafkakv.errors.StoreError` when the store cannot be opened.

    >>> import tempfile, kafkakv
    >>> from kafkakv.log import Record
    >>> from prometheus_client import CollectorRegistry
    >>> with kafkakv.connect(tempfile.mkdtemp()) as db:
    ...     db.log.create_topic("terminals", 1, {"cleanup.policy": "compact"})
    ...     _ = db.log.append("terminals", 0, [Record(b"t1", b'{"acquirer": "a1"}')])
    ...     d = db.directory("terminals", metrics=CollectorRegistry())
    ...     d.ready, d["t1"], len(d)
    (True, {'acquirer': 'a1'}, 1)
    """

    def __init__(
        self,
        log: Log,
        topic: str,
        *,
        key_codec: str | Codec[Any] = "str",
        value_codec: str | Codec[Any] = "json",
        transform: Transform | None = None,
        store: str | Store = "dict",
        store_path: str | os.PathLike[str] | None = None,
        partitions: Iterable[int] | None = None,
        name: str | None = None,
        metrics: CollectorRegistry | None = None,
        max_errors: int = 1000,
    ) -> None:
        keys, values = codec_for(key_codec), codec_for(value_codec)
        if transform is not None and not callable(transform):
            raise ConfigError(f"transform must be callable, not {transform!r}")
        if type(max_errors) is not int or max_errors < 1:
            raise ConfigError(f"max_errors is an int >= 1, not {max_errors!r}")
        count = log.partitions(topic)  # UnknownTopicError for a missing topic
        held = list(range(count)) if partitions is None else list(partitions)
        bad = [p for p in held if type(p) is not int or not 0 <= p < count]
        if bad or not held or len(set(held)) != len(held):
            raise ConfigError(
                f"partitions must name distinct partitions of {topic!r} (0..{count - 1}), "
                f"not {held}"
            )
        self.log = log
        self.topic = topic
        self.name = topic if name is None else name
        self.partitions: tuple[int, ...] = tuple(sorted(held))
        self._table = self._open_table(store, store_path, keys, values)
        try:
            kept = set(self._table.positions()) - set(self.partitions)
            if kept:
                raise ConfigError(
                    f"the store holds partitions {sorted(kept)} of {topic!r}, which this "
                    f"directory does not: open it with the same partitions, or another store"
                )
            self._metrics = DirectoryMetrics(self.name, topic, self.partitions, metrics)
        except BaseException:
            self._table.close()
            raise
        encode = self._table.encode if self._table.encodes else None
        self._decoder = RecordDecoder(keys, values, transform, encode)
        self._state = DirectoryState.NEW
        self._cond = threading.Condition()
        self._apply_lock = threading.Lock()  # the table is never closed during an apply
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: list[Listener] = []
        self._errors: collections.deque[RecordError] = collections.deque(maxlen=max_errors)
        self._positions: dict[int, int] = {}
        self._targets: dict[int, int] = {}
        self._ends: dict[int, int] = {}
        self._started = 0.0
        self._ready_at: float | None = None
        self.records_applied = 0
        """Records read and applied (errors included) since this object started."""
        self.error_count = 0
        """Records skipped as errors since this object started (:meth:`errors` keeps the
        latest ``max_errors``)."""
        self.failure: BaseException | None = None
        """The error that stopped following, or ``None``."""
        self._on_close: list[Callable[[Directory[Any, Any]], None]] = []  # Database's hook

    @staticmethod
    def _open_table(
        store: str | Store,
        path: str | os.PathLike[str] | None,
        keys: Codec[Any],
        values: Codec[Any],
    ) -> Table[Any, Any]:
        if isinstance(store, Store):
            if path is not None:
                raise ConfigError("store_path goes with a store name, not a Store object")
            return StoreTable(store, keys, values)
        if store == "dict":
            if path is not None:
                raise ConfigError("the 'dict' store is in memory: it takes no store_path")
            return MemoryTable()
        if not isinstance(store, str):
            raise ConfigError(f"store is 'dict', 'sorted', 'lmdb' or a Store, not {store!r}")
        return StoreTable(open_store(store, path=path), keys, values)

    def __repr__(self) -> str:
        return f"<Directory {self.name!r} on {self.topic!r} {self._state.value}>"

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def state(self) -> DirectoryState:
        return self._state

    @property
    def ready(self) -> bool:
        """True once everything present at :meth:`start` has been loaded (stays True)."""
        return self._ready_at is not None

    @property
    def ready_seconds(self) -> float | None:
        """Seconds from :meth:`start` to ready, or ``None`` before."""
        return None if self._ready_at is None else self._ready_at - self._started

    def start(self) -> None:
        """Start loading in the background and return at once; idempotent. Use
        :meth:`wait_ready` or :attr:`ready` to learn when it is loaded. Raises ClosedError
        after close."""
        with self._cond:
            if self._state is DirectoryState.CLOSED:
                raise ClosedError(f"directory {self.name!r} is closed")
            if self._state is not DirectoryState.NEW:
                return
            self._state = DirectoryState.LOADING
            self._started = time.monotonic()
            self._thread = threading.Thread(
                target=self._run, name=f"kafkakv-directory-{self.name}", daemon=True
            )
            self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until ready (at most ``timeout`` seconds; ``None``: no limit).

        Raises :class:`~kafkakv.errors.OperationTimeoutError` when time runs out (the
        directory goes on loading), the log's error when loading failed for good,
        :class:`~kafkakv.errors.ClosedError` when closed first, and
        :class:`~kafkakv.errors.ConfigError` when it was never started.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._ready_at is None or self._state is DirectoryState.CLOSED:
                if self._state is DirectoryState.NEW:
                    raise ConfigError(f"directory {self.name!r} was not started: call start()")
                if self._state is DirectoryState.CLOSED:
                    raise ClosedError(f"directory {self.name!r} was closed before it was ready")
                if self._state is DirectoryState.FAILED and self.failure is not None:
                    raise self.failure
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise OperationTimeoutError(
                        f"directory {self.name!r} on {self.topic!r} is not ready after "
                        f"{timeout} s: positions {self.positions()}, end offsets at start "
                        f"{dict(self._targets) or 'not known yet'}"
                    )
                self._cond.wait(_WAIT_SLICE if left is None else min(left, _WAIT_SLICE))

    def close(self) -> None:
        """Stop following, close the store and remove the metrics. Idempotent; reads raise
        ClosedError afterwards. Waits only for a batch being applied; the thread ends within
        half a second."""
        with self._cond:
            if self._state is DirectoryState.CLOSED:
                return
            self._state = DirectoryState.CLOSED
            self._cond.notify_all()
        self._closing.set()
        # No join: the thread checks _closing under _apply_lock before it touches the
        # table, and ends by itself within one wait slice.
        with self._apply_lock:
            self._table.close()
        self._metrics.close()
        for callback in self._on_close:
            callback(self)

    # -- reads --------------------------------------------------------------------------
    def __getitem__(self, key: K) -> V:
        value = self._table.get(key)
        if value is None:
            raise KeyError(key)
        return cast(V, value)

    def get(self, key: K, default: Any = None) -> Any:
        """The value of ``key`` or ``default``: a local lookup, no I/O with the dict store."""
        value = self._table.get(key)
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return key in self._table

    def __len__(self) -> int:
        return len(self._table)

    def __iter__(self) -> Iterator[K]:
        """The keys of a snapshot (dict store: copied now, O(n)) or, with a store, read
        lazily in chunks while it may change."""
        return self._table.keys()

    def items(self) -> ItemsView[K, V]:
        """``(key, value)`` pairs, consistent per pair (never a key whose value is gone)."""
        return _Items(self)

    def values(self) -> ValuesView[V]:
        return _Values(self)

    # -- introspection ------------------------------------------------------------------
    def positions(self) -> dict[int, int]:
        """Per partition, the next offset to read."""
        return dict(self._positions)

    def end_offsets(self) -> dict[int, int]:
        """Per partition, the end offset captured at start (what readiness waits for)."""
        return dict(self._targets)

    def errors(self) -> list[RecordError]:
        """The latest records skipped as errors (at most ``max_errors``), oldest first."""
        return list(self._errors)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(key, old, new)`` after each change from now on, in log order, on
        the directory's thread (keep it short). A listener that raises is logged and does
        not stop the directory."""
        if not callable(listener):
            raise ConfigError(f"a listener must be callable, not {listener!r}")
        self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``; raises ValueError when it was not added."""
        listeners = list(self._listeners)
        listeners.remove(listener)
        self._listeners = listeners

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                if not self._targets:
                    self._begin()
                if self._ready_at is None:
                    self._load()
                    continue
                follower = Follower(
                    self.log,
                    f"directory {self.name}",
                    wait_slice=_WAIT_SLICE,
                    retry_pause=_RETRY_PAUSE,
                )
                follower.run(self._follow_positions, self._follow_ready, self._closing.is_set)
                return
            except ClosedError:
                if self._closing.is_set():
                    return
                self._fail(ClosedError("the log was closed under the directory"))
                return
            except (LogUnavailableError, OperationTimeoutError) as exc:
                if self._closing.is_set():
                    return
                log.warning("directory %s cannot read %s for now: %s", self.name, self.topic, exc)
                self._closing.wait(_RETRY_PAUSE)
            except Exception as exc:
                if self._closing.is_set():
                    return
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        log.error("directory %s stopped following %s: %s", self.name, self.topic, exc)
        with self._cond:
            self.failure = exc
            if self._state is not DirectoryState.CLOSED:
                self._state = DirectoryState.FAILED
            self._cond.notify_all()

    def _begin(self) -> None:
        """Capture the targets; resume from the table's positions or start over."""
        lg, topic = self.log, self.topic
        targets = {p: lg.end_offset(topic, p) for p in self.partitions}
        starts = {p: lg.start_offset(topic, p) for p in self.partitions}
        kept = self._table.positions()
        resumable = all(p in kept and starts[p] <= kept[p] <= targets[p] for p in self.partitions)
        if resumable:
            positions = {p: kept[p] for p in self.partitions}
        else:
            if kept or len(self._table):
                log.info("directory %s: the store cannot resume; loading anew", self.name)
                with self._apply_lock:
                    self._check_open()
                    self._table.clear()
            positions = starts
        self._positions = positions
        for p in self.partitions:
            self._metrics.set_position(p, positions[p])
            self._metrics.set_end(p, targets[p])
        self._ends = dict(targets)
        self._targets = targets

    def _check_open(self) -> None:
        if self._closing.is_set():
            raise ClosedError(f"directory {self.name!r} is closed")

    def _load(self) -> None:
        # The collector stays paused for the whole load, not per batch: what a load allocates
        # (decoded rows) cannot form cycles, and with the pause lifted between batches every
        # full collection scans every row loaded so far (quadratic-ish in the table's size).
        with gc_paused():
            self._load_partitions()
        self._finish_load()

    def _load_partitions(self) -> None:
        for p in self.partitions:
            target = self._targets[p]
            while self._positions[p] < target:
                self._check_open()
                position = self._positions[p]
                if not self._read(p) and self._positions[p] == position:
                    # An empty read that did not move: the log has not delivered what lies
                    # below the target yet (a Kafka consumer whose last fetch is older than
                    # the target). Never take that for the end: ask again shortly. Gaps are
                    # stepped over by read_batch's next offset, so this cannot spin forever
                    # on a log that keeps its contract; wait_ready's timeout bounds it anyway.
                    self._closing.wait(_EMPTY_READ_PAUSE)

    def _finish_load(self) -> None:
        with self._apply_lock:  # every partition's position, even those with no records
            self._check_open()
            self._table.apply([], self._positions, None)
        entries = len(self._table)
        self._metrics.entries.set(entries)
        now = time.monotonic()
        self._metrics.set_ready(now - self._started)
        # Logged before waiters wake: whoever waited for readiness finds the line written.
        log.info(
            "directory %s ready: %d keys from %d records of %s (%d partitions) in %.3f s, "
            "%d errors",
            self.name,
            entries,
            self.records_applied,
            self.topic,
            len(self.partitions),
            now - self._started,
            self.error_count,
        )
        with self._cond:
            self._ready_at = now
            if self._state is DirectoryState.LOADING:
                self._state = DirectoryState.READY
            self._cond.notify_all()

    def _follow_positions(self) -> dict[tuple[str, int], int]:
        """Where the follower waits; refreshes the end offsets of the metrics now and then."""
        if time.monotonic() - self._last_refresh >= _END_REFRESH:
            self._last_refresh = time.monotonic()
            for p in self.partitions:
                self._metrics.set_end(p, self.log.end_offset(self.topic, p))
        return {(self.topic, p): self._positions[p] for p in self.partitions}

    def _follow_ready(self, ready: Sequence[tuple[str, int]]) -> bool:
        found = False
        for _, p in sorted(ready):
            for _ in range(_BATCHES_PER_TURN):  # a busy partition does not starve the others
                if not self._read(p):
                    break
                found = True
                self._check_open()
        self._metrics.entries.set(len(self._table))
        return found

    _last_refresh = 0.0

    def _read(self, p: int) -> bool:
        """Read one batch of ``p`` and apply it; False when there was nothing to read."""
        position = self._positions[p]
        with gc_paused():  # thousands of short-lived objects per batch: see gcpause
            if self._decoder.plain:  # entries are enough, unless the batch needs more
                entries, after = self.log.read_entries(
                    self.topic, p, position, max_records=_READ_RECORDS, max_bytes=_READ_BYTES
                )
                changes = self._decoder.decode_entries(entries) if entries else []
                if changes is not None:
                    if entries:
                        after = max(after, entries[-1][2] + 1)
                    elif after <= position:
                        return False
                    self._apply(p, changes, [], len(entries), after)
                    return bool(entries)
            # A transform, or a batch with a record that fails: full records, one by one.
            records, after = self.log.read_batch(
                self.topic, p, position, max_records=_READ_RECORDS, max_bytes=_READ_BYTES
            )
            if not records:
                if after > position:  # offsets that hold nothing to see: step over them
                    self._apply(p, [], [], 0, after)
                return False
            last = records[-1].offset
            after = max(after, (last if last is not None else -1) + 1)
            changes, errors = self._decoder.decode_each(records)
            self._apply(p, changes, errors, len(records), after)
        return True

    def _apply(
        self, p: int, changes: list[Any], errors: list[RecordError], count: int, after: int
    ) -> None:
        """Apply one batch's ``changes`` (from ``count`` records) and move ``p`` to ``after``."""
        listeners = self._listeners
        old: list[Any] | None = [] if listeners else None
        with self._apply_lock:
            self._check_open()
            self._table.apply(changes, {p: after}, old)
            self._positions[p] = after
        self.records_applied += count
        self._metrics.records.inc(count)
        self._metrics.set_position(p, after)
        if errors:
            self._record_errors(errors)
        if old is not None:
            self._notify(listeners, changes, old)

    def _record_errors(self, errors: list[RecordError]) -> None:
        self._errors.extend(errors)
        self.error_count += len(errors)
        self._metrics.errors.inc(len(errors))
        for error in errors[:_LOGGED_ERRORS]:
            log.warning("directory %s skipped a record: %s", self.name, error)
        if len(errors) > _LOGGED_ERRORS:
            log.warning(
                "directory %s skipped %d more records in this batch (see errors())",
                self.name,
                len(errors) - _LOGGED_ERRORS,
            )

    def _notify(self, listeners: list[Listener], changes: list[Any], old: list[Any]) -> None:
        for change, before in zip(changes, old, strict=True):
            key, new = change[0], change[1]
            try:
                if before is new or before == new:
                    continue
            except Exception:  # values that refuse comparison: report the change
                pass
            for listener in listeners:
                try:
                    listener(key, before, new)
                except Exception:
                    log.exception("a listener of directory %s raised", self.name)


class _Items(ItemsView[K, V]):
    """Items straight from the table: one pass, no lookup per key."""

    _mapping: Directory[K, V]

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return self._mapping._table.items()


class _Values(ValuesView[V]):
    _mapping: Directory[Any, V]

    def __iter__(self) -> Iterator[V]:
        return (v for _, v in self._mapping._table.items())
