"""Properties of the partition state machine (kafkakv.map.machine), with no log and no threads.

Hypothesis draws ops logs: updates of every kind from this replica and from others, over a few
keys, with undecodable records, barriers, functions that fail, and flushes taken at random
points (their FLUSHED marks land later in the log, as they do in a real one). A small shell
here does what the engine does with a step: one store write, then ``advance``. The properties:

* the bulk path and the record loop decide the same;
* positions never go back;
* the dirty set is exactly the keys changed since the last flush point;
* this replica's own results are what :func:`~kafkakv.map.ops.decide` says on a plain fold;
* a replica bootstrapped from any flush point and replaying the ops after it ends equal to
  the live one.

Seeded: ``derandomize=True`` makes every run draw the same examples (failures print the
example to replay it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkakv import functions
from kafkakv.codecs import codec_for
from kafkakv.errors import DataLossError, DecodeError, OperationFailedError, ResultTooLargeError
from kafkakv.log.base import Record
from kafkakv.map import machine as machine_module
from kafkakv.map.dedup import AppliedIds, numbering
from kafkakv.map.keyspace import FLUSH_POINT_KEY, SETTINGS_KEY
from kafkakv.map.machine import (
    BULK_MIN,
    CHANGE,
    FAILED,
    RESULT,
    MapState,
    MapTable,
    PartitionMachine,
    Step,
    flush_records,
    load_batch,
    load_latest,
    read_flush_point,
    start_point,
)
from kafkakv.map.ops import KEEP, OpCode, decide, decode_op, encode_op, sent_op
from kafkakv.store.base import Positions
from kafkakv.store.memory import DictStore

ME, OTHER = b"me------", b"other---"
KEYS = [b"a", b"b", b"c", b"d", b"e"]
VALUES = [b"1", b"2", b"3"]
JSON = codec_for("json")
STR = codec_for("str")
PERIOD = 4  # flush_period: small, so that steps make flushes due


@functions.register("test_machine.concat")
def _concat(old: Any, given: Any) -> Any:
    """A merge function that fails for one value, the same way on every replica."""
    if given == 3:
        raise ValueError("three is refused")
    return old * 10 + given


@functions.register("test_machine.add")
def _add(key: str, old: Any, n: int) -> Any:
    """A compute function: ``n`` more than the old value."""
    return (old or 0) + n


SETTINGS = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def ops_records(draw: st.DrawFn) -> tuple[bytes | None, bytes | None, bytes]:
    """One ops record's (key, value) and its origin: an update of any kind, a barrier, or
    bytes that are no op at all."""
    origin = draw(st.sampled_from([ME, OTHER]))
    # Few numbers: updates repeat (a transport writing a record twice) and come out of
    # order, within the holes a table of applied ids keeps (30 numbers: 15 holes at most).
    seq = draw(st.integers(0, 30))
    key = draw(st.sampled_from(KEYS))
    value = draw(st.sampled_from(VALUES))
    kind = draw(
        st.sampled_from(["put"] * 4 + ["absent", "replace", "remove", "cas", "remove_if", "merge"])
        | st.sampled_from(["barrier", "garbage", "many", "many", "compute"])
    )
    if kind == "put":
        return key, encode_op(OpCode.PUT, origin, seq, [value]), origin
    if kind == "absent":
        return key, encode_op(OpCode.PUT_IF_ABSENT, origin, seq, [value]), origin
    if kind == "replace":
        return key, encode_op(OpCode.REPLACE, origin, seq, [value]), origin
    if kind == "remove":
        return key, encode_op(OpCode.REMOVE, origin, seq), origin
    if kind == "cas":
        expected = draw(st.sampled_from([None, *VALUES]))
        return key, encode_op(OpCode.COMPARE_AND_SET, origin, seq, [expected, value]), origin
    if kind == "remove_if":
        return key, encode_op(OpCode.REMOVE_IF, origin, seq, [value]), origin
    if kind == "merge":
        return key, encode_op(OpCode.MERGE, origin, seq, ["test_machine.concat", value]), origin
    if kind == "compute":  # its args packed as the writer packs them, or in another shape
        packed = draw(st.sampled_from([[1], [2], 5, "ab", {"n": 1}, []]))
        room = draw(st.sampled_from([(), (2,), (1,)]))  # none, or a tight one
        compute = ("test_machine.add", msgpack.packb(packed), *room)
        return key, encode_op(OpCode.COMPUTE, origin, seq, compute), origin
    if kind == "many":  # puts and removes of a batch, a key maybe twice
        pairs = draw(
            st.lists(
                st.tuples(st.sampled_from(KEYS), st.sampled_from([None, *VALUES])),
                min_size=1,
                max_size=4,
            )
        )
        args = ([k for k, _ in pairs], [v for _, v in pairs])
        return pairs[0][0], encode_op(OpCode.WRITE_MANY, origin, seq, args), origin
    if kind == "barrier":
        return None, encode_op(OpCode.BARRIER, origin, seq), origin
    return key, b"\xc1 not an op", origin


def numbered(items: list[tuple[bytes | None, bytes | None]], first: int = 0) -> list[Record]:
    return [Record(k, v, (), None, 0, first + i) for i, (k, v) in enumerate(items)]


def new_state() -> MapState:
    return MapState("m", b"", STR, JSON, DictStore())


def new_machine(state: MapState) -> PartitionMachine:
    return PartitionMachine(0, MapTable([state]), ME, PERIOD, "ops")


def carry_out(machine: PartitionMachine, state: MapState, step: Step) -> None:
    """What the engine does with a step, minus futures and listeners."""
    state.store.write(step.changes.get(id(state), {}), {0: step.positions})
    machine.advance(step)


def contents(state: MapState) -> dict[bytes, bytes]:
    return dict(state.store.items())


def own_outcomes(step: Step) -> list[tuple[int, int, Any]]:
    return [(kind, seq, arg) for kind, seq, arg in step.events if kind != CHANGE]


@dataclass
class Run:
    """A live replica applying a log in batches, taking flushes as the engine would."""

    state: MapState = field(default_factory=new_state)
    log: list[Record] = field(default_factory=list)
    #: Per flush: the ops offset it covered and the data topic (compacted) after it.
    flushes: list[tuple[int, dict[bytes, bytes | None]]] = field(default_factory=list)
    data: dict[bytes, bytes | None] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    #: After each step: the store's contents and positions, as a store on disk keeps them.
    stored: list[tuple[dict[bytes, bytes], Positions]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.machine = new_machine(self.state)

    def feed(self, items: list[tuple[bytes | None, bytes | None]], batch: int) -> None:
        records = numbered(items, len(self.log))
        self.log.extend(records)
        for i in range(0, len(records), batch):
            chunk = records[i : i + batch]
            before = Positions(self.machine.applied, self.machine.flushed)
            step = self.machine.apply_batch(chunk, (chunk[-1].offset or 0) + 1)
            carry_out(self.machine, self.state, step)
            self.steps.append(step)
            self.stored.append((contents(self.state), step.positions))
            assert self.machine.applied >= before.applied, "applied went back"
            assert self.machine.flushed >= before.flushed, "flushed went back"
            if step.flush_due:
                self.flush()

    def flush(self) -> None:
        """A flush of the state as it is now; its mark is appended to the log."""
        plan = self.machine.flush_plan()
        if plan is not None:
            covered, keys = plan
            values, ids = self.machine.flush_values(keys), self.machine.ids.snapshot()
            data, mark = flush_records(keys, values, covered, ME, ids=ids)
            for record in data:
                assert record.key is not None
                self.data[record.key] = record.value
            self.flushes.append((covered, dict(self.data)))
            self.log.append(Record(mark.key, mark.value, (), None, 0, len(self.log)))
        self.machine.flush_ended()


def fold(
    records: list[Record], start: dict[bytes, bytes] | None = None
) -> tuple[dict[bytes, bytes], dict[int, Any], dict[bytes, int]]:
    """The plain fold of an ops log through ``decide``, from ``start`` (default: empty), each
    update applied at most once (the first record of an ``(origin, seq)``): final contents,
    this replica's outcomes by seq ("failed" for a failure), and the offset of each key's
    last change."""
    state: dict[bytes, bytes] = dict(start or {})
    outcomes: dict[int, Any] = {}
    changed: dict[bytes, int] = {}
    applied: set[tuple[bytes, int]] = set()
    for record in records:
        try:
            op = decode_op(record.value)
        except Exception:
            continue
        if op.code.control or record.key is None:
            continue
        if (op.origin, op.seq) in applied:
            continue
        applied.add((op.origin, op.seq))
        if op.code is OpCode.WRITE_MANY:  # each pair a put, or a remove where None
            found = []  # its result: what each pair found
            for key, value in zip(*op.args, strict=True):
                found.append(state.get(key))
                if (value is None and key in state) or value is not None:
                    if state.get(key) != value:
                        assert record.offset is not None
                        changed[key] = record.offset
                    if value is None:
                        del state[key]
                    else:
                        state[key] = value
            if op.origin == ME:
                outcomes[op.seq] = found
            continue
        try:
            result, new = decide(op.code, op.args, state.get(record.key), record.key, STR, JSON)
        except OperationFailedError:
            result, new = "failed", KEEP
        if new is not KEEP and new != state.get(record.key):
            assert record.offset is not None
            changed[record.key] = record.offset
            if new is None:
                del state[record.key]
            else:
                state[record.key] = new
        if op.origin == ME:
            outcomes[op.seq] = result
    return state, outcomes, changed


log_items = st.lists(ops_records(), min_size=1, max_size=120)


@SETTINGS
@given(items=log_items, batch=st.integers(1, 40))
def test_live_state_and_own_results_match_a_plain_fold(
    items: list[tuple[bytes | None, bytes | None, bytes]], batch: int
) -> None:
    run = Run()
    run.feed([(k, v) for k, v, _ in items], batch)
    expected, outcomes, _ = fold(run.log)
    assert contents(run.state) == expected
    seen: dict[int, Any] = {}
    for step in run.steps:
        for kind, seq, arg in own_outcomes(step):  # the first outcome is the future's
            seen.setdefault(seq, "failed" if kind == FAILED else arg)
    assert seen == outcomes
    assert run.machine.applied == len(items)


@SETTINGS
@given(items=log_items, batch=st.integers(1, 40))
def test_dirty_is_exactly_the_keys_changed_since_the_flush_point(
    items: list[tuple[bytes | None, bytes | None, bytes]], batch: int
) -> None:
    run = Run()
    run.feed([(k, v) for k, v, _ in items], batch)
    # Let the marks of the flushes taken land too.
    while run.machine.applied < len(run.log):
        tail = run.log[run.machine.applied :]
        carry_out(run.machine, run.state, run.machine.apply_batch(tail, len(run.log)))
    _, _, changed = fold(run.log)
    flushed = run.machine.flushed
    assert run.machine.dirty == {k: o for k, o in changed.items() if o > flushed}


@SETTINGS
@given(items=log_items, batch=st.integers(1, 40))
def test_a_replay_from_any_flush_point_equals_the_live_state(
    items: list[tuple[bytes | None, bytes | None, bytes]], batch: int
) -> None:
    run = Run()
    run.feed([(k, v) for k, v, _ in items], batch)
    for covered, data in [(-1, {}), *run.flushes]:
        state = new_state()
        records = numbered(list(data.items()))
        entries = [(r.key, r.value, r.offset or 0) for r in records]
        loaded = load_batch(MapTable([state]), 0, entries) if records else None
        if loaded is not None:
            state.store.write(loaded.changes[id(state)], {})
            assert loaded.flush_point == covered
        machine = new_machine(state)
        ids = AppliedIds.restore(0, 1, loaded.ids if loaded is not None else None)
        machine.start_at(start_point(0, None, covered if loaded is not None else -1), ids)
        assert machine.applied == covered + 1
        tail = run.log[machine.applied :]
        if tail:
            carry_out(machine, state, machine.apply_batch(tail, len(run.log)))
        assert contents(state) == contents(run.state), f"replay from {covered}"


@SETTINGS
@given(items=log_items, batch=st.integers(1, 40), at=st.integers(0, 200))
def test_a_replica_resumed_from_its_store_skips_the_repeats_the_live_one_skips(
    items: list[tuple[bytes | None, bytes | None, bytes]], batch: int, at: int
) -> None:
    """A store that persisted the state and positions of any step resumes there: it learns
    the update ids applied from the ops after its flush point (the FLUSHED mark of that point
    carries the table as of it), so the rest of the log leaves it equal to the live replica."""
    run = Run()
    run.feed([(k, v) for k, v, _ in items], batch)
    while run.machine.applied < len(run.log):  # the marks of the last flushes
        tail = run.log[run.machine.applied :]
        carry_out(run.machine, run.state, run.machine.apply_batch(tail, len(run.log)))
    stored, positions = run.stored[at % len(run.stored)]
    state = new_state()
    state.store.write(stored, {0: positions})
    machine = new_machine(state)
    machine.start_at(positions)
    replay = machine.resume_replay()
    machine.note_resumed(run.log[positions.flushed + 1 :], positions.applied, replay)
    machine.ids = replay.table()
    tail = run.log[machine.applied :]
    if tail:
        carry_out(machine, state, machine.apply_batch(tail, len(run.log)))
    assert contents(state) == contents(run.state)
    assert machine.ids == run.machine.ids


@SETTINGS
@given(
    puts=st.lists(
        st.tuples(st.sampled_from(VALUES), st.sampled_from([ME, OTHER])), min_size=1, max_size=5
    ),
    before=st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES)),
    first=st.integers(0, 30),
)
def test_the_bulk_path_and_the_record_loop_decide_the_same(
    puts: list[tuple[bytes, bytes]], before: dict[bytes, bytes], first: int
) -> None:
    """Distinct keys, plain puts, each origin's numbers in order: the batch the bulk path
    takes, applied both ways."""
    numbers = {ME: iter(numbering(0, 1)), OTHER: iter(numbering(0, 1))}
    items = [
        (key, encode_op(OpCode.PUT, origin, next(numbers[origin]), [value]))
        for key, (value, origin) in zip(KEYS, puts, strict=False)
    ]
    records = numbered(list(items), first)
    outcomes = []
    for path in ("bulk", "loop"):
        state = new_state()
        state.store.write(dict(before), {})
        machine = new_machine(state)
        machine.start_at(Positions(first, first - 1))
        if path == "bulk":
            step = machine.apply_puts(records, first + len(records))
        else:
            step = machine.apply_records(records, first + len(records))
        assert step is not None
        carry_out(machine, state, step)
        outcomes.append(
            (
                contents(state),
                own_outcomes(step),
                step.flush_due,
                machine.applied,
                dict(machine.dirty),
                machine.next_flush,
            )
        )
    assert outcomes[0] == outcomes[1]


def test_apply_batch_takes_the_bulk_path_only_for_plain_put_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = new_state()
    machine = new_machine(state)
    lane = numbering(0, 1)  # a writer's numbers of its updates waited for
    puts = numbered([(k, encode_op(OpCode.PUT, ME, lane[i], [b"1"])) for i, k in enumerate(KEYS)])
    assert machine.apply_puts(puts, 5) is not None
    twice = numbered([(b"a", encode_op(OpCode.PUT, ME, i, [b"1"])) for i in range(3)])
    assert machine.apply_puts(twice, 3) is None  # a key twice: decided in order
    removal = numbered([(b"a", encode_op(OpCode.REMOVE, ME, 0))])
    assert machine.apply_puts(removal, 1) is None
    assert machine.apply_puts(puts, 5) is None  # repeats: the record loop skips them
    later = numbered(
        [(k, encode_op(OpCode.PUT, ME, lane[i], [b"1"])) for i, k in enumerate(KEYS, 9)]
    )
    assert machine.apply_puts(later, 5) is None  # numbers 5-8 skipped: decided one by one
    machine = new_machine(new_state())
    monkeypatch.setattr(machine_module, "BULK_MIN", 1)
    taken: list[bool] = []
    original = PartitionMachine.apply_puts

    def spy(self: PartitionMachine, records: Any, after: int) -> Step | None:
        step = original(self, records, after)
        taken.append(step is not None)
        return step

    monkeypatch.setattr(PartitionMachine, "apply_puts", spy)
    machine.apply_batch(puts, 5)
    assert taken == [True]


def _shape(x: Any) -> Any:
    """``x`` with the type of every part: equal shapes are the same values of the same types."""
    if isinstance(x, tuple | list):
        return (type(x), tuple(_shape(item) for item in x))
    return (type(x), x)


#: Op arguments of every kind a caller could hand the engine: ones msgpack gives back as they
#: are, and ones it gives back as another type (bytearray as bytes, lists as tuples, an
#: IntEnum as an int, a str subclass as str).
_ARGS = st.one_of(
    st.binary(max_size=8),
    st.text(max_size=4),
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.booleans(),
    st.floats(allow_nan=False),
    st.none(),
    st.binary(max_size=8).map(bytearray),
    st.lists(st.binary(max_size=4), max_size=2),
    st.lists(st.binary(max_size=4), max_size=2).map(tuple),
    # arrays of items of every kind, verbatim or not (a WRITE_MANY's keys and values)
    st.lists(
        st.one_of(
            st.binary(max_size=2),
            st.none(),
            st.text(max_size=2),
            st.integers(-3, 3),
            st.booleans(),
            st.binary(max_size=2).map(bytearray),
            st.lists(st.binary(max_size=2), max_size=1),
        ),
        max_size=3,
    ),
    st.sampled_from(OpCode),
    st.text(max_size=4).map(type("Name", (str,), {})),
)


@SETTINGS
@given(
    code=st.sampled_from(OpCode),
    origin=st.one_of(st.just(ME), st.just(bytearray(ME))),
    seq=st.integers(0, 1 << 40),
    args=st.lists(_ARGS, max_size=7) | st.lists(_ARGS, max_size=7).map(tuple),
)
def test_an_op_sent_is_exactly_what_decoding_its_bytes_gives(
    code: OpCode, origin: bytes, seq: int, args: list[Any]
) -> None:
    """The writer decides its own record as :func:`sent_op` says, every other replica as the
    bytes decode: where ``sent_op`` answers, the two are the same values of the same types."""
    try:
        value = encode_op(code, origin, seq, args)
    except (TypeError, OverflowError, msgspec.EncodeError):
        return  # the caller's encode_op refuses it before anything is appended
    op = sent_op(code, origin, seq, args)
    try:
        decoded = decode_op(value)
    except Exception as exc:
        assert op is None, f"decoding refuses it ({exc}) but sent_op gave {op}"
        return
    if op is not None:
        assert _shape(tuple(op)) == _shape(tuple(decoded))
        assert op.code is decoded.code


@SETTINGS
@given(
    code=st.sampled_from(
        [
            OpCode.PUT,
            OpCode.PUT_IF_ABSENT,
            OpCode.REPLACE,
            OpCode.REMOVE,
            OpCode.REMOVE_IF,
            OpCode.COMPARE_AND_SET,
            OpCode.MERGE,
            OpCode.SET_IF_VERSION,
            OpCode.BARRIER,
        ]
    ),
    value=st.one_of(
        st.sampled_from(VALUES),
        st.sampled_from(VALUES).map(bytearray),
        st.just("3"),
        st.none(),
        st.just(7),
    ),
    before=st.dictionaries(st.sampled_from(KEYS[:2]), st.sampled_from(VALUES)),
    key=st.sampled_from(KEYS[:2]),
)
def test_an_own_record_is_decided_alike_as_sent_and_as_decoded(
    code: OpCode, value: Any, before: dict[bytes, bytes], key: bytes
) -> None:
    """One own record of any op, with arguments of types that decode as themselves or not:
    applied with its sent op and applied from its bytes, it makes the same state, results,
    errors and flush marks."""
    args: list[Any] = {
        OpCode.REMOVE: [],
        OpCode.BARRIER: [],
        OpCode.COMPARE_AND_SET: [value, b"2"],
        OpCode.MERGE: ["test_machine.concat", value],
        OpCode.SET_IF_VERSION: [None, value],
    }.get(code, [value])
    encoded = encode_op(code, ME, 11, args)
    records = numbered([(key, encoded)], 3)
    op = sent_op(code, ME, 11, args)
    assert _decided(records, before, None if op is None else [op]) == _decided(records, before)


def _decided(
    records: list[Record], before: dict[bytes, bytes], sent: list[Any] | None = None
) -> tuple[Any, ...]:
    """What a replica holding ``before``, applied up to offset 3, makes of ``records`` (from
    offset 3 on) applied with the ops ``sent`` (None: decoded): state, results, errors, marks."""
    state = new_state()
    state.store.write(dict(before), {})
    machine = new_machine(state)
    machine.start_at(Positions(3, 2))
    step = machine.apply_batch(records, 3 + len(records), sent)
    carry_out(machine, state, step)
    return (
        contents(state),
        [(kind, seq, repr(arg)) for kind, seq, arg in own_outcomes(step)],
        [(e.offset, e.error) for e in step.errors],
        step.flush_due,
        machine.applied,
        dict(machine.dirty),
        step.updates,
    )


# A pair's value in an own WRITE_MANY: one that decodes as itself (bytes, None, a str that
# the op refuses alike) or one that does not (a bytearray: then only decoding can say).
_PAIR_VALUES = st.one_of(
    st.sampled_from([None, *VALUES]), st.sampled_from(VALUES).map(bytearray), st.just("3")
)


@SETTINGS
@given(
    batch=st.lists(
        st.one_of(
            st.lists(st.tuples(st.sampled_from(KEYS), _PAIR_VALUES), min_size=1, max_size=5),
            st.tuples(st.sampled_from(KEYS), st.sampled_from([None, *VALUES])),
        ),
        min_size=1,
        max_size=2 * BULK_MIN,
    ),
    before=st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES)),
)
def test_an_own_batch_is_decided_alike_as_sent_and_as_decoded(
    batch: list[Any], before: dict[bytes, bytes]
) -> None:
    """A batch of own records (``put_all``'s ``WRITE_MANY`` records, puts and removes), each
    with the op :func:`sent_op` gives for it (None where only decoding can say): applied with
    those ops and applied from the bytes, it makes the same state, results, errors and marks."""
    items: list[tuple[bytes | None, bytes | None]] = []
    ops: list[Any] = []
    for seq, entry in enumerate(batch, 20):
        if isinstance(entry, list):  # a WRITE_MANY of these pairs
            code, args = OpCode.WRITE_MANY, [[k for k, _ in entry], [v for _, v in entry]]
        elif entry[1] is None:
            code, args = OpCode.REMOVE, []
        else:
            code, args = OpCode.PUT, [entry[1]]
        key = entry[0][0] if isinstance(entry, list) else entry[0]
        items.append((key, encode_op(code, ME, seq, args)))
        ops.append(sent_op(code, ME, seq, args))
    records = numbered(items, 3)
    assert _decided(records, before, ops) == _decided(records, before)


def test_a_function_not_registered_stalls_at_its_record() -> None:
    state = new_state()
    machine = new_machine(state)
    records = numbered(
        [
            (b"a", encode_op(OpCode.PUT, ME, 1, [b"1"])),
            (b"a", encode_op(OpCode.MERGE, ME, 2, ["test_machine.nowhere", b"2"])),
            (b"b", encode_op(OpCode.PUT, ME, 3, [b"3"])),
        ]
    )
    step = machine.apply_batch(records, 3)
    assert step.stall is not None and step.stall[0] == 1
    assert step.applied == 1 and own_outcomes(step) == [(RESULT, 1, None)]
    carry_out(machine, state, step)
    assert contents(state) == {b"a": b"1"} and machine.applied == 1


def test_flush_marks_and_requests_follow_the_period() -> None:
    state = new_state()
    machine = new_machine(state)
    records = numbered([(k, encode_op(OpCode.PUT, ME, i, [b"1"])) for i, k in enumerate(KEYS)])
    step = machine.apply_batch(records, 5)
    assert step.flush_due and machine.flush_asked  # offset 3 crossed the first mark
    carry_out(machine, state, step)
    more = numbered([(b"z", encode_op(OpCode.PUT, ME, seq, [b"2"])) for seq in range(9, 14)], 5)
    step = machine.apply_batch(more[:1], 6)
    carry_out(machine, state, step)
    step = machine.apply_batch(more[1:], 10)  # crosses 3 + PERIOD while the flush runs
    assert not step.flush_due and machine.flush_missed == 9
    carry_out(machine, state, step)
    assert machine.flush_ended() and machine.flush_asked  # asked again for the missed mark
    plan = machine.flush_plan()
    assert plan is not None and plan[0] == 9 and set(plan[1]) == {*KEYS, b"z"}
    data, mark = flush_records(plan[1], machine.flush_values(plan[1]), plan[0], ME)
    assert data[-1].key == FLUSH_POINT_KEY and read_flush_point(data[-1].value) == 9
    carry_out(machine, state, machine.apply_batch([Record(None, mark.value, (), None, 0, 10)], 11))
    assert machine.flushed == 9 and not machine.dirty and machine.flush_plan() is None


def test_a_stale_or_malformed_flushed_mark_changes_nothing() -> None:
    state = new_state()
    machine = new_machine(state)
    machine.start_at(Positions(10, 9))
    machine.dirty[b"a"] = 10
    machine.mark_flushed(5)
    machine.mark_flushed("nine")
    assert machine.flushed == 9 and machine.dirty == {b"a": 10}
    with pytest.raises(AssertionError, match="going back"):
        step = Step()
        step.applied = 3
        machine.advance(step)


def test_start_point_resumes_reloads_or_refuses() -> None:
    assert start_point(5, Positions(8, 7)) == Positions(8, 7)
    assert start_point(5, Positions(3, 2), loaded=6) == Positions(7, 6)
    with pytest.raises(DataLossError, match=r"ops\[0\] starts at offset 5"):
        start_point(5, None, loaded=2, where="ops[0]")
    with pytest.raises(ValueError):
        start_point(5, Positions(3, 2))
    assert msgpack.unpackb(flush_records([], [], 4, ME)[0][-1].value or b"") == [4]


@SETTINGS
@given(
    pairs=st.lists(
        st.tuples(st.sampled_from(KEYS), st.sampled_from([None, *VALUES])), min_size=1, max_size=5
    ),
    before=st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES)),
    earlier=st.lists(st.sampled_from(KEYS), max_size=2),
    origin=st.sampled_from([ME, OTHER]),
)
def test_a_batch_is_decided_the_same_with_and_without_its_fast_path(
    pairs: list[tuple[bytes, bytes | None]],
    before: dict[bytes, bytes],
    earlier: list[bytes],
    origin: bytes,
) -> None:
    """WRITE_MANY takes C-level passes for distinct keys and new values with no listener,
    and a loop per pair otherwise (a listener forces the loop): both decide the same, after
    puts earlier in the same batch too."""
    items: list[tuple[bytes | None, bytes | None]] = [
        (k, encode_op(OpCode.PUT, OTHER, 100 + i, [b"3"])) for i, k in enumerate(earlier)
    ]
    args = ([k for k, _ in pairs], [v for _, v in pairs])
    items.append((pairs[0][0], encode_op(OpCode.WRITE_MANY, origin, 7, args)))
    records = numbered(items)
    outcomes = []
    for listen in (False, True):
        state = new_state()
        state.store.write(dict(before), {})
        if listen:
            state.listeners.append(lambda *change: None)
        machine = new_machine(state)
        step = machine.apply_records(records, len(records))
        carry_out(machine, state, step)
        outcomes.append(
            (contents(state), own_outcomes(step), dict(machine.dirty), machine.next_flush)
        )
    assert outcomes[0] == outcomes[1]
    expected, results, _ = fold(records, before)
    assert outcomes[0][0] == expected
    if origin == ME:
        assert outcomes[0][1] == [(RESULT, 7, results[7])]


def test_a_malformed_batch_fails_alike_everywhere_and_changes_nothing() -> None:
    state = new_state()
    machine = new_machine(state)
    bad = [
        encode_op(OpCode.WRITE_MANY, ME, 1, ([b"a", b"b"], [b"1"])),  # lengths differ
        encode_op(OpCode.WRITE_MANY, ME, 2, ([b"a"], [5])),  # a value that is no bytes
        encode_op(OpCode.WRITE_MANY, ME, 3, (b"a", b"1")),  # no arrays
    ]
    step = machine.apply_records(numbered([(b"a", v) for v in bad]), 3)
    carry_out(machine, state, step)
    assert contents(state) == {}
    assert [kind for kind, _, _ in own_outcomes(step)] == [FAILED] * 3
    assert len(step.errors) == 3 and machine.applied == 3


def test_a_batch_counts_its_pairs_toward_the_flush_period() -> None:
    """A batch of many pairs makes a flush due as that many puts would (PERIOD is 4)."""
    state = new_state()
    machine = new_machine(state)
    op = encode_op(OpCode.WRITE_MANY, ME, 1, (KEYS, [b"1"] * len(KEYS)))
    step = machine.apply_records(numbered([(KEYS[0], op)]), 1)
    assert step.flush_due
    other = new_machine(new_state())
    op = encode_op(OpCode.WRITE_MANY, ME, 1, (KEYS[:2], [b"1"] * 2))
    assert not other.apply_records(numbered([(KEYS[0], op)]), 1).flush_due


def test_a_bootstrap_batch_reads_the_same_as_records_or_as_entries() -> None:
    """load_batch takes what read_batch gives (records) and what read_entries gives: the same
    decision, an unreadable value's offset included."""
    items = [(b"a", b"1"), (b"b", b"not json"), (b"a", b"2"), (FLUSH_POINT_KEY, b"\x91\x05")]
    records = numbered(list(items), 10)
    outcomes = []
    for batch in (records, [(r.key, r.value, r.offset or 0) for r in records]):
        state = new_state()
        loaded = load_batch(MapTable([state]), 0, batch, "data")
        outcomes.append((loaded.changes[id(state)], loaded.flush_point, loaded.errors))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == {b"a": b"2", b"b": b"not json"} and outcomes[0][1] == 5
    assert [e.offset for e in outcomes[0][2]] == [11]


@SETTINGS
@given(
    items=st.lists(
        st.tuples(
            st.sampled_from([None, *KEYS[:3], b"\xff", FLUSH_POINT_KEY, SETTINGS_KEY]),
            st.sampled_from([None, b"1", b"2", b"not json"]),
        ),
        min_size=1,
        max_size=12,
    ),
    noted=st.sets(st.sampled_from([*KEYS[:3], b"\xff"])),
)
def test_load_latest_decides_as_load_batch_or_asks_for_the_entries(
    items: list[tuple[bytes | None, bytes | None]], noted: set[bytes]
) -> None:
    """From the last value per key (Log.read_latest), a plain map's bootstrap decides what
    load_batch decides from the records; when a key or value does not read, it returns None
    (the engine then reads the entries again, for the offsets, and load_batch decides)."""
    items = [  # flush points as flushes write them: each covers more than the one before
        (k, msgpack.packb([i]) if k == FLUSH_POINT_KEY else v) for i, (k, v) in enumerate(items)
    ]
    records = numbered(items, 10)
    latest = {r.key: r.value for r in records}
    states = new_state(), new_state()
    for state in states:  # noted unreadable by an earlier stretch
        state.unreadable.update({k: machine_module.ApplyError(0, 1, "earlier", k) for k in noted})
    expected = load_batch(MapTable([states[0]]), 0, records, "data")
    got = load_latest(MapTable([states[1]]), 0, dict(latest))
    if got is None:
        assert any(  # (a tombstone's key too: load_batch then notes nothing)
            k == b"\xff" or v == b"not json"
            for k, v in latest.items()
            if k not in (None, FLUSH_POINT_KEY, SETTINGS_KEY)
        )
        assert states[1].unreadable.keys() == noted  # left for load_batch to decide
        return
    assert not expected.errors
    assert list(got.changes.values()) == list(expected.changes.values())
    assert got.flush_point == expected.flush_point and got.errors == []
    assert states[1].unreadable == states[0].unreadable


def test_keys_that_each_hold_half_a_character_are_unreadable_however_batched() -> None:
    """ "é" is two bytes in UTF-8: a key of the first and the next key of the second join to
    valid UTF-8, though neither reads alone. A replica that reads them in one batch must
    decide as one that reads them one by one (the batch checks once joined the raw bytes and
    stored both as readable keys), applying ops and loading data alike."""
    halves = [b"k\xc3", b"\xa9k"]
    keys = [f"key{i}".encode() for i in range(BULK_MIN)] + halves
    ops = numbered([(k, encode_op(OpCode.PUT, OTHER, i, [b"1"])) for i, k in enumerate(keys)])
    decided = []
    for batches in ([ops], [[r] for r in ops]):
        state = new_state()
        machine = new_machine(state)
        errors = []
        for batch in batches:
            step = machine.apply_batch(batch, (batch[-1].offset or 0) + 1)
            carry_out(machine, state, step)
            errors += [e.offset for e in step.errors]
        decided.append((contents(state), errors, sorted(state.unreadable)))
    assert decided[0] == decided[1]
    assert decided[0][1] == [BULK_MIN, BULK_MIN + 1]
    assert decided[0][2] == halves
    data = numbered([(k, b"1") for k in keys])
    loaded = []
    for batches in ([data], [[r] for r in data]):
        state = new_state()
        offsets = []
        for batch in batches:
            offsets += [e.offset for e in load_batch(MapTable([state]), 0, batch).errors]
        loaded.append((offsets, sorted(state.unreadable)))
    assert loaded[0] == loaded[1] == ([BULK_MIN, BULK_MIN + 1], halves)


def test_a_computed_value_is_held_to_the_room_its_op_carries() -> None:
    """COMPUTE and MERGE take an optional room (key and value bytes at most); the decision
    depends only on the op, so every replica refuses alike. Records without it, from older
    writers, are decided without a limit."""
    bytes_codec = codec_for("bytes")
    for room, fits in ((5, True), (4, False)):  # key b"k" and b"abcd" from a merge: 5 bytes
        args = ("test_machine.concat", b"abcd", room)
        op = decode_op(encode_op(OpCode.MERGE, ME, 1, args))
        assert op.args == args
        if fits:
            assert decide(OpCode.MERGE, op.args, None, b"k", STR, bytes_codec)[1] == b"abcd"
        else:
            with pytest.raises(ResultTooLargeError, match="over the 4 bytes"):
                decide(OpCode.MERGE, op.args, None, b"k", STR, bytes_codec)
    unbounded = ("test_machine.concat", b"abcd")
    assert decide(OpCode.MERGE, unbounded, None, b"k", STR, bytes_codec)[1] == b"abcd"
    with pytest.raises(OperationFailedError, match="must be an int"):
        decide(OpCode.MERGE, (*unbounded, "5"), None, b"k", STR, bytes_codec)
    with pytest.raises(DecodeError, match="takes 2 or 3 arguments, not 4"):
        decode_op(encode_op(OpCode.COMPUTE, ME, 1, ("f", b"\x90", 5, 6)))


def test_keys_of_names_every_key_a_batch_writes() -> None:
    """What a resumed replica marks dirty and a deep check's replay compares: every key of a
    batch, with a time to live too (the ttl batches were read as their first key only)."""
    machine = new_machine(new_state())
    keys, values = [b"a", b"b", b"c"], [b"1", None, b"3"]
    batches = [
        encode_op(OpCode.WRITE_MANY, ME, 1, (keys, values)),
        encode_op(OpCode.WRITE_MANY_TTL, ME, 2, (keys, values, 9_000)),
        encode_op(OpCode.PUT_FOR, ME, 3, (keys, values, 9_000)),
        encode_op(OpCode.TRANSACT, ME, 4, ([], [], [], [], keys, values)),
    ]
    for value in batches:
        assert set(machine.keys_of(Record(b"a", value))) == {b"a", b"b", b"c"}, decode_op(value)
    single = encode_op(OpCode.PUT_FOR, ME, 5, (b"1", 9_000))
    assert machine.keys_of(Record(b"a", single)) == [b"a"]
    assert machine.keys_of(Record(None, encode_op(OpCode.BARRIER, ME, 6))) == []
