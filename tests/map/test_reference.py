"""A reference replica (kafkakv.map.reference): loaded from the data topic alone, then the ops
replayed up to a given offset and no further, through the engine's own apply step."""

from __future__ import annotations

import pytest

from kafkakv import functions
from kafkakv.errors import DataLossError, PartitionStalledError
from kafkakv.log.base import Record
from kafkakv.map.machine import MapState
from kafkakv.map.ops import OpCode, encode_op
from kafkakv.map.reference import partition_at, planned, rebuild, reference, replay, state_at
from kafkakv.map.topics import MapTopics
from kafkakv.store.memory import DictStore
from tests.map.conftest import OpenMap


@pytest.mark.parametrize("store_kind", ["dict"])
def test_a_reference_replica_is_the_flushed_data_then_the_ops_up_to_its_stop(
    open_map: OpenMap,
) -> None:
    m = open_map(partitions=1)
    for k in "abcde":
        m.put(k, k.upper())
    m.flush()
    m.put("f", "F")
    m.put("b", "B2")
    m.remove("a")
    engine, state = m._engine, m._state
    end = engine.positions()[0].applied
    record_key = {k: state.prefix + state.keys.encode(k) for k in "abcdef"}
    mirror = MapState(state.name, state.prefix, state.keys, state.values, DictStore())
    ref = reference(engine, mirror)
    try:
        flushed = rebuild(ref, 0)
        assert ref.positions()[0].applied == flushed + 1  # the ops after the flush point next
        assert sorted(mirror.store) == [state.keys.encode(k) for k in "abcde"]
        # Every op but the last (the remove of "a"): applied, and named by the keys returned.
        assert replay(ref, 0, end - 1) == {record_key["f"], record_key["b"]}
        assert ref.positions()[0].applied == end - 1
        assert mirror.store.get(state.keys.encode("a")) is not None
        # The last one: the reference now holds what the replica holds.
        assert replay(ref, 0, end) == {record_key["a"]}
        assert ref.positions()[0].applied == end
        assert dict(mirror.store.items()) == dict(state.store.items())
        assert replay(ref, 0, end) == set()  # at its stop already: nothing read
        # It never flushes, so it notes no dirty keys, as the replica does for its flushes.
        assert engine.machines[0].dirty and not ref.machines[0].dirty
    finally:
        ref.close()


@pytest.mark.parametrize("store_kind", ["dict"])
def test_a_reference_replica_applies_a_value_that_does_not_read_and_notes_nothing(
    open_map: OpenMap, map_name: str
) -> None:
    """What a value that does not read does to a store is the same everywhere; noting it is
    for a replica's own reader, which a reference replica has not."""
    m = open_map(partitions=1)
    puts = [m.put_async(f"k{i}", i) for i in range(50)]  # one writer's run: a bulk batch
    for put in puts:
        put.result(timeout=30)  # every one in the log before the foreign one
    foreign = encode_op(OpCode.PUT, b"foreign!", 0, [b"not json"])
    m._engine.log.append(MapTopics.for_name(map_name).ops, 0, [Record(b"k3", foreign)])
    m.sync()
    engine, state = m._engine, m._state
    mirror = MapState(state.name, state.prefix, state.keys, state.values, DictStore())
    ref = reference(engine, mirror)
    try:
        rebuild(ref, 0)
        replay(ref, 0, engine.positions()[0].applied)
        assert dict(mirror.store.items()) == dict(state.store.items())
        assert mirror.store.get(b"k3") == b"not json"
        assert list(state.unreadable) == [b"k3"] and [e.key for e in engine.errors] == [b"k3"]
        assert not mirror.unreadable and not ref.errors
    finally:
        ref.close()


@pytest.mark.parametrize("store_kind", ["dict"])
def test_the_state_at_an_offset_is_exact_unless_a_flush_passed_it(open_map: OpenMap) -> None:
    m = open_map(partitions=1)
    m.put_all({"a": "1", "b": "2"})
    m.flush()
    middle = m.applied_offsets()[0]
    m.put("c", "3")
    m.put("a", "4")
    end = m.applied_offsets()[0]
    engine, state = m._engine, m._state

    def state_of(stop: int) -> tuple[dict[bytes, bytes], int]:
        mirror = MapState(state.name, state.prefix, state.keys, state.values, DictStore())
        ref = reference(engine, mirror)
        try:
            at = state_at(ref, 0, stop)
            assert ref.positions()[0].applied == at
            return dict(zip(*mirror.store.columns(), strict=True)), at
        finally:
            ref.close()

    enc, value = state.keys.encode, state.values.encode
    assert state_of(middle) == ({enc("a"): value("1"), enc("b"): value("2")}, middle)
    assert state_of(end) == (dict(state.store.items()), end)
    with pytest.raises(DataLossError, match=f"short of {end + 5}"):
        state_of(end + 5)
    m.flush()  # the data topic now holds the state at the end: nothing older is left to load
    items, at = state_of(middle)
    assert at >= end and items == dict(state.store.items())
    functions.register("ref-add")(lambda key, old, n: n)
    try:
        m.compute("d", "ref-add", 1)
    finally:
        functions.unregister("ref-add")  # as in a process that lacks it
    with pytest.raises(PartitionStalledError, match="ref-add"):
        state_of(m.applied_offsets()[0])


@pytest.mark.parametrize("store_kind", ["dict"])
def test_a_reader_plans_once_and_loads_each_partition_from_the_log_alone(
    open_map: OpenMap,
) -> None:
    """What a Spark read does: the map's topics and settings checked once (planned), then each
    partition loaded at an offset by a reference replica of its own that is closed after
    (partition_at): the partitions together are the replica's contents."""
    m = open_map(partitions=2)
    m.put_all({k: k.upper() for k in "abcdefgh"})
    m.flush()
    m.put("z", "Z")
    m.remove("a")
    engine, state = m._engine, m._state
    plan = planned(engine.log, engine.topics, 5.0)
    assert plan.partitions == 2 and plan.settings.barriers == "offset"
    loaded: dict[bytes, bytes] = {}
    for p, end in m.applied_offsets().items():
        mirror = MapState(state.name, state.prefix, state.keys, state.values, DictStore())
        keys, values, at = partition_at(engine.log, engine.topics, plan, mirror, p, end)
        assert at == end and keys and not loaded.keys() & set(keys)
        loaded.update(zip(keys, values, strict=True))
    assert loaded == dict(state.store.items())
