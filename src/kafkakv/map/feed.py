"""The change feed of a map: every change, in log order per partition, from a cursor.

A :class:`Cursor` is a replica's position: for each partition it holds, the next ops offset.
``m.changes(since)`` returns a :class:`ChangeFeed`, an iterator (and async iterator) of
:class:`Change` ``(key, old, new, cursor)``; each change's cursor is the position just after
it, so a consumer that stores the cursor of the last change it handled and restarts with it
sees every later change once, and none before.

Where the changes come from:

* **Live** (``since=None``, or a cursor at the replica's position): a *tap* on the replica's
  own apply path (:meth:`~kafkakv.map.engine.ReplicaEngine.add_tap`) queues each change with
  the store's bytes as the replica applies it, under the replica lock, so none is missed or
  reordered. The consumer decodes them on its own thread.
* **Replayed** (a cursor behind the replica): a reference replica of the partition
  (:mod:`kafkakv.map.reference`, the engine's own bootstrap and apply code, as
  :mod:`kafkakv.map.deepcheck` uses) loads the data topic, applies the ops up to the cursor
  without reporting them, and then reports the changes from the cursor up to where the tap
  began. That needs the state at the cursor, and the data topic holds only each key's latest
  value as of the last flush: a cursor that a flush covered raises
  :class:`~kafkakv.errors.CursorExpiredError` (restart from ``m.snapshot()``, whose cursor is
  current). :func:`replay_changes` is that replay alone, as raw changes: a reader with no
  replica open (a Spark stream's task) uses it with a reference made from the log
  (:func:`~kafkakv.map.reference.reference_planned`).

A consumer that falls more than ``buffer`` changes behind the replica stops being queued
(memory stays bounded); once it has taken what was queued, the feed replays from its own
position as above and taps the replica again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from kafkakv.errors import (
    ClosedError,
    CursorError,
    CursorExpiredError,
    DecodeError,
    PartitionStalledError,
)
from kafkakv.map.machine import ChangeRun, MapState
from kafkakv.map.reference import rebuild, reference, replay
from kafkakv.store.memory import DictStore

if TYPE_CHECKING:
    from kafkakv.map.engine import ReplicaEngine

__all__ = [
    "Change",
    "ChangeFeed",
    "Cursor",
    "RawChange",
    "Snapshot",
    "cursor_texts",
    "replay_changes",
]

K = TypeVar("K")
V = TypeVar("V")

#: What a tap queues: partition, offset, key, old and new value, as the store holds them.
RawChange = tuple[int, int, bytes, bytes | None, bytes | None]

_BUFFER = 100_000  # changes queued for a consumer before it is left to catch up by replay
_REPLAY_STEP = 5_000  # ops replayed between hand-overs to the consumer
_WAIT_SLICE = 0.25  # a waiting consumer re-checks the replica (closed, stalled) this often


class Cursor(Mapping[int, int]):
    """A position in a map's ops topic: for each partition, the next offset. One record can
    change several keys (a batch, a transaction); a position inside such a record also
    says how many of its changes are behind: :meth:`skip`. Immutable and hashable.
    ``str(cursor)`` is ``"0:120,1:98+2"`` (partition:offset, by partition, ``+k`` for ``k``
    changes of that record already taken), which :meth:`parse` reads back.

    >>> c = Cursor({1: 98, 0: 120}, {1: 2})
    >>> str(c), Cursor.parse(str(c)) == c, c[1], c.skip(1), c.skip(0)
    ('0:120,1:98+2', True, 98, 2, 0)
    """

    __slots__ = ("_offsets", "_skips", "_text")

    def __init__(self, offsets: Mapping[int, int], skips: Mapping[int, int] | None = None) -> None:
        for p, offset in offsets.items():
            if type(p) is not int or type(offset) is not int or p < 0 or offset < 0:
                raise CursorError(f"a cursor maps partitions to offsets (ints >= 0), not {p!r}")
        self._set(dict(sorted(offsets.items())), skips or {})
        if (
            not self._skips.keys() <= self._offsets.keys()
            or min(self._skips.values(), default=1) < 0
        ):
            raise CursorError(f"skips {skips!r} do not fit the partitions {list(self._offsets)}")

    @classmethod
    def _of_feed(cls, offsets: Mapping[int, int], skips: Mapping[int, int]) -> Cursor:
        """A copy of a change feed's own position: partitions in order, offsets and skips
        valid by construction, so none of ``__init__``'s checks (a third of the cost of each
        change a feed hands out, in a profile of a stream's read)."""
        cursor = cls.__new__(cls)
        cursor._set(dict(offsets), skips)
        return cursor

    def _set(self, offsets: dict[int, int], skips: Mapping[int, int]) -> None:
        """Take ``offsets`` (in partition order) and the non-zero ``skips``; make the text."""
        self._offsets = offsets
        self._skips = {p: k for p, k in skips.items() if k}
        self._text = ",".join(
            f"{p}:{o}+{self._skips[p]}" if p in self._skips else f"{p}:{o}"
            for p, o in offsets.items()
        )

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """The cursor ``text`` (from ``str(cursor)``) stands for. Raises
        :class:`~kafkakv.errors.CursorError` when it does not parse.

        >>> Cursor.parse("x")
        Traceback (most recent call last):
        ...
        kafkakv.errors.CursorError: not a cursor: 'x' (expected partition:offset pairs, as '0:120,1:98')
        """
        offsets: dict[int, int] = {}
        skips: dict[int, int] = {}
        try:
            for pair in text.split(","):
                p, _, rest = pair.partition(":")
                offset, plus, skip = rest.partition("+")
                if not (p.isdigit() and offset.isdigit()) or int(p) in offsets:
                    raise ValueError(pair)
                if plus and not skip.isdigit():
                    raise ValueError(pair)
                offsets[int(p)] = int(offset)
                if plus:
                    skips[int(p)] = int(skip)
        except (ValueError, AttributeError):
            raise CursorError(
                f"not a cursor: {text!r} (expected partition:offset pairs, as '0:120,1:98')"
            ) from None
        return cls(offsets, skips)

    def skip(self, partition: int) -> int:
        """How many changes of the record at ``self[partition]`` are behind the cursor."""
        return self._skips.get(partition, 0)

    def __getitem__(self, partition: int) -> int:
        return self._offsets[partition]

    def __iter__(self) -> Iterator[int]:
        return iter(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)

    def __hash__(self) -> int:
        return hash(self._text)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Cursor):
            return self._text == other._text
        return super().__eq__(other)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"Cursor({self._text!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Cursor, (self._offsets, self._skips))


