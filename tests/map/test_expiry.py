"""Expiry (``expiry=True``): keys put with a time to live read as absent once their deadline
passes, are removed by ``EXPIRE`` ops that every replica applies, and leave the data topic.

One clock decides, the log's: the state machine takes a ``PUT_FOR``'s deadline from its
record's timestamp and decides each op by its record's timestamp (pure tests drive it with
chosen timestamps, and a Hypothesis model checks that no key is removed before its record's
stamp plus its ttl); reads and reapers go by the replica's estimate of the log's clock (map
tests wait for real deadlines, short ones; tests/map/test_logclock.py tests the estimate,
tests/kafka/test_clock_skew.py clients with skewed clocks).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv.codecs import codec_for
from kafkakv.errors import ConfigError, TopicMismatchError
from kafkakv.log.base import Record
from kafkakv.log.kafka import KafkaLog
from kafkakv.map import SortedReplicaMap
from kafkakv.map.machine import MapState, MapTable, PartitionMachine, Step
from kafkakv.map.ops import BARRIER_VALUE, OpCode, decode_op, encode_op
from kafkakv.store.memory import DictStore
from tests.map.conftest import OpenMap, compact_if_possible, local_logs, shared_logs
from tests.map.test_map_protocol import read_all
from tests.waiting import wait_for

STR, JSON = codec_for("str"), codec_for("json")


# -- the state machine, by record time -------------------------------------------------------
def _machine() -> tuple[PartitionMachine, MapState]:
    state = MapState("m", b"", STR, JSON, DictStore(), expiries={})
    return PartitionMachine(0, MapTable([state]), b"me" * 4, 1000, "ops"), state


def _apply(machine: PartitionMachine, state: MapState, *ops: tuple[Any, ...]) -> Step:
    """Apply ``(key, code, args, timestamp)`` ops as one batch and write the step."""
    first = machine.applied
    records = [
        Record(k, encode_op(code, b"other!!!", first + i, args), (), ts, 0, first + i)
        for i, (k, code, args, ts) in enumerate(ops)
    ]
    step = machine.apply_batch(records, first + len(records))
    state.store.write(step.changes.get(id(state), {}), {0: step.positions})
    machine.advance(step)
    return step


def test_ops_decide_by_their_records_time_and_expire_removes_only_its_own_deadline() -> None:
    machine, state = _machine()
    _apply(machine, state, (b"k", OpCode.PUT_TTL, (b"1", 5000), 1000))
    assert state.expiries == {b"k": 5000}
    # Before the deadline (record time 4999) the key is there; at it, it is absent.
    _apply(machine, state, (b"k", OpCode.PUT_IF_ABSENT, (b"2",), 4999))
    assert state.store.get(b"k") == b"1"
    _apply(machine, state, (b"k", OpCode.EXPIRE, (5000,), 4999))  # too early: nothing
    assert state.store.get(b"k") == b"1"
    _apply(machine, state, (b"k", OpCode.EXPIRE, (4000,), 6000))  # not its deadline
    assert state.store.get(b"k") == b"1"
    step = _apply(machine, state, (b"k", OpCode.EXPIRE, (5000,), 5000))
    assert state.store.get(b"k") is None and state.expiries == {}
    assert b"k" in machine.dirty and step.errors == []
    # An expired key is absent for a put-if-absent, which sets it (and clears the deadline).
    _apply(machine, state, (b"j", OpCode.PUT_TTL, (b"1", 5000), 1000))
    _apply(machine, state, (b"j", OpCode.PUT_IF_ABSENT, (b"2",), 5000))
    assert state.store.get(b"j") == b"2" and state.expiries == {}
    # A plain put clears a deadline; a batch with a deadline sets one on each of its puts.
    _apply(machine, state, (b"a", OpCode.WRITE_MANY_TTL, ((b"a", b"b"), (b"1", None), 9000), 1))
    assert state.expiries == {b"a": 9000}
    step = _apply(machine, state, (b"a", OpCode.PUT, (b"1",), 2))
    assert state.expiries == {} and state.store.get(b"a") == b"1"
    assert not step.expiring


def test_put_for_takes_its_deadline_from_its_records_stamp_whatever_the_writer_clock() -> None:
    """A ``PUT_FOR`` carries a ttl: the deadline is its record's stamp plus the ttl, on every
    replica. An ``EXPIRE`` stamped before it changes nothing and hands the key back to the
    reapers (``Step.expiring``, ``Step.early``); one stamped at it removes the key."""
    machine, state = _machine()
    step = _apply(machine, state, (b"k", OpCode.PUT_FOR, (b"1", 30_000), 1_000_000))
    assert state.expiries == {b"k": 1_030_000} and step.expiring == [(1_030_000, b"k")]
    assert step.log_time == 1_000_000 and step.early == 0
    # A reaper whose clock ran 30 s ahead proposed at once: stamped by the log, too early.
    step = _apply(machine, state, (b"k", OpCode.EXPIRE, (1_030_000,), 1_000_040))
    assert state.store.get(b"k") == b"1" and state.expiries == {b"k": 1_030_000}
    assert step.expiring == [(1_030_000, b"k")] and step.early == 1_000_040
    assert step.log_time == 1_000_040 and step.errors == []
    # Ops stamped before the deadline find the key; at the deadline it is absent.
    _apply(machine, state, (b"k", OpCode.PUT_IF_ABSENT, (b"2",), 1_029_999))
    assert state.store.get(b"k") == b"1"
    step = _apply(machine, state, (b"k", OpCode.EXPIRE, (1_030_000,), 1_030_000))
    assert state.store.get(b"k") is None and state.expiries == {}
    assert not step.expiring and step.early == 0
    # An EXPIRE of a key put again (another deadline) or absent is no reason to reap again.
    _apply(machine, state, (b"j", OpCode.PUT_FOR, (b"1", 10), 5))
    step = _apply(machine, state, (b"j", OpCode.EXPIRE, (999,), 6))
    assert not step.expiring and step.early == 0
    # A batch: every put gets the record's stamp plus the ttl; a remove gets none.
    many = ((b"a", b"b", b"c"), (b"1", b"2", None), 500)
    step = _apply(machine, state, (b"a", OpCode.PUT_FOR, many, 7_000))
    assert state.expiries == {b"a": 7_500, b"b": 7_500, b"j": 15}
    assert sorted(step.expiring) == [(7_500, b"a"), (7_500, b"b")] and step.log_time == 7_000


@pytest.mark.parametrize(
    "args",
    [(b"1", 0), (b"1", -5), (b"1", 1.5), (b"1", None), ("str", 10), ((b"a",), (b"1",), 0)],
)
def test_a_malformed_put_for_fails_alike_and_changes_nothing(args: tuple[Any, ...]) -> None:
    machine, state = _machine()
    step = _apply(machine, state, (b"a", OpCode.PUT_FOR, args, 1000))
    assert len(step.errors) == 1 and state.store.get(b"a") is None and state.expiries == {}


def test_records_of_the_older_format_still_carry_the_writers_deadline() -> None:
    """``PUT_TTL`` and ``WRITE_MANY_TTL``, written by replicas before ``PUT_FOR``, keep their
    meaning: the deadline they carry, whatever their record's stamp."""
    machine, state = _machine()
    _apply(
        machine,
        state,
        (b"k", OpCode.PUT_TTL, (b"1", 5000), 900_000),
        (b"a", OpCode.WRITE_MANY_TTL, ((b"a",), (b"1",), 9000), 900_001),
    )
    assert state.expiries == {b"k": 5000, b"a": 9000}


