"""The map protocol of one partition as a state machine: plain state and pure steps.

A :class:`PartitionMachine` holds what a replica knows about one partition of its map topics:
the next ops offset to apply, the last one a flush covered, the keys changed since, and when
to flush next. :meth:`~PartitionMachine.apply_batch` takes a batch of ops records in log order
and returns a :class:`Step`: the changes to write to each map's store, the new positions, what
this replica's own updates were decided with, the records every replica refuses, a stall, and
whether a flush is due. It reads the stores and writes nothing; the engine
(:mod:`kafkakv.map.engine`) carries the step out: it writes the changes with the positions in
one store write, publishes the position, resolves futures and tells listeners.

The other decisions of the protocol live here too, as plain functions of their inputs: where a
new replica starts (:func:`start_point`), which keys a flush writes (:meth:`flush_plan`) and
the records it appends (:func:`flush_records`), what a bootstrap loads from a batch of data
records (:func:`load_batch`).

No threads, no log, no clock: ``tests/map/test_machine.py`` drives it with Hypothesis.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Literal, NamedTuple, cast

import msgpack
import msgspec

from kafkakv.codecs import Codec
from kafkakv.errors import (
    DataLossError,
    DecodeError,
    OperationFailedError,
    RepeatedUpdateError,
    UnknownFunctionError,
)
from kafkakv.log.base import Entry, Record, new_tuple, records_of
from kafkakv.map.dedup import AppliedIds, Replay
from kafkakv.map.keyspace import FLUSH_POINT_KEY, RESERVED_KEYS, SETTINGS_KEY, prefix_of
from kafkakv.map.ops import (
    KEEP,
    Keep,
    Op,
    OpCode,
    Transaction,
    decide,
    decode_op,
    encode_op,
    expectations_hold,
    put_deadline,
    transaction_args,
    write_many_args,
)
from kafkakv.store.base import Positions, Store

__all__ = [
    "CHANGE",
    "CHANGES",
    "EXPIRES_HEADER",
    "FAILED",
    "FLUSH_HEADERS_MAX",
    "RESULT",
    "VERSION_HEADER",
    "ApplyError",
    "ChangeRun",
    "ErrorLog",
    "Listener",
    "MapState",
    "MapTable",
    "PartitionMachine",
    "Step",
    "Tap",
    "flush_records",
    "load_batch",
    "load_headers",
    "load_latest",
    "read_flush_point",
    "read_flush_point_ids",
    "start_point",
]

#: A listener of a map: ``(key, old, new, mine)``.
Listener = Callable[[Any, Any, Any, bool], None]

#: A tap of a map (a change feed, :mod:`kafkakv.map.feed`): ``(partition, offset, key, old,
#: new)`` with the store's bytes, called as the change is applied, replica lock held. A tap
#: that also has a method ``take_run(partition, run)`` takes the changes of a bulk batch
#: (:class:`ChangeRun`) in one call instead (see :func:`kafkakv.map.listeners.tell_run`).
Tap = Callable[[int, int, bytes, bytes | None, bytes | None], None]


class ChangeRun(NamedTuple):
    """Consecutive changes of one partition, in log order, as columns: each change's ops
    offset, store key, old and new value (None: absent). A bulk batch tells its changes so
    (a ``CHANGES`` event), not one event each."""

    offsets: Sequence[int]
    keys: Sequence[bytes]
    olds: Sequence[bytes | None]
    news: Sequence[bytes | None]


@dataclass
class MapState:
    """One map held by an engine: how its keys look in records, its codecs, store, listeners."""

    name: str
    prefix: bytes
    keys: Codec[Any]
    values: Codec[Any]
    store: Store
    listeners: list[Listener] = field(default_factory=list)
    #: Change feeds following this map (see :data:`Tap`).
    taps: list[Tap] = field(default_factory=list)
    #: For a map with versions: each key's version, the ops offset of its last change (-1:
    #: loaded from a data record that did not say). None for a map without versions.
    versions: dict[bytes, int] | None = None
    #: For a map with expiry: the deadline (ms since the epoch) of each key put with a time
    #: to live. None for a map without expiry.
    expiries: dict[bytes, int] | None = None
    #: Store keys whose key or value this replica's codecs cannot read (a record another
    #: program wrote, a replica with other codecs): kept as written, so that every replica
    #: holds the same bytes, and left out of iteration and len() here.
    unreadable: dict[bytes, ApplyError] = field(default_factory=dict)


@dataclass(frozen=True)
class ApplyError:
    """A record that every replica refused the same way, or that stopped this one: an op that
    failed when applied, an ops record that did not decode, a data record whose key or value
    does not decode (``topic`` says which topic the offset is in). ``key`` is the record key
    (the map's prefix included), when it has one."""

    partition: int
    offset: int
    error: str
    key: bytes | None = None
    topic: str = ""


class ErrorLog(collections.deque[ApplyError]):
    """The latest 1000 records noted as errors, and how many were noted in all."""

    def __init__(self) -> None:
        super().__init__(maxlen=1000)
        self.total = 0

    def append(self, error: ApplyError) -> None:
        self.total += 1
        super().append(error)

    def extend(self, errors: Iterable[ApplyError]) -> None:
        for error in errors:
            self.append(error)


class MapTable:
    """The maps that share one set of topics in an engine, found by record key."""

    __slots__ = ("_by_prefix", "maps", "plain")

    def __init__(self, maps: Sequence[MapState]) -> None:
        self.maps = list(maps)
        #: One map that has its topics to itself: record key = store key.
        self.plain = len(maps) == 1 and maps[0].prefix == b""
        self._by_prefix = {m.prefix: m for m in maps}

    def state_for(self, key: bytes | None) -> MapState | None:
        """The map whose record key ``key`` is, or None (no key, another map's key)."""
        if key is None:
            return None
        if self.plain:
            return self.maps[0]
        return self._by_prefix.get(prefix_of(key))


#: Kinds of :attr:`Step.events`, in log order: ``(RESULT, seq, result)`` an own update decided
#: (result as :func:`~kafkakv.map.ops.decide` returned it), ``(FAILED, seq, error)`` an own
#: update decided as failed, ``(CHANGE, map_state, (key, old, new, mine, offset))`` a key
#: changed (for listeners and taps), ``(CHANGES, map_state, ChangeRun)`` the changes of a bulk
#: batch (of a map with taps and no listeners), ahead of the batch's results.
RESULT: Literal[0] = 0
FAILED: Literal[1] = 1
CHANGE: Literal[2] = 2
CHANGES: Literal[3] = 3

#: Offsets of ``Stall``: the record that stopped the partition, its key, and why.
Stall = tuple[int, bytes | None, UnknownFunctionError]


class Step:
    """What applying one batch decided, for the engine to carry out in this order: write
    ``changes`` (per map, keyed by ``id(map_state)``; each value new bytes or None for removed)
    with ``Positions(applied, flushed)`` to every store, publish ``applied``, note ``errors``
    and the ``stall``, queue a flush when ``flush_due``, then run ``events``. ``updates``
    counts the update records decided (whatever their outcome; not control records, records
    that do not decode, nor those after a stall)."""

    __slots__ = (
        "applied",
        "changes",
        "early",
        "errors",
        "events",
        "expiring",
        "flush_due",
        "flushed",
        "forgotten",
        "log_time",
        "stall",
        "updates",
    )

    def __init__(self) -> None:
        self.applied = 0
        self.flushed = -1
        self.changes: dict[int, dict[bytes, bytes | None]] = {}
        self.events: list[tuple[int, Any, Any]] = []
        self.errors: list[ApplyError] = []
        self.stall: Stall | None = None
        self.flush_due = False
        #: ``(deadline, record key)`` of each key given a deadline (for the engine's reaper);
        #: an empty tuple until there is one (most steps: no list to make).
        self.expiring: list[tuple[int, bytes]] | tuple[()] = ()
        #: ``(map state, key)`` of each removed key whose deadline goes once the store no
        #: longer holds it (:meth:`PartitionMachine._expire_at`); an empty tuple until one.
        self.forgotten: list[tuple[MapState, bytes]] | tuple[()] = ()
        #: The latest timestamp of the expiry records (a put with a ttl, ``EXPIRE``) decided
        #: (0: none): the engine learns the log's clock from it (:mod:`kafkakv.map.logclock`).
        self.log_time = 0
        #: The timestamp of the last ``EXPIRE`` decided as too early (0: none): the reaper
        #: that proposed it went by a clock ahead of the log's.
        self.early = 0
        self.updates = 0

    @property
    def positions(self) -> Positions:
        return new_tuple(Positions, (self.applied, self.flushed))


#: Batches at least this long try the bulk path of :meth:`PartitionMachine.apply_batch`.
BULK_MIN = 16

#: The codes the record loop compares every record with, as globals: a member looked up on
#: its enum class costs about 1,000 instructions in Python 3.11 (callgrind), a global a few.
_BARRIER = OpCode.BARRIER
_COMPUTE = OpCode.COMPUTE
_EXPIRE = OpCode.EXPIRE
_FLUSHED = OpCode.FLUSHED
_MERGE = OpCode.MERGE
_PUT = OpCode.PUT
_PUT_FOR = OpCode.PUT_FOR
_PUT_TTL = OpCode.PUT_TTL
_SET_IF_VERSION = OpCode.SET_IF_VERSION
_TRANSACT = OpCode.TRANSACT
_WRITE_MANY = OpCode.WRITE_MANY
_WRITE_MANY_TTL = OpCode.WRITE_MANY_TTL
_ORIGIN_OF, _SEQ_OF = operator.itemgetter(1), operator.itemgetter(2)  # of a decoded op


def _head(code: OpCode, args: int) -> bytes:
    """How the ops value of ``code`` with ``args`` args starts (its array's header, then the
    code), as encode_op writes it: counted by hand, TRANSACT's was an array of 7, not 9, and
    keys_of never saw the keys a transaction writes."""
    return encode_op(code, b"", 0, [None] * args)[:2]


#: How batches' ops values start: keys and values as their last two args (``WRITE_MANY``,
#: ``TRANSACT``), or as their first two (``WRITE_MANY_TTL``, ``PUT_FOR`` of several keys).
_LAST_PAIRS_HEADS = (_head(OpCode.WRITE_MANY, 2), _head(OpCode.TRANSACT, 6))
_FIRST_PAIRS_HEADS = (_head(OpCode.WRITE_MANY_TTL, 3), _head(OpCode.PUT_FOR, 3))
#: Decodes the value of a PUT of bytes (``[code, origin, seq, value]``) and refuses any other.
_decode_put = msgspec.msgpack.Decoder(tuple[Literal[1], bytes, int, bytes]).decode
assert OpCode.PUT.value == 1


class _Unnoted(dict[bytes, int]):
    """The ``dirty`` of a machine whose replica never flushes: every write is dropped, so it
    stays empty (see :meth:`PartitionMachine.as_reference`)."""

    __slots__ = ()

    def __setitem__(self, key: bytes, offset: int) -> None:
        pass

    def update(self, *args: Any, **kwargs: Any) -> None:
        pass


class PartitionMachine:
    """The protocol state of one partition (see the module docstring).

    ``applied`` is the next ops offset to apply, ``flushed`` the last one a flush covered
    (-1: none), ``dirty`` each record key changed since that flush point with the offset of
    its last change. ``origin`` identifies this replica's own updates in the ops records;
    every ``flush_period`` own ops a flush is due. ``topic`` names the ops topic in errors.
    ``updates`` counts the update records applied since the machine was made (see
    :attr:`Step.updates`; the records of a data topic loaded at bootstrap are not updates).
    ``ids`` are the update ids applied, so that none is applied twice
    (:mod:`kafkakv.map.dedup`; ``partitions``: the map's partition count).
    """

    __slots__ = (
        "applied",
        "checks_values",
        "dirty",
        "flush_asked",
        "flush_missed",
        "flush_period",
        "flushed",
        "ids",
        "maps",
        "next_flush",
        "origin",
        "partition",
        "topic",
        "updates",
    )

    def __init__(
        self,
        partition: int,
        maps: MapTable,
        origin: bytes,
        flush_period: int,
        topic: str = "",
        partitions: int = 1,
    ) -> None:
        self.partition = partition
        self.maps = maps
        self.origin = origin
        self.flush_period = flush_period
        self.topic = topic
        self.applied = 0
        self.flushed = -1
        self.updates = 0
        self.ids = AppliedIds(partition, partitions)
        self.dirty: dict[bytes, int] = {}
        #: Whether values applied are checked to read with the map's codecs (noted in its
        #: ``unreadable`` where they do not): see :meth:`as_reference`.
        self.checks_values = True
        #: The offset from which an own op makes a flush due.
        self.next_flush = flush_period - 1
        #: A flush is queued or running.
        self.flush_asked = False
        #: The last own op that crossed a flush mark while a flush was running (-1: none):
        #: :meth:`flush_ended` asks again for it, so no mark goes unflushed.
        self.flush_missed = -1

    def as_reference(self) -> None:
        """Keep no notes from now on that only a replica's own reader uses, for a reference
        replica's machine (:mod:`kafkakv.map.reference`): it never flushes, so it notes no
        dirty keys, and no one asks it which values do not read here, so it checks none (its
        stores and changes are the same). In the replay of a bulk load, the dirty keys cost
        about 4% and the check of the values about 8%."""
        self.dirty = _Unnoted()
        self.checks_values = False

    def start_at(self, positions: Positions, ids: AppliedIds | None = None) -> None:
        """Take ``positions`` (from a bootstrap or a resumed store) as the state's, and
        ``ids`` as the update ids applied up to them, when given."""
        self.applied, self.flushed = positions.applied, positions.flushed
        self.next_flush = self.flushed + self.flush_period
        if ids is not None:
            self.ids = ids

    # -- applying -------------------------------------------------------------------------
    def apply_batch(
        self, records: Sequence[Record], after: int, sent: Sequence[Op | None] | None = None
    ) -> Step:
        """Decide ``records``, ops records read from ``applied`` on in log order, up to offset
        ``after`` (exclusive; the next offset to read). Changes ``dirty``, the flush marks and
        the maps' ``unreadable`` notes; ``applied`` moves only with :meth:`advance`.

        ``sent``, for records this replica encoded itself, is the op of each record in turn:
        a record with an op is decided as it without decoding its value (the op must be what
        decoding gives: see :func:`~kafkakv.map.ops.sent_op`), one with None from its value.

        A record this replica cannot apply as the others do (a function not registered here)
        stalls the partition: the records before it are decided, it and those after are not,
        and the step's ``applied`` is its offset, so applying resumes there.
        """
        first = self.maps.maps[0]
        if (
            len(records) >= BULK_MIN
            and sent is None  # own records, bulk or not, are decided as they were sent
            and self.maps.plain
            and not (first.listeners or first.expiries)
        ):
            step = self.apply_puts(records, after)
            if step is not None:
                return step
        return self.apply_records(records, after, sent)

    def advance(self, step: Step) -> None:
        """The step's position is the state's now (after the engine wrote the step to the
        stores): the deadlines of the keys it removed go too (:meth:`_expire_at` says why
        only now), unless a later op of the step wrote the key again."""
        if step.applied < self.applied:
            raise AssertionError(f"position going back from {self.applied} to {step.applied}")
        for state, user_key in step.forgotten:
            if state.expiries is not None and state.store.get(user_key) is None:
                state.expiries.pop(user_key, None)
        self.applied = step.applied
        self.updates += step.updates

    def step_over(self, after: int) -> Step | None:
        """Offsets below ``after`` hold nothing to apply (Kafka's transaction markers): the
        step that moves the position on, with no change, for the engine to carry out like any
        other (so the stores record the position too). None when ``after`` is not ahead."""
        if after <= self.applied:
            return None
        step = Step()
        step.applied, step.flushed = after, self.flushed
        return step

    def apply_records(
        self, records: Sequence[Record], after: int, sent: Sequence[Op | None] | None = None
    ) -> Step:
        """:meth:`apply_batch` one record at a time: any batch."""
        p, ops, origin, ids = self.partition, self.topic, self.origin, self.ids
        writers, stride = ids.writers, ids.stride  # the next number of a writer, inline
        step = Step()
        changes, events, errors = step.changes, step.events, step.errors
        dirty = self.dirty
        last = self.applied - 1
        stalled = False  # True: stopped at the record at offset ``last``
        skipped = 0  # records decided that are no update: counted off the rare branches only
        table = self.maps
        plain = table.maps[0] if table.plain else None
        if plain is not None:  # one map, record key = store key: resolved once per batch
            plain_overlay: dict[bytes, bytes | None] = {}
            changes[id(plain)] = plain_overlay
        next_flush = self.next_flush
        ops_sent = iter(sent) if sent is not None else None
        for key, value, _, ts, _, offset in records:
            assert offset is not None
            last = offset
            op = next(ops_sent) if ops_sent is not None else None
            if op is not None:
                code, op_origin, seq, args = op
            else:
                try:
                    code, op_origin, seq, args = decode_op(value)
                except DecodeError as exc:
                    errors.append(ApplyError(p, offset, str(exc), key, ops))
                    skipped += 1
                    continue
            if code >= _BARRIER:  # control records
                skipped += 1
                if code is _FLUSHED:
                    self.mark_flushed(args[0], offset, ts)
                    next_flush = self.next_flush
                continue
            if key is None:
                skipped += 1
                continue
            mine = op_origin == origin
            # Noted as applied as it is decided; one that may stall (a function not
            # registered here) only once decided, since applying resumes at it.
            late = code is _COMPUTE or code is _MERGE
            writer = writers.get(op_origin)
            if writer is not None and seq == writer.nxt and not late:  # AppliedIds.take
                writer.nxt = seq + stride
                writer.last = offset
            elif ids.is_repeat(op_origin, seq) if late else not ids.take(op_origin, seq, offset):
                self._repeated(op_origin, seq, offset, key, mine, step)
                skipped += 1
                continue
            if plain is not None:
                state, user_key, overlay = plain, key, plain_overlay
            else:
                found = table.state_for(key)
                if found is None:
                    dirty[key] = offset  # another map's key: this replica cannot flush it
                    if late:
                        ids.admit(op_origin, seq, offset)
                    continue
                state = found
                user_key = key[len(state.prefix) :]
                overlay = changes.setdefault(id(state), {})
            current = overlay[user_key] if user_key in overlay else state.store.get(user_key)
            expiries = state.expiries
            if expiries and user_key in expiries and expiries[user_key] <= (ts or 0):
                stored, current = current, None  # expired by this record's time: absent
            new: bytes | Keep | None
            result: Any
            try:
                if code is _PUT and type(args[0]) is bytes:  # the common case, inline
                    result, new = current, args[0]
                elif (
                    code is _WRITE_MANY
                    or code is _WRITE_MANY_TTL
                    or (code is _PUT_FOR and len(args) == 3)
                ):
                    # Its changes are made; the result is the previous value of each pair.
                    result = self._write_many(
                        state, overlay, args, offset, mine, step, ts or 0, code
                    )
                    new = KEEP
                    if mine:  # toward the flush period, a batch counts as its pairs
                        next_flush -= len(args[0]) - 1
                        self.next_flush = next_flush
                elif code is _TRANSACT:  # its changes are made; the result is a bool
                    t = transaction_args(args)
                    result = self._transact(state, overlay, t, offset, mine, step, ts or 0)
                    new = KEEP
                    if mine and len(t.keys) > 1:  # as a batch
                        next_flush -= len(t.keys) - 1
                        self.next_flush = next_flush
                elif code is _SET_IF_VERSION:
                    expected_version, value = args
                    (version,) = _versions_of(state, [user_key])
                    result = (None if current is None else version) == expected_version
                    new = value if result and type(value) is bytes else KEEP
                    if result and new is KEEP:
                        raise OperationFailedError("SET_IF_VERSION needs a bytes value")
                elif code is _PUT_TTL or code is _PUT_FOR:
                    _expiries_of(state)
                    value = args[0]
                    put_deadline(code, args, ts or 0)  # raises for a malformed one
                    if type(value) is not bytes:
                        raise OperationFailedError(f"{code.name} needs a bytes value")
                    result, new = current, value
                    step.log_time = max(step.log_time, ts or 0)
                elif code is _EXPIRE:
                    (deadline,) = args
                    result = (
                        current is None
                        and expiries is not None
                        and expiries.get(user_key) == deadline
                        and overlay.get(user_key, state.store.get(user_key)) is not None
                    )
                    if result:
                        current = stored  # removed: the change is from the expired value
                    else:
                        _expire_too_early(step, expiries, key, user_key, args[0], current, ts)
                    new = None if result else KEEP
                    step.log_time = max(step.log_time, ts or 0)
                else:
                    result, new = decide(code, args, current, user_key, state.keys, state.values)
            except UnknownFunctionError as exc:
                # The other replicas may well know it: stop here rather than skip the record.
                step.stall = (offset, key, exc)
                stalled = True
                break
            except OperationFailedError as exc:
                if late:
                    ids.admit(op_origin, seq, offset)
                errors.append(ApplyError(p, offset, str(exc), key, ops))
                if mine:
                    events.append((FAILED, seq, exc))
                continue
            if late:
                ids.admit(op_origin, seq, offset)
            if new is not KEEP and new != current:
                overlay[user_key] = new
                dirty[key] = offset
                self._changed(state, key, user_key, current, new, offset, mine, step)
            if expiries is not None and new is not KEEP:
                deadline = _put_deadline(code, args, ts or 0)
                self._expire_at(state, key, user_key, deadline, offset, step, new is None)
            if mine:
                events.append((RESULT, seq, result))
                if offset >= next_flush:
                    self._crossed(offset, step)
                    next_flush = self.next_flush
        step.applied = last if stalled else max(after, last + 1)
        step.flushed = self.flushed
        decided = [r[5] for r in records].index(last) if stalled else len(records)
        step.updates = decided - skipped
        return step

    def _repeated(
        self, origin: bytes, seq: int, offset: int, key: bytes, mine: bool, step: Step
    ) -> None:
        """The update at ``offset`` repeats one applied before: note it, change nothing. Its
        writer's future, if still waiting (the record came after its number was forgotten),
        fails; after a first copy was applied, nobody waits for it any more."""
        error = RepeatedUpdateError(
            f"update {seq} of origin {origin.hex()} was applied before (a record the "
            "transport wrote twice): not applied again"
        )
        step.errors.append(ApplyError(self.partition, offset, str(error), key, self.topic))
        if mine:
            step.events.append((FAILED, seq, error))

    def _changed(
        self,
        state: MapState,
        key: bytes,
        user_key: bytes,
        current: bytes | None,
        new: bytes | None,
        offset: int,
        mine: bool,
        step: Step,
    ) -> None:
        """Key ``user_key`` of ``state`` (record key ``key``) changed from ``current`` to
        ``new`` at ``offset``: note whether its value reads here, and tell the listeners. An
        update of this replica's own (``mine``) was encoded by these very codecs, which read
        what they write: nothing to check."""
        unreadable = state.unreadable
        if new is not None and not mine and self.checks_values:
            check_key = current is None or user_key in unreadable
            problem = (
                unreadable_because(state, user_key, new, check_key)
                if check_key or not state.values.reads_any_bytes
                else None
            )
            if problem is not None:
                error = ApplyError(self.partition, offset, problem, key, self.topic)
                unreadable[user_key] = error
                step.errors.append(error)
            elif unreadable:
                unreadable.pop(user_key, None)
        elif unreadable:
            unreadable.pop(user_key, None)
        versions = state.versions
        if versions is not None:
            if new is None:
                versions.pop(user_key, None)
            else:
                versions[user_key] = offset
        if state.listeners or state.taps:
            step.events.append((CHANGE, state, (user_key, current, new, mine, offset)))

    def _write_many(
        self,
        state: MapState,
        overlay: dict[bytes, bytes | None],
        args: tuple[Any, ...],
        offset: int,
        mine: bool,
        step: Step,
        ts: int = 0,
        code: OpCode = OpCode.WRITE_MANY,
    ) -> list[bytes | None]:
        """Apply a ``WRITE_MANY`` op at ``offset`` (or a ``WRITE_MANY_TTL`` or a batch's
        ``PUT_FOR``, ``code``, stamped ``ts``), pair by pair, as puts and removes would be;
        return the value each pair found (None: absent), as its put or remove would. A batch
        of new values for distinct keys, with no listener, takes C-level passes instead of a
        loop per pair. Raises OperationFailedError for a malformed op (nothing changed)."""
        keys, values = write_many_args(args[:2])
        deadline = None
        if len(args) == 3:  # WRITE_MANY_TTL, PUT_FOR
            _expiries_of(state)
            deadline = put_deadline(code, args, ts)
            step.log_time = max(step.log_time, ts)
        prefix, dirty, store = state.prefix, self.dirty, state.store
        if (
            not (state.listeners or state.taps or state.expiries or deadline is not None)
            and None not in values
            and len(set(keys)) == len(keys)
            and (not overlay or overlay.keys().isdisjoint(keys))
            and not (self.checks_values and _undecodable(state, keys, values))
        ):
            previous = store.get_many(keys)
            record_keys = [prefix + k for k in keys] if prefix else keys
            if previous.count(None) == len(previous):  # all new keys (a bulk load)
                # zip with repeat, not dict.fromkeys: merging a dict of a chunk's keys into a
                # large dict took 2.3x as long (200,000 new keys in chunks of 10,000: 34 ms
                # against 15 ms)
                dirty.update(zip(record_keys, repeat(offset)))
                if state.versions is not None:
                    state.versions.update(zip(keys, repeat(offset)))
            else:
                changed = zip(record_keys, previous, values, strict=True)
                dirty.update([(k, offset) for k, old, new in changed if old != new])
                if state.versions is not None:
                    was = zip(keys, previous, values, strict=True)
                    state.versions.update([(k, offset) for k, old, new in was if old != new])
            overlay.update(zip(keys, values, strict=True))
            if state.unreadable:  # readable values replace unreadable ones
                for k in keys:
                    state.unreadable.pop(k, None)
            return previous
        return self._write_pairs(state, overlay, keys, values, offset, mine, step, ts, deadline)

    def _write_pairs(
        self,
        state: MapState,
        overlay: dict[bytes, bytes | None],
        keys: list[bytes],
        values: list[bytes | None],
        offset: int,
        mine: bool,
        step: Step,
        ts: int = 0,
        deadline: int | None = None,
    ) -> list[bytes | None]:
        """Write ``values`` (None: remove) to ``keys`` of ``state`` in order, as puts and
        removes would, for the op at ``offset`` (record time ``ts``; the puts expiring at
        ``deadline``, if given); return the value each pair found (None: absent)."""
        prefix, dirty, store, expiries = state.prefix, self.dirty, state.store, state.expiries
        found: list[bytes | None] = []
        for user_key, value in zip(keys, values, strict=True):
            current = overlay[user_key] if user_key in overlay else store.get(user_key)
            if expiries is not None:
                if user_key in expiries and expiries[user_key] <= ts:
                    current = None  # expired: absent
                when = None if value is None else deadline
                key = prefix + user_key
                self._expire_at(state, key, user_key, when, offset, step, value is None)
            found.append(current)
            if current is None and value is None:
                continue  # removing an absent key: nothing changes
            if value != current:
                key = prefix + user_key
                overlay[user_key] = value
                dirty[key] = offset
                self._changed(state, key, user_key, current, value, offset, mine, step)
        return found

    def _transact(
        self,
        state: MapState,
        overlay: dict[bytes, bytes | None],
        t: Transaction,
        offset: int,
        mine: bool,
        step: Step,
        ts: int,
    ) -> bool:
        """Decide a ``TRANSACT`` op ``t`` at ``offset`` (record time ``ts``): when every
        expectation holds, write all its pairs and return True; otherwise change nothing and
        return False. Raises OperationFailedError for a value that does not compare or
        versions on a map without them (nothing changed)."""
        store, expiries = state.store, state.expiries

        def live(k: bytes) -> bytes | None:
            if expiries and k in expiries and expiries[k] <= ts:
                return None
            return overlay[k] if k in overlay else store.get(k)

        current = [live(k) for k in t.expected_keys]
        if not expectations_hold(t.expected, current, state.values):
            return False
        if t.versioned:
            versions = _versions_of(state, t.versioned)
            alive = [
                None if live(k) is None else v for k, v in zip(t.versioned, versions, strict=True)
            ]
            if alive != t.versions:
                return False
        self._write_pairs(state, overlay, t.keys, t.values, offset, mine, step, ts)
        return True

    def _expire_at(
        self,
        state: MapState,
        key: bytes,
        user_key: bytes,
        deadline: int | None,
        offset: int,
        step: Step,
        removed: bool = False,
    ) -> None:
        """Key ``user_key`` of ``state`` (record key ``key``) was written at ``offset``: it
        expires at ``deadline`` from now on (None: never). A changed deadline makes the key
        dirty, so that the next flush writes it.

        Readers look at the store and at the deadlines without the replica lock, and the
        store is written only when the step is carried out. So the deadline of a key this op
        ``removed`` stays until then (:attr:`Step.forgotten`): dropped now, a reader would
        find the key still in the store with no deadline, alive again, between the two. For
        the ops after it in the batch a removed key is absent whatever its deadline."""
        expiries = state.expiries
        assert expiries is not None
        if deadline is None:
            if user_key in expiries:
                self.dirty[key] = offset
                if removed:
                    if not step.forgotten:
                        step.forgotten = []
                    step.forgotten.append((state, user_key))
                else:
                    del expiries[user_key]
        elif expiries.get(user_key) != deadline:
            expiries[user_key] = deadline
            self.dirty[key] = offset
            if not step.expiring:
                step.expiring = []
            step.expiring.append((deadline, key))

    def apply_puts(self, records: Sequence[Record], after: int) -> Step | None:
        """:meth:`apply_batch` for the common bulk batch, a pass of C-level operations per
        step instead of a Python loop per record: one map without listeners, every record a
        well-formed ``PUT`` of a bytes value, no key twice. The map's taps get the changes as
        one :class:`ChangeRun`. Returns None, having changed nothing, for any other batch."""
        try:
            ops = list(map(_decode_put, cast("list[bytes]", [r[1] for r in records])))
        except (msgspec.DecodeError, TypeError):  # another op, a malformed one, a null value
            return None
        keys = cast("list[bytes]", [r[0] for r in records])
        if None in keys or len(set(keys)) != len(keys):  # a key twice: decided in order
            return None
        offsets = cast("list[int]", [r[5] for r in records])
        origins = list(map(_ORIGIN_OF, ops))  # C-level passes, no Python per record
        writer = origins[0]
        runs: list[tuple[bytes, list[int], int]] | None
        if origins.count(writer) == len(origins):  # one writer's batch, as a rule
            runs = [(writer, list(map(_SEQ_OF, ops)), offsets[-1])]
            if not self.ids.fresh_run(writer, runs[0][1]):
                runs = None
        else:
            runs = self._fresh_runs(ops, offsets)
        if runs is None:  # a repeat, or numbers out of order: decided one by one
            return None
        state = self.maps.maps[0]
        values = [op[3] for op in ops]
        if self.checks_values and _undecodable(state, keys, values):
            return None  # the record loop notes them one by one
        if state.unreadable:  # readable values replace unreadable ones
            for key in keys:
                state.unreadable.pop(key, None)
        ids = self.ids
        for og, seqs, last in runs:
            ids.take_run(og, seqs, last)
        previous = state.store.get_many(keys)
        versions = state.versions  # a plain map: record keys are store keys
        step = Step()
        if previous.count(None) == len(previous):  # all new keys (a bulk load): at C speed
            self.dirty.update(zip(keys, offsets, strict=True))
            if versions is not None:
                versions.update(zip(keys, offsets, strict=True))
            if state.taps:  # told before the results, as the record loop tells them
                run = ChangeRun(offsets, keys, previous, values)
                step.events.append((CHANGES, state, run))
        else:
            changed = zip(keys, offsets, previous, values, strict=True)
            changes = [(k, o) for k, o, old, new in changed if old != new]
            self.dirty.update(changes)
            if versions is not None:
                versions.update(changes)
            if state.taps and changes:
                changed = zip(keys, offsets, previous, values, strict=True)
                told = [(o, k, old, new) for k, o, old, new in changed if old != new]
                columns = map(list, zip(*told, strict=True))
                step.events.append((CHANGES, state, ChangeRun(*columns)))
        origin = self.origin
        step.events.extend(
            [
                (RESULT, seq, old)
                for (_, og, seq, _), old in zip(ops, previous, strict=True)
                if og == origin
            ]
        )
        if offsets[-1] >= self.next_flush:  # rare: decided as the record loop does
            for (_, og, _, _), offset in zip(ops, offsets, strict=True):
                if og == origin and offset >= self.next_flush:
                    self._crossed(offset, step)
        step.changes[id(state)] = dict(zip(keys, values, strict=True))
        step.applied = max(after, offsets[-1] + 1)
        step.flushed = self.flushed
        step.updates = len(records)
        return step

    def _fresh_runs(
        self, ops: Sequence[tuple[int, bytes, int, bytes]], offsets: list[int]
    ) -> list[tuple[bytes, list[int], int]] | None:
        """For :meth:`apply_puts`: each origin of a batch with its seqs and the offset of its
        last record, when each origin's numbers come in order and next after those applied
        (:meth:`~kafkakv.map.dedup.AppliedIds.fresh_run`); None otherwise."""
        seqs: dict[bytes, list[int]] = {}
        last: dict[bytes, int] = {}
        for (_, og, seq, _), offset in zip(ops, offsets, strict=True):
            numbers = seqs.get(og)
            if numbers is None:
                seqs[og] = [seq]
            else:
                numbers.append(seq)
            last[og] = offset
        fresh = self.ids.fresh_run
        if all(fresh(og, numbers) for og, numbers in seqs.items()):
            return [(og, numbers, last[og]) for og, numbers in seqs.items()]
        return None

    # -- flushing -------------------------------------------------------------------------
    def _crossed(self, offset: int, step: Step) -> None:
        """An own op at ``offset`` crossed the flush mark: a flush is due, unless one is
        queued or running already (then it is asked again when that one ends)."""
        if self.flush_asked:
            self.flush_missed = offset
        else:
            self.flush_asked = True
            self.next_flush = offset + self.flush_period
            step.flush_due = True

    def flush_ended(self) -> bool:
        """A flush queued by a step ended (done, stale or failed): True when another is due
        now, for an own op that crossed a mark meanwhile."""
        self.flush_asked = False
        missed, self.flush_missed = self.flush_missed, -1
        if missed > self.flushed:
            self.flush_asked = True
            self.next_flush = missed + self.flush_period
            return True
        return False

    def mark_flushed(self, covered: Any, offset: int = -1, ts: int | None = None) -> None:
        """A ``FLUSHED`` mark at ``offset`` with timestamp ``ts``: a flush covered the ops up
        to ``covered``. Keys changed at or before it are clean; stale and malformed marks
        change nothing. Every well-formed mark bounds the update ids kept
        (:meth:`~kafkakv.map.dedup.AppliedIds.at_mark`): a replica that started after it
        does the same at the marks after it."""
        if not isinstance(covered, int):
            return
        self.ids.at_mark(offset, ts)
        if covered <= self.flushed:
            return
        self.flushed = covered
        self.next_flush = max(self.next_flush, covered + self.flush_period)
        # In place (an apply loop may hold the dict), and without a del per covered key:
        # most keys are covered.
        dirty = self.dirty
        if max(dirty.values(), default=-1) <= covered:
            dirty.clear()
        else:
            newer = {k: o for k, o in dirty.items() if o > covered}
            dirty.clear()
            dirty.update(newer)

    def flush_plan(self) -> tuple[int, list[bytes]] | None:
        """What a flush of the state as it is now writes: the ops offset it covers and the
        record keys to write; None when there is nothing to do (nothing applied since the
        last flush point, nothing dirty) or when keys of a map not held here are dirty (this
        replica cannot flush them)."""
        covered = self.applied - 1
        if covered <= self.flushed or not self.dirty:
            return None
        keys = list(self.dirty)
        if not self.maps.plain and any(self.maps.state_for(k) is None for k in keys):
            return None
        return covered, keys

    def flush_values(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The latest value of each record key of :meth:`flush_plan` (None: removed)."""
        if self.maps.plain:  # one map, record key = store key
            return self.maps.maps[0].store.get_many(keys)
        values: list[bytes | None] = []
        for key in keys:
            state = self.maps.state_for(key)
            assert state is not None  # flush_plan checked
            values.append(state.store.get(key[len(state.prefix) :]))
        return values

    def note_resumed(
        self, records: Sequence[Record], stop: int, replay: Replay | None = None
    ) -> bool:
        """A replica resumed from its own store does not know which keys changed since the
        last flush: every key of an op below ``stop`` counts as changed (a superset is safe
        to flush). Nor which update ids it applied: ``replay`` gets them (see
        :class:`~kafkakv.map.dedup.Replay`). True once ``stop`` is reached."""
        dirty = self.dirty
        for record in records:
            offset = record.offset
            assert offset is not None
            if offset >= stop:
                return True
            dirty.update(zip(self.keys_of(record), repeat(offset)))
            if replay is not None:
                _replay_ids(replay, record, offset)
        return False

    def resume_replay(self) -> Replay:
        """A :class:`~kafkakv.map.dedup.Replay` for :meth:`note_resumed` from the flush point
        taken by :meth:`start_at`."""
        return Replay(self.partition, self.ids.partitions, self.flushed)

    def keys_of(self, record: Record) -> list[bytes]:
        """The record keys an ops record may change: its own, and for a batch
        (``WRITE_MANY``, ``WRITE_MANY_TTL``, ``PUT_FOR`` of several keys) and ``TRANSACT``
        those it writes (none for control records and records that do not decode)."""
        key, value = record.key, record.value
        if key is None:
            return []
        head = value[:2] if value else b""
        if head in _LAST_PAIRS_HEADS:
            pairs = slice(-2, None)
        elif head in _FIRST_PAIRS_HEADS:
            pairs = slice(0, 2)
        else:
            return [key]
        try:
            op = decode_op(value)
            keys = write_many_args(op.args[pairs])[0]
        except (DecodeError, OperationFailedError):
            return [key]
        prefix = b"" if self.maps.plain else prefix_of(key)
        return [key, *(prefix + k for k in keys)]


def _replay_ids(replay: Replay, record: Record, offset: int) -> None:
    """Give ``replay`` what :meth:`PartitionMachine.apply_records` notes of the update ids of
    ``record``: an update with a key is applied (or decided as failed) once; a mark bounds
    the table."""
    try:
        code, origin, seq, args = decode_op(record.value)
    except DecodeError:
        return
    if code is OpCode.FLUSHED:
        if isinstance(args[0], int):
            replay.mark(args[0], args[1] if len(args) == 2 else None, offset, record.timestamp)
    elif code < OpCode.BARRIER and record.key is not None:
        replay.update(origin, seq, offset)


def _put_deadline(code: OpCode, args: tuple[Any, ...], ts: int) -> int | None:
    """The deadline a single put gives its key (None: none, a put without ttl)."""
    if code is OpCode.PUT_TTL or code is OpCode.PUT_FOR:
        return put_deadline(code, args, ts)
    return None


def _expire_too_early(
    step: Step,
    expiries: dict[bytes, int] | None,
    key: bytes,
    user_key: bytes,
    deadline: Any,
    current: bytes | None,
    ts: int | None,
) -> None:
    """An ``EXPIRE`` of a key that still has that deadline but was stamped before it (by the
    log's clock, a reaper proposed it early) changes nothing: the key is to be reaped again,
    and goes back into :attr:`Step.expiring`. Every replica decides so alike."""
    if current is None or expiries is None or expiries.get(user_key) != deadline:
        return  # expired (then removed), absent, put again: nothing to reap again
    if not step.expiring:
        step.expiring = []
    step.expiring.append((deadline, key))
    step.early = ts or 0


def _expiries_of(state: MapState) -> dict[bytes, int]:
    """The map's deadlines. Raises OperationFailedError, the same on every replica, for a
    map without expiry."""
    if state.expiries is None:
        raise OperationFailedError(
            f"map {state.name!r} has no expiry (open it with expiry=True when it is created)"
        )
    return state.expiries


def _versions_of(state: MapState, keys: Sequence[bytes]) -> list[int | None]:
    """The versions of ``keys`` (None: absent). Raises OperationFailedError, the same on
    every replica, for a map without versions."""
    versions = state.versions
    if versions is None:
        raise OperationFailedError(
            f"map {state.name!r} keeps no versions (open it with versions=True when it is created)"
        )
    return [versions.get(k) for k in keys]


# -- bootstrap ------------------------------------------------------------------------------
def changes_state(key: bytes | None) -> bool:
    """Whether an ops record with record key ``key`` may change a map's state when applied
    (:meth:`PartitionMachine.apply_records`): one without a key never does. It is a control
    record (a barrier, a ``FLUSHED`` mark), or one that is skipped (a record without a key
    that does not decode is noted as an error).

    >>> changes_state(None), changes_state(b"k")
    (False, True)
    """
    return key is not None


def start_point(
    start: int, resumed: Positions | None, loaded: int | None = None, where: str = "the ops topic"
) -> Positions:
    """Where a replica starts a partition whose ops topic starts at offset ``start``.

    A store that persisted ``resumed`` positions resumes there, when the ops topic still
    holds the op after them. Otherwise the replica loads the data topic: ``loaded`` is its
    flush point (-1: none), and the replica starts just after it. ``where`` names the ops
    partition in the error. Raises
    :class:`~kafkakv.errors.DataLossError` when retention removed ops that no flush
    covered, and ``ValueError`` when a load is needed but ``loaded`` is None.

    >>> start_point(0, None, loaded=-1).applied
    0
    >>> start_point(10, Positions(12, 11)).applied
    12
    >>> start_point(10, Positions(5, 4), loaded=9).applied
    10
    """
    if resumed is not None and resumed.applied >= start:
        return resumed
    if loaded is None:
        raise ValueError("the data topic must be loaded")
    if start > loaded + 1:
        raise DataLossError(
            f"{where} starts at offset {start} but the data topic covers ops only up to "
            f"{loaded}: retention removed unflushed updates"
        )
    return Positions(loaded + 1, loaded)


@dataclass
class Loaded:
    """What :func:`load_batch` found in a batch of data records."""

    #: The last value of each key, per map (keyed by ``id(map_state)``).
    changes: dict[int, dict[bytes, bytes | None]]
    #: The highest flush point among the records (-1: none).
    flush_point: int
    errors: list[ApplyError]
    #: The update ids applied up to that flush point, as the flush wrote them (an
    #: :meth:`~kafkakv.map.dedup.AppliedIds.snapshot`; None: none written).
    ids: Any = None


def load_batch(
    table: MapTable, p: int, entries: Sequence[Entry] | Sequence[Record], topic: str = ""
) -> Loaded:
    """A bootstrap's decision for a batch of data records of partition ``p``, as
    ``(key, value, offset)`` entries (:meth:`~kafkakv.log.base.Log.read_entries`) or as
    records (either starts with the key and the value and ends with the offset): what each
    map's store gets, the flush point, and the keys and values this replica's codecs cannot
    read (noted in the maps' ``unreadable`` and returned as errors). One pass at C speed for a
    plain map whose records all read."""
    errors: list[ApplyError] = []
    if table.plain:
        state = table.maps[0]
        batch: dict[bytes | None, bytes | None] = {e[0]: e[1] for e in entries}
        batch.pop(None, None)
        batch.pop(SETTINGS_KEY, None)
        flushed, ids = -1, None
        if FLUSH_POINT_KEY in batch:
            del batch[FLUSH_POINT_KEY]
            flushed, ids = max(
                (read_flush_point_ids(e[1]) for e in entries if e[0] == FLUSH_POINT_KEY),
                key=lambda point: point[0],
            )
        loaded = cast("dict[bytes, bytes | None]", batch)
        _note_loaded(state, p, entries, loaded, errors, topic)
        return Loaded({id(state): loaded}, flushed, errors, ids)
    flushed, ids = -1, None
    changes: dict[int, dict[bytes, bytes | None]] = {}
    for entry in entries:
        key = entry[0]
        if key == FLUSH_POINT_KEY:
            covered, point_ids = read_flush_point_ids(entry[1])
            if covered > flushed:
                flushed, ids = covered, point_ids
            continue
        if key == SETTINGS_KEY:
            continue
        owner = table.state_for(key)
        if owner is None or key is None:
            continue
        user_key = key[len(owner.prefix) :]
        _note_value(owner, p, entry, user_key, errors, topic)
        changes.setdefault(id(owner), {})[user_key] = entry[1]
    return Loaded(changes, flushed, errors, ids)


def load_headers(table: MapTable, records: Sequence[Record]) -> list[tuple[int, bytes]]:
    """Take what the headers of a batch of data records say into the maps they belong to:
    for a map with versions each key's :data:`VERSION_HEADER` (-1 when it has none: written
    without versions, every replica reads it alike), for a map with expiry each key's
    :data:`EXPIRES_HEADER`. A tombstone forgets both. Returns ``(deadline, record key)`` of
    each deadline loaded."""
    expiring: list[tuple[int, bytes]] = []
    for record in records:
        key = record.key
        if key is None or key in RESERVED_KEYS:
            continue
        state = table.state_for(key)
        if state is None:
            continue
        versions, expiries = state.versions, state.expiries
        if versions is None and expiries is None:
            continue
        user_key = key[len(state.prefix) :]
        if record.value is None:
            if versions is not None:
                versions.pop(user_key, None)
            if expiries is not None:
                expiries.pop(user_key, None)
            continue
        version, deadline = -1, None
        for name, raw in record.headers:
            if name == VERSION_HEADER and len(raw) == 8:
                version = int.from_bytes(raw, "big")
            elif name == EXPIRES_HEADER and len(raw) == 8:
                deadline = int.from_bytes(raw, "big")
        if versions is not None:
            versions[user_key] = version
        if expiries is not None:
            if deadline is None:
                expiries.pop(user_key, None)
            else:
                expiries[user_key] = deadline
                expiring.append((deadline, key))
    return expiring


def load_latest(table: MapTable, p: int, latest: dict[bytes | None, bytes | None]) -> Loaded | None:
    """:func:`load_batch` for a plain map (``table.plain``) from the last value of each key
    of a stretch of data records (:meth:`~kafkakv.log.base.Log.read_latest`), which it
    takes over. None when a key or value does not read with the map's codecs: their offsets
    are needed then, and the caller reads the stretch again for :func:`load_batch`. The flush
    point is the stretch's last (the one compaction keeps). No pass in Python per record.

    >>> from kafkakv.codecs import StrCodec
    >>> from kafkakv.store.memory import DictStore
    >>> table = MapTable([MapState("m", b"", StrCodec(), StrCodec(), DictStore())])
    >>> loaded = load_latest(table, 0, {b"a": b"1", b"b": None, FLUSH_POINT_KEY: b"\\x91\\x07"})
    >>> list(loaded.changes.values()), loaded.flush_point, loaded.errors
    ([{b'a': b'1', b'b': None}], 7, [])
    >>> load_latest(table, 0, {b"a": b"\\xff"}) is None
    True
    """
    state = table.maps[0]
    latest.pop(None, None)
    latest.pop(SETTINGS_KEY, None)
    flushed, ids = -1, None
    if FLUSH_POINT_KEY in latest:
        flushed, ids = read_flush_point_ids(latest.pop(FLUSH_POINT_KEY))
    batch = cast("dict[bytes, bytes | None]", latest)
    if not _reads_all(state, batch):
        return None
    return Loaded({id(state): batch}, flushed, [], ids)


def _undecodable(state: MapState, keys: list[bytes], values: Sequence[bytes | None]) -> bool:
    """Whether a key or a value (none None) does not read with the map's codecs."""
    return bool(
        state.values.undecodable(cast("list[bytes]", values)) or state.keys.undecodable(keys)
    )


def _reads_all(state: MapState, batch: dict[bytes, bytes | None]) -> bool:
    """Whether the map's codecs read every key and value of ``batch`` (the last value per
    key); forgets the keys of ``batch`` noted unreadable before when they do."""
    if state.values.reads_any_bytes:
        values: list[bytes] = []
    else:
        values = cast("list[bytes]", list(batch.values()))
        if not all(values) and None in values:  # tombstones: nothing to read (all(): a third
            # of the cost of comparing each value with None, and most batches have none)
            values = [v for v in values if v is not None]
    if state.values.undecodable(values) or state.keys.undecodable(list(batch)):
        return False
    unreadable = state.unreadable
    if unreadable:
        for key in batch:
            unreadable.pop(key, None)
    return True


def _note_loaded(
    state: MapState,
    p: int,
    entries: Sequence[Entry] | Sequence[Record],
    batch: dict[bytes, bytes | None],
    errors: list[ApplyError],
    topic: str,
) -> None:
    """``batch`` (the last value per key) checked with the map's codecs."""
    if _reads_all(state, batch):
        return
    latest = {e[0]: e for e in entries if e[0] in batch}
    for key, entry in latest.items():
        assert key is not None
        _note_value(state, p, entry, key, errors, topic)


def _note_value(
    state: MapState,
    p: int,
    entry: Entry | Record,
    user_key: bytes,
    errors: list[ApplyError],
    topic: str,
) -> None:
    """Note whether the data record's key and value are readable here."""
    key, value, offset = entry[0], entry[1], entry[-1]
    unreadable = state.unreadable
    problem = None if value is None else unreadable_because(state, user_key, value, True)
    if problem is None:
        unreadable.pop(user_key, None)
    else:
        error = ApplyError(p, offset or 0, problem, key, topic)
        unreadable[user_key] = error
        errors.append(error)


def unreadable_because(state: MapState, key: bytes, value: bytes, check_key: bool) -> str | None:
    """Why this replica's codecs cannot read ``value`` (or ``key``), or None when they can."""
    try:
        if not state.values.reads_any_bytes:
            state.values.check(value)
        if check_key:
            state.keys.check(key)
    except DecodeError as exc:
        return f"stored as written, but this replica's codecs cannot read it: {exc}"
    return None


# -- flush records --------------------------------------------------------------------------
#: The header of a data record of a map with versions that holds the key's version (8 bytes,
#: big-endian).
VERSION_HEADER = "kafkakv.version"
#: The header of a data record of a map with expiry that holds the key's deadline (ms since
#: the epoch, 8 bytes, big-endian).
EXPIRES_HEADER = "kafkakv.expires"


FLUSH_HEADERS_MAX = len(VERSION_HEADER) + 8 + len(EXPIRES_HEADER) + 8
"""The most header bytes a flushed value carries (its version and deadline). An update whose
ops record fits its topic within this much less than a data record may hold also flushes:
its ops record is longer than its value."""


def flush_records(
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    covered: int,
    origin: bytes,
    versions: Sequence[int] | None = None,
    deadlines: Sequence[int | None] | None = None,
    ids: Any = None,
) -> tuple[list[Record], Record]:
    """The records of a flush covering the ops up to ``covered``: for the data topic the
    latest value of each key, then the flush point; for the ops topic the ``FLUSHED`` mark.
    A value carries its key's version (``versions``, a map with versions) and deadline
    (``deadlines``, a map with expiry; None: none) in headers. The flush point and the mark
    carry ``ids``, the update ids applied up to ``covered`` (an
    :meth:`~kafkakv.map.dedup.AppliedIds.snapshot`), when given: ``[covered, ids]``.

    >>> data, mark = flush_records([b"k"], [b"v"], 7, b"o" * 8)
    >>> [r.key for r in data], read_flush_point(data[-1].value), decode_op(mark.value).args
    ([b'k', b'\\x00kafkakv:flush-point'], 7, (7,))
    >>> flush_records([b"k"], [b"v"], 7, b"o" * 8, [5])[0][0].headers
    (('kafkakv.version', b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x05'),)
    """
    if versions is None and deadlines is None:
        records = records_of(keys, values)
    else:
        records = []
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            headers: list[tuple[str, bytes]] = []
            if v is not None:
                if versions is not None:
                    headers.append((VERSION_HEADER, versions[i].to_bytes(8, "big")))
                if deadlines is not None and deadlines[i] is not None:
                    headers.append((EXPIRES_HEADER, int(deadlines[i] or 0).to_bytes(8, "big")))
            records.append(Record(k, v, tuple(headers)))
    point = [covered] if ids is None else [covered, ids]
    records.append(Record(FLUSH_POINT_KEY, msgpack.packb(point)))
    return records, Record(None, encode_op(OpCode.FLUSHED, origin, -1, point))


def read_flush_point(value: bytes | None) -> int:
    """The ops offset a flush point record says its flush covered. Raises
    :class:`~kafkakv.errors.DecodeError` for a value that is not one."""
    return read_flush_point_ids(value)[0]


def read_flush_point_ids(value: bytes | None) -> tuple[int, Any]:
    """The ops offset a flush point record says its flush covered, and the update ids it
    carries (None: a flush written without them). Raises
    :class:`~kafkakv.errors.DecodeError` for a value that is not one."""
    try:
        point = msgpack.unpackb(value or b"", raw=False)
        if not isinstance(point, list) or len(point) not in (1, 2):
            raise ValueError(f"not [covered] or [covered, ids]: {point!r}")
        return int(point[0]), point[1] if len(point) == 2 else None
    except Exception as exc:
        raise DecodeError(f"a flush point record that does not decode: {exc}") from exc