class Change(NamedTuple, Generic[K, V]):
    """One change of a key: ``old`` and ``new`` are None when the key was absent before or
    after it. ``cursor`` is the position just after it (store it to resume there);
    ``partition`` and ``offset`` name the ops record that made it."""

    key: K
    old: V | None
    new: V | None
    cursor: Cursor
    partition: int
    offset: int


class Snapshot(NamedTuple, Generic[K, V]):
    """A map's contents at one position: ``changes(since=snapshot.cursor)`` goes on from it."""

    items: dict[K, V]
    cursor: Cursor


class ChangeFeed(Generic[K, V]):
    """The changes of one map from a cursor (see the module docstring). Iterate it, with
    ``for`` or ``async for``; each step waits at most ``timeout`` seconds for a change (None:
    for ever; the attribute may be changed between steps), then the iteration ends. Close it
    (or use ``with``) to stop following the map.

    A change whose key or value this replica's codecs cannot read raises
    :class:`~kafkakv.errors.DecodeError` from the step that reaches it; the position moves
    past it, so the next step goes on. A partition this replica stopped applying raises
    :class:`~kafkakv.errors.PartitionStalledError` once the changes before the stall are
    taken; a closed map, :class:`~kafkakv.errors.ClosedError`."""

    def __init__(
        self,
        engine: ReplicaEngine,
        state: MapState,
        since: Cursor | None,
        timeout: float | None,
        buffer: int = _BUFFER,
    ) -> None:
        if since is not None and set(since) != set(engine.held):
            raise CursorError(
                f"cursor {since} names partitions {sorted(since)}, but this replica of map "
                f"{state.name!r} holds {list(engine.held)}"
            )
        self._engine = engine
        self._state = state
        self.timeout = timeout
        self._buffer = buffer
        self._cond = threading.Condition()
        self._queue: collections.deque[RawChange] = collections.deque()  # filled by the tap
        self._overrun = False  # the tap stopped queueing: catch up by replay
        self._wakers: list[Callable[[], object]] = []  # waiting async consumers
        self._closed = False
        self._backlog: Generator[list[RawChange], None, None] | None = None  # replayed chunks
        self._chunk: collections.deque[RawChange] = collections.deque()  # the current one
        # The position: per partition the record the next change comes from, how many of
        # its changes were taken (the cursor's skip) and how many seen in this pass.
        self._position: dict[int, int] = {}
        self._taken = dict.fromkeys(engine.held, 0)
        self._seen = dict.fromkeys(engine.held, 0)
        if since is not None:  # learn of the flushes made so far (their FLUSHED marks)
            engine.sync(engine.held, None)
        start = self._attach()
        if since is None:
            self._position = start
            return
        self._position = dict(since)
        self._taken = {p: since.skip(p) for p in engine.held}
        try:
            ops = engine.topics.ops
            for p in engine.held:
                end = engine.log.end_offset(ops, p)
                if since[p] > start[p] and since[p] > end:
                    raise CursorError(
                        f"cursor {since} points past the end of {ops}[{p}] ({end}): a cursor "
                        "of another map or log?"
                    )
            self._replay_behind(start)
        except BaseException:
            self.close()
            raise

    # -- following the replica -------------------------------------------------------------
    def _attach(self) -> dict[int, int]:
        """Tap the replica; the positions from which the tap queues every change. The tap
        holds the feed weakly: a feed dropped without close() detaches at the next change."""
        engine, state, feed = self._engine, self._state, weakref.ref(self)

        def tap(p: int, offset: int, key: bytes, old: bytes | None, new: bytes | None) -> None:
            live = feed()
            if live is None:
                engine.remove_tap(state, tap)
            else:
                live._take(p, offset, key, old, new)

        self._tap = tap
        positions = engine.add_tap(state, tap)
        self._flushed = {p: pos.flushed for p, pos in positions.items()}
        return {p: pos.applied for p, pos in positions.items()}

    def _take(self, p: int, offset: int, key: bytes, old: bytes | None, new: bytes | None) -> None:
        """The tap: queue a change (replica lock held)."""
        with self._cond:
            if self._overrun:
                return
            if len(self._queue) >= self._buffer:
                self._overrun = True  # the consumer replays from its position later
                self._engine.remove_tap(self._state, self._tap)
            else:
                self._queue.append((p, offset, key, old, new))
            self._cond.notify_all()
            wakers, self._wakers = self._wakers, []
        for wake in wakers:
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits there
                wake()

    def _replay_behind(self, start: dict[int, int]) -> None:
        """Replay, before the tap's changes, those from this feed's position up to ``start``
        (where the tap begins); raise CursorExpiredError when a flush this replica applied
        covered the position."""
        for p in self._engine.held:
            if self._position[p] <= self._flushed[p]:
                raise self._expired(p, self._position[p], self._flushed[p])
        self._seen = dict.fromkeys(self._engine.held, 0)  # records are told from their start
        behind = {p: (o, start[p]) for p, o in self._position.items() if o < start[p]}
        if behind:
            self._backlog = self._replay(behind)

    def _expired(self, p: int, offset: int, flushed: int) -> CursorExpiredError:
        return _expired(self._state.name, p, offset, flushed)

    def _replay(self, ranges: dict[int, tuple[int, int]]) -> Generator[list[RawChange], None, None]:
        """The changes of each partition ``p`` at offsets ``ranges[p] = (since, stop)``,
        told by a reference replica (see the module docstring), one partition after another,
        in chunks of whole records."""
        engine = self._engine
        for p, (since, stop) in sorted(ranges.items()):
            state = self._state
            ref_state = MapState(state.name, state.prefix, state.keys, state.values, DictStore())
            ref = reference(engine, ref_state)  # one per partition: memory is freed between
            try:
                reached = yield from _as_raw(p, replay_changes(ref, p, since, stop))
            finally:
                ref.close()
            if reached < stop:  # the log ended before ops this replica applied: it went away
                raise ClosedError(
                    f"{engine.topics.ops}[{p}] ends before offset {stop}, which this replica "
                    "applied"
                )

    # -- taking changes ---------------------------------------------------------------------
    @property
    def cursor(self) -> Cursor:
        """The position after every change taken so far, moved on to the replica's position
        when nothing is left to take: store it to resume where this feed is."""
        engine = self._engine
        if self._backlog is None and not self._chunk and not self._overrun and not self._closed:
            # The changes applied so far are all queued by now.
            with engine.paused(), self._cond:
                if not self._queue and not self._overrun:
                    for p, pos in engine.positions().items():
                        if pos.applied > self._position[p]:
                            self._moved(p, pos.applied)
        return Cursor._of_feed(self._position, self._taken)

    def _moved(self, p: int, offset: int) -> None:
        self._position[p] = offset
        self._taken[p] = self._seen[p] = 0

    def _poll(self) -> Change[K, V] | None:
        """The next change taken without waiting for the replica, or None (may read the log
        to replay)."""
        if self._closed:
            raise ClosedError("the change feed is closed")
        while True:
            if self._chunk:
                item = self._chunk.popleft()
                last = not self._chunk or self._chunk[0][:2] != item[:2]  # chunks: whole records
            elif self._backlog is not None:
                chunk = next(self._backlog, None)
                if chunk is None:
                    self._backlog = None
                else:
                    self._chunk.extend(chunk)
                continue
            else:
                with self._cond:
                    got = self._queue.popleft() if self._queue else None
                    overrun = got is None and self._overrun
                if got is None:
                    if not overrun:
                        return None
                    self._catch_up()
                    continue
                item, last = got, self._ends_record(got)
            change = self._change(item, last)
            if change is not None:
                return change

    def _ends_record(self, item: RawChange) -> bool:
        """Whether ``item`` is the last change of its record among those queued. The tap
        queues a record's changes under the replica lock: with it held, an empty queue
        means the record is complete."""
        with self._cond:
            if self._queue:
                return self._queue[0][:2] != item[:2]
        with self._engine.paused(), self._cond:
            return not self._queue or self._queue[0][:2] != item[:2]

    def _catch_up(self) -> None:
        """The tap stopped queueing and the queue is empty: tap again, and replay from this
        feed's position up to where the new tap begins."""
        with self._cond:
            self._overrun = False
        self._replay_behind(self._attach())

    def _change(self, item: RawChange, last: bool) -> Change[K, V] | None:
        """The change ``item`` as the feed hands it out (None: behind the position), moving
        the position past it."""
        p, offset, key, old, new = item
        position = self._position[p]
        if offset < position:  # before the cursor (a tap begun behind it)
            return None
        if offset > position:
            self._moved(p, offset)
        self._seen[p] += 1
        if self._seen[p] <= self._taken[p]:  # taken before this pass (the cursor's skip)
            return None
        if last:
            self._moved(p, offset + 1)
        else:
            self._taken[p] += 1
        cursor = Cursor._of_feed(self._position, self._taken)
        state = self._state
        try:
            k = state.keys.decode(key)
            o = None if old is None else state.values.decode(old)
            n = None if new is None else state.values.decode(new)
        except DecodeError as exc:
            raise DecodeError(
                f"the change at offset {offset} of partition {p} of map {state.name!r} does "
                f"not decode here (the feed moved past it, to {cursor}): {exc}"
            ) from exc
        return Change(k, o, n, cursor, p, offset)

    def _check_replica(self) -> None:
        """Raise what stops the live changes: a closed or failed replica, a stall reached."""
        self._engine.check_usable()
        for p, stall in list(self._engine.stalled.items()):
            if self._position[p] >= stall.offset:
                raise PartitionStalledError(
                    str(stall), partition=p, offset=stall.offset, function=stall.function
                )

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def __iter__(self) -> ChangeFeed[K, V]:
        return self

    def __next__(self) -> Change[K, V]:
        deadline = self._deadline()
        while True:
            change = self._poll()
            if change is not None:
                return change
            self._check_replica()
            wait = _slice(deadline)
            if wait <= 0:
                raise StopIteration
            with self._cond:
                if not self._queue and not self._overrun:
                    self._cond.wait(wait)

    def __aiter__(self) -> ChangeFeed[K, V]:
        return self

    async def __anext__(self) -> Change[K, V]:
        """As ``next``, without blocking the event loop: replaying reads run in a thread."""
        loop = asyncio.get_running_loop()
        deadline = self._deadline()
        while True:
            if self._backlog is not None or self._chunk or self._overrun:
                change = await asyncio.to_thread(self._poll)
            else:
                change = self._poll()
            if change is not None:
                return change
            self._check_replica()
            wait = _slice(deadline)
            if wait <= 0:
                raise StopAsyncIteration
            woken = asyncio.Event()
            with self._cond:
                if self._queue or self._overrun:
                    continue
                self._wakers.append(functools.partial(loop.call_soon_threadsafe, woken.set))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), wait)

    def close(self) -> None:
        """Stop following the map (idempotent); further steps raise ClosedError."""
        if self._closed:
            return
        self._closed = True
        self._engine.remove_tap(self._state, self._tap)
        backlog, self._backlog = self._backlog, None
        if isinstance(backlog, Generator):
            # A step replaying in another thread (an async step's worker, whose caller was
            # cancelled) may be inside it: it then ends when that step lets go of it.
            with contextlib.suppress(ValueError):  # "generator already executing"
                backlog.close()
        with self._cond:
            self._queue.clear()
            self._cond.notify_all()

    def __enter__(self) -> ChangeFeed[K, V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _slice(deadline: float | None) -> float:
    """How long a waiting step sleeps before it looks again (<= 0: its time is up)."""
    if deadline is None:
        return _WAIT_SLICE
    return min(_WAIT_SLICE, deadline - time.monotonic())


def replay_changes(
    ref: ReplicaEngine, p: int, since: int, stop: int
) -> Generator[ChangeRun, None, int]:
    """The changes of partition ``p`` at ops offsets ``since`` up to ``stop``, told by ``ref``,
    a new reference replica (:mod:`kafkakv.map.reference`) of one map: loaded from the data
    topic, the ops replayed up to ``since`` untold, then up to ``stop`` with a tap. Yields
    them in chunks of whole records (the ops of about 5000 offsets each), each a
    :class:`~kafkakv.map.machine.ChangeRun` (columns: a bulk batch's changes are taken whole,
    no Python per change), and returns the
    offset reached: ``stop``, or less where the log ends first (the caller says what that
    means). Cost: each op from the last flush applied once; the data topic read once.

    A record that changes several keys (a batch, a transaction) gives several changes with
    its offset, all of them: from a cursor ``since+k``, the first ``k`` of the record at
    ``since`` are the caller's to leave out (:func:`cursor_texts` tells the cursors).

    Raises :class:`~kafkakv.errors.CursorExpiredError` when a flush covered ``since`` (the
    data topic holds only the state after it), before any chunk; the
    :class:`~kafkakv.errors.PartitionStalledError` of a stall before ``stop``, after the
    chunk before it; what reading the log raises.
    """
    state = ref.maps[0]
    flushed = rebuild(ref, p)
    if since <= flushed:
        raise _expired(state.name, p, since, flushed)
    replay(ref, p, since, keys=False)
    if ref.positions()[p].applied >= since:
        told = _Told()
        state.taps.append(told)
        while (applied := ref.positions()[p].applied) < stop:
            step = min(stop, applied + _REPLAY_STEP)
            replay(ref, p, step, keys=False)
            run = told.take()
            if run is not None:
                yield run
            if ref.positions()[p].applied < step:
                break  # a stall, or the end of the log
    stall = ref.stalled.get(p)
    if stall is not None and ref.positions()[p].applied < stop:
        raise stall
    return ref.positions()[p].applied


def cursor_texts(p: int, offsets: Sequence[int], skip: int = 0) -> list[str]:
    """The text of the cursor after each of consecutive changes of partition ``p``, from the
    ops offsets of their records, as a feed tells them (:meth:`ChangeFeed._change`). The
    changes are those of whole records but the first, of which ``skip`` changes come before
    them (a cursor's skip); a record's changes share its offset. After a record's last
    change the cursor is at the next record, after another at the same record with ``+j``
    (``j`` of its changes behind). A string each; no :class:`Cursor` made.

    >>> cursor_texts(0, [7, 8, 8, 8, 9])
    ['0:8', '0:8+1', '0:8+2', '0:9', '0:10']
    >>> cursor_texts(1, [8, 8, 9], skip=1) == [str(Cursor.parse("1:8+2")), "1:9", "1:10"]
    True
    """
    texts: list[str] = []
    last = len(offsets) - 1
    j = skip
    for i, offset in enumerate(offsets):
        if i < last and offsets[i + 1] == offset:
            j += 1
            texts.append(f"{p}:{offset}+{j}")
        else:
            texts.append(f"{p}:{offset + 1}")
            j = 0
    return texts


def _expired(name: str, p: int, offset: int, flushed: int) -> CursorExpiredError:
    return CursorExpiredError(
        f"the changes of map {name!r} from offset {offset} of partition {p} on are gone: a "
        f"flush covered the ops up to {flushed}, and the data topic keeps only the latest "
        "value of each key. Restart from m.snapshot() and its cursor",
        partition=p,
        flushed=flushed,
    )


class _Told:
    """A tap that keeps the changes it is told, as columns, until :meth:`take`."""

    __slots__ = ("_columns",)

    def __init__(self) -> None:
        self._columns: tuple[list[int], list[bytes], list[bytes | None], list[bytes | None]]
        self._columns = ([], [], [], [])

    def __call__(
        self, p: int, offset: int, key: bytes, old: bytes | None, new: bytes | None
    ) -> None:
        offsets, keys, olds, news = self._columns
        offsets.append(offset)
        keys.append(key)
        olds.append(old)
        news.append(new)

    def take_run(self, p: int, run: ChangeRun) -> None:
        offsets, keys, olds, news = self._columns
        offsets.extend(run.offsets)
        keys.extend(run.keys)
        olds.extend(run.olds)
        news.extend(run.news)

    def take(self) -> ChangeRun | None:
        """The changes told since the last take (None: none)."""
        if not self._columns[0]:
            return None
        run = ChangeRun(*self._columns)
        self._columns = ([], [], [], [])
        return run


def _as_raw(p: int, runs: Generator[ChangeRun, None, int]) -> Generator[list[RawChange], None, int]:
    """The chunks of :func:`replay_changes` of partition ``p`` as lists of raw changes."""
    while True:
        try:
            run = next(runs)
        except StopIteration as end:
            reached: int = end.value
            return reached
        yield list(zip(itertools.repeat(p), *run, strict=False))