@st.composite
def _expiry_log(draw: st.DrawFn) -> list[tuple[bytes, OpCode, tuple[Any, ...], int]]:
    """Ops of two keys with log stamps that mostly go up, sometimes back (a new leader whose
    clock is behind); ``EXPIRE`` of the key's deadline, or of another."""
    ops: list[tuple[bytes, OpCode, tuple[Any, ...], int]] = []
    ts = 1_000
    deadlines: dict[bytes, int] = {}
    for _ in range(draw(st.integers(1, 30))):
        ts = max(1, ts + draw(st.integers(-20, 60)))
        key = draw(st.sampled_from([b"a", b"b"]))
        kind = draw(st.sampled_from(["for", "for", "put", "remove", "expire", "expire"]))
        if kind == "for":
            ttl = draw(st.integers(1, 100))
            ops.append((key, OpCode.PUT_FOR, (b"v%d" % ts, ttl), ts))
            deadlines[key] = ts + ttl
        elif kind == "put":
            ops.append((key, OpCode.PUT, (b"p",), ts))
        elif kind == "remove":
            ops.append((key, OpCode.REMOVE, (), ts))
        else:
            deadline = deadlines.get(key, ts) + draw(st.sampled_from([0, 0, 0, 1, -1]))
            ops.append((key, OpCode.EXPIRE, (deadline,), ts))
    return ops


@settings(max_examples=300, derandomize=True, deadline=None)
@given(_expiry_log(), st.integers(1, 5))
def test_no_key_is_removed_before_its_records_stamp_plus_its_ttl(
    ops: list[tuple[bytes, OpCode, tuple[Any, ...], int]], cut: int
) -> None:
    """A model of expiry by the log's clock, against the machine, in batches of any size: a
    key put for ttl ms at stamp t lives until an op stamped t + ttl or later; an ``EXPIRE``
    removes it only then, and one stamped earlier hands it back to the reapers."""
    machine, state = _machine()
    model: dict[bytes, tuple[bytes, int | None]] = {}  # key -> (value, deadline)
    for start in range(0, len(ops), cut):
        batch = ops[start : start + cut]
        step = _apply(machine, state, *batch)
        rearmed: list[tuple[int, bytes]] = []
        for key, code, args, ts in batch:
            held = model.get(key)
            live = held is not None and (held[1] is None or held[1] > ts)
            if code is OpCode.PUT_FOR:
                model[key] = (args[0], ts + args[1])
            elif code is OpCode.PUT:
                model[key] = (args[0], None)
            elif code is OpCode.REMOVE and live:
                del model[key]
            elif code is OpCode.EXPIRE and held is not None and held[1] == args[0]:
                if args[0] <= ts:
                    del model[key]
                else:
                    rearmed.append((args[0], key))
        assert {k: state.store.get(k) for k in (b"a", b"b")} == {
            k: model[k][0] if k in model else None for k in (b"a", b"b")
        }
        assert state.expiries == {k: d for k, (_, d) in model.items() if d is not None}
        assert set(rearmed) <= set(step.expiring)
        assert step.log_time == max(
            [ts for _, c, _, ts in batch if c in (OpCode.PUT_FOR, OpCode.EXPIRE)], default=0
        )


def test_a_map_without_expiry_refuses_expiring_ops_alike() -> None:
    state = MapState("m", b"", STR, JSON, DictStore())
    machine = PartitionMachine(0, MapTable([state]), b"me" * 4, 1000, "ops")
    step = _apply(machine, state, (b"k", OpCode.PUT_TTL, (b"1", 5000), 1000))
    assert "has no expiry" in step.errors[0].error and state.store.get(b"k") is None


# -- maps -----------------------------------------------------------------------------------
def test_expired_keys_read_as_absent_then_every_replica_removes_them(open_map: OpenMap) -> None:
    writer = open_map(expiry=True, partitions=2, flush_period=100_000)
    reader = open_map(expiry=True, partitions=2, flush_period=100_000)
    short = 3.0 if isinstance(writer._engine.log, KafkaLog) else 0.4  # Kafka puts take longer
    with reader.changes(timeout=5) as feed:
        put_at = time.time()
        writer.put("a", 1, ttl=short)
        writer.put_async("b", 2, ttl=short).result(timeout=30)
        writer.put_all({"c": 3, "d": 4}, ttl=short)
        writer.put_all_async({"e": 5}, ttl=60).result(timeout=30)
        writer.put("f", 6, ttl=short)
        writer.put("f", 7)  # a put without ttl clears the deadline
        reader.sync()
        try:
            left = reader.ttl("a")
        except KeyError:  # only once its deadline passed: a slow log (CI, Kafka) can take that
            assert time.time() - put_at >= short - 0.05, "a live key read as expired"
        else:
            assert left is not None and 0 < left <= short
        assert reader.ttl("f") is None
        wait_for(lambda: not {"a", "b", "c", "d"} & (set(writer) | set(reader)), 10 + short)
        for m in (writer, reader):
            assert dict(m) == {"e": 5, "f": 7} and len(m) == 2
            assert m.get("c") is None and "d" not in m
            with pytest.raises(KeyError):
                m["b"]
            with pytest.raises(KeyError):
                m.ttl("a")
        # The EXPIRE ops arrive: the stores let go of the keys, and the feed tells it.
        gone = {"a", "b", "c", "d"}

        def removed() -> bool:
            stores = [m._state.store for m in (writer, reader)]
            return all(s.get(k.encode()) is None for s in stores for k in gone)

        wait_for(removed, 10, "every replica to apply the EXPIRE ops")
        feed.timeout = 0.2  # everything is applied: take what is queued
        told = [(c.key, c.new) for c in feed if c.new is None]
        assert {k for k, _ in told} == gone
    assert 40 < reader.ttl("e") <= 60  # type: ignore[operator]


@local_logs
def test_a_reaper_whose_estimate_runs_ahead_proposes_in_vain_then_measures_and_waits(
    open_map: OpenMap,
) -> None:
    """A replica whose estimate of the log's clock runs 60 s ahead (a leader whose clock was
    ahead, then a new one that is not) proposes an ``EXPIRE`` at once: the log stamps it
    before the deadline, so it changes nothing; every replica hands the key back, this one
    measures the clock again, and from then on proposes once the deadline has passed: one
    record, not a loop of them.

    Every step waits on its event: the key's first ttl (20 s) is far longer than the early
    proposal can take, so the proposal is early by construction rather than by winning a race
    with a short ttl (under CPU stress the reaper once ran after a 0.5 s deadline, and the
    scenario never happened). The second put, by the clock measured again, takes a short ttl."""
    m = open_map(expiry=True, flush_period=100_000)
    engine = m._engine
    engine.reaper.clock_is_local = False  # go by the estimate, as on Kafka
    engine.log_clock.measured(0, int(time.time() * 1000) + 60_000, time.monotonic() * 1000)
    ops_topic = engine.topics.ops

    def expires() -> list[Record]:
        ops = read_all(engine.log, ops_topic, 0)
        return [r for r in ops if r.key is not None and decode_op(r.value).code is OpCode.EXPIRE]

    def measured_after(offset: int | None) -> bool:  # a barrier (a measurement) past offset
        ops = read_all(engine.log, ops_topic, 0)
        barriers = [r for r in ops if (r.offset or 0) > (offset or 0) and r.value == BARRIER_VALUE]
        return engine.log_clock.fresh(0) and bool(barriers)

    m.put("k", 1, ttl=20)
    first_deadline: int = m._state.expiries[b"k"]  # type: ignore[index]
    wait_for(expires, 10, "the early EXPIRE")
    wait_for(lambda: measured_after(expires()[0].offset), 10, "the clock measured again")
    early = expires()
    assert all((r.timestamp or 0) < first_deadline for r in early)  # early, so in vain
    assert m._state.store.get(b"k") is not None and m.get("k") == 1
    now = engine.log_now()
    assert now is not None and now <= time.time() * 1000  # measured again: behind, not ahead

    put_at = time.monotonic()
    m.put("k", 2, ttl=0.5)
    deadline = m._state.expiries[b"k"]  # type: ignore[index]
    store = m._state.store
    wait_for(lambda: store.get(b"k") is None, 10, "the key to be reaped")
    assert time.monotonic() - put_at >= 0.5
    later = expires()[len(early) :]
    assert len(later) == 1, [r.timestamp for r in later]  # on time, once: no loop
    assert (later[0].timestamp or 0) >= deadline
    assert 1 <= len(early) <= 2, len(early)  # no proposals while the clock was unmeasured


@local_logs
def test_len_counts_from_one_state_while_expire_ops_apply(open_map: OpenMap) -> None:
    """len of a map with expiry takes the store's size and its expired keys from one state:
    taken apart, an EXPIRE op applied in between made it count a key twice (CI, len 1 for
    2 live keys). Taken under the replica lock in a loop, len kept the appliers out until the
    lock went to the threads waiting for it (kafkakv.map.replicalock)."""
    m = open_map(expiry=True, flush_period=100_000)
    m.put_all({"stay1": 1, "stay2": 2})
    m.put_all({f"k{i:05}": i for i in range(3000)}, ttl=0.3)
    keys = [f"k{i:05}".encode() for i in range(3000)]
    expires_ms = m._state.expiries[keys[0]]  # type: ignore[index]  # one deadline: one batch
    after = []  # each len taken past the deadline while the store still held expired keys
    limit = time.monotonic() + 20
    while held := sum(1 for k in keys if m._state.store.get(k) is not None):
        started_ms = m._engine.read_now()  # reads go by the replica's log clock
        n = len(m)
        if started_ms > expires_ms:
            after.append(n)
        else:
            assert n in (3002, 2), f"len {n} with {held} keys held"
        assert time.monotonic() < limit, "the EXPIRE ops did not all apply within 20 s"
    assert after, "every key was reaped before len was taken past the deadline"
    assert set(after) == {2}, f"len while EXPIRE ops applied: {sorted(set(after))}"
    assert len(m) == 2 and dict(m) == {"stay1": 1, "stay2": 2}


@local_logs
@pytest.mark.parametrize("store_kind", ["dict"])
def test_expired_keys_leave_the_data_topic_and_a_fresh_replica_never_holds_them(
    open_map: OpenMap,
) -> None:
    m = open_map(expiry=True, flush_period=100_000)
    m.put_all({f"short{i}": i for i in range(20)}, ttl=0.3)
    m.put_all({f"long{i}": i for i in range(5)}, ttl=3600)
    m.flush()  # the short ones reach the data topic with their deadlines
    wait_for(lambda: m._state.store.get(b"short0") is None, 10, "the EXPIRE ops")
    wait_for(lambda: all(m._state.store.get(f"short{i}".encode()) is None for i in range(20)), 10)
    m.flush()
    engine = m._engine
    compact_if_possible(engine.log, engine.topics.data)
    fresh = open_map(expiry=True)
    assert dict(fresh) == {f"long{i}": i for i in range(5)}
    assert all(fresh._state.store.get(f"short{i}".encode()) is None for i in range(20))
    assert 3500 < fresh.ttl("long0") <= 3600  # type: ignore[operator]
    data = read_all(engine.log, engine.topics.data, 0)
    latest = {r.key: r for r in data}
    assert all(latest[f"short{i}".encode()].value is None for i in range(20))
    assert all(("kafkakv.expires" in dict(latest[f"long{i}".encode()].headers)) for i in range(5))


@pytest.mark.parametrize("store_kind", ["sorted"])
def test_a_sorted_map_steps_over_expired_keys(open_map: OpenMap) -> None:
    m = open_map(expiry=True, key_codec="str")
    assert isinstance(m, SortedReplicaMap)
    m.put_all({"a": 1, "c": 3, "e": 5})
    m._engine.reaper.stop()  # no EXPIRE op: the reads alone skip the expired keys
    m.put_all({"b": 2, "d": 4, "f": 6}, ttl=0.2)
    wait_for(lambda: m._engine.read_now() > m._state.expiries[b"b"], 10, "the deadline")  # type: ignore[index]
    with m._engine.paused():
        assert m._state.store.get(b"b") is not None
        assert m.first_key() == "a" and m.last_key() == "e"
        assert m.ceiling_key("b") == "c" and m.floor_key("f") == "e"
        assert m.higher_key("c") == "e" and m.lower_key("c") == "a"
        assert [k for k, _ in m.range("a", "z")] == ["a", "c", "e"]
        assert dict(m) == {"a": 1, "c": 3, "e": 5} and len(m) == 3 and "b" not in m


def test_expiry_is_refused_where_the_map_has_none(open_map: OpenMap, map_name: str) -> None:
    plain = open_map()
    with pytest.raises(ConfigError, match="has no expiry"):
        plain.put("k", 1, ttl=1)
    with pytest.raises(ConfigError, match="has no expiry"):
        plain.put_all({"k": 1}, ttl=1)
    with pytest.raises(ConfigError, match="has no expiry"):
        plain.ttl("k")
    m = open_map(map_name + "-e", expiry=True)
    for bad in (0, -1, "1", True, float("nan"), 1e12):
        with pytest.raises(ConfigError):
            m.put("k", 1, ttl=bad)  # type: ignore[arg-type]
    assert "k" not in m


@shared_logs
@pytest.mark.parametrize("store_kind", ["dict"])
def test_expiry_is_fixed_when_the_map_is_created(open_map: OpenMap) -> None:
    m = open_map(expiry=True)
    m.put("k", 1, ttl=60)
    with pytest.raises(TopicMismatchError, match="expiry=True"):
        open_map(expiry=False)
    adopted = open_map()  # None: as the map was created
    assert adopted.creation_options["expiry"] and 40 < adopted.ttl("k") <= 60  # type: ignore[operator]


def test_a_removed_key_keeps_its_deadline_until_the_store_no_longer_holds_it() -> None:
    """Readers take the store and the deadlines without the replica lock, and the engine
    writes the store only when it carries a step out: an expired key whose deadline went
    first would read as alive again in between."""
    machine, state = _machine()
    _apply(machine, state, (b"k", OpCode.PUT_TTL, (b"1", 5000), 1000))
    first = machine.applied
    record = Record(b"k", encode_op(OpCode.EXPIRE, b"other!!!", first, (5000,)), (), 5000, 0, first)
    step = machine.apply_batch([record], first + 1)
    # Decided, not yet carried out: the store still holds the key, so its deadline stays.
    assert state.store.get(b"k") == b"1" and state.expiries == {b"k": 5000}
    state.store.write(step.changes.get(id(state), {}), {0: step.positions})
    machine.advance(step)
    assert state.store.get(b"k") is None and state.expiries == {}
    # Removed and written again in one step: the new deadline stays.
    _apply(machine, state, (b"j", OpCode.PUT_TTL, (b"1", 9000), 6000))
    _apply(
        machine,
        state,
        (b"j", OpCode.REMOVE, (), 6001),
        (b"j", OpCode.PUT_TTL, (b"2", 9999), 6002),
    )
    assert state.store.get(b"j") == b"2" and state.expiries == {b"j": 9999}
    _apply(machine, state, (b"j", OpCode.REMOVE, (), 6003), (b"j", OpCode.PUT, (b"3",), 6004))
    assert state.store.get(b"j") == b"3" and state.expiries == {}
