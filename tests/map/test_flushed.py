"""A partition read straight from its last flush (kafkakv.map.flushed): the same rows and
offset as a reference replica gives (partition_at), whenever the flush covers the offset asked
for; no answer (None) where ops after the flush, a record prefix, versions or expiry need the
replica."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kafkakv.errors import DecodeError
from kafkakv.log.base import Record
from kafkakv.map.flushed import flushed_columns
from kafkakv.map.keyspace import FLUSH_POINT_KEY
from kafkakv.map.machine import MapState
from kafkakv.map.reference import partition_at, planned
from kafkakv.store.memory import DictStore
from tests.map.conftest import OpenMap

pytestmark = pytest.mark.parametrize("store_kind", ["dict"])


def _by_replica(m: Any, p: int, at: int) -> tuple[list[tuple[bytes, bytes]], int]:
    engine, state = m._engine, m._state
    mirror = MapState(state.name, state.prefix, state.keys, state.values, DictStore())
    plan = planned(engine.log, engine.topics, 10.0)
    keys, values, reflected = partition_at(engine.log, engine.topics, plan, mirror, p, at)
    return sorted(zip(keys, values, strict=True)), reflected


def _by_columns(m: Any, p: int, at: int, prefix: bytes = b"") -> Any:
    engine = m._engine
    plan = planned(engine.log, engine.topics, 10.0)
    return flushed_columns(engine.log, engine.topics, plan, p, at, prefix)


def test_a_flushed_partition_reads_as_the_reference_replica_loads_it(open_map: OpenMap) -> None:
    """Puts, overwrites and removes over several flushes, then a flush: every partition's
    columns are its rows at its end offset, and at any offset the flush covers; after more
    ops, the partitions they touched have no answer, the others still do."""
    m = open_map(partitions=3)
    rnd = random.Random(46)
    for round_ in range(4):
        for _ in range(150):
            key = f"k{rnd.randrange(120)}"
            if rnd.random() < 0.2:
                m.pop(key, None)
            else:
                m.put(key, {"round": round_, "n": rnd.randrange(10**6)})
        m.flush()
    ends = m.applied_offsets()
    for p, end in ends.items():
        # At the end (past the flush's FLUSHED mark), and at an offset the flush passed: the
        # state after the flush, as the replica gives it.
        for at in (end, end // 2):
            found = _by_columns(m, p, at)
            assert found is not None, f"partition {p} is flushed past {at}"
            assert (sorted(found.columns.pairs()), found.reflected) == _by_replica(m, p, at)
        assert found.columns.apart.keys() == {FLUSH_POINT_KEY}
        assert _by_columns(m, p, end).reflected == end
    m.put("after", 1)
    touched = m._engine.keyspace.partition_of(m._state.prefix + m._state.keys.encode("after"))
    later = m.applied_offsets()
    assert _by_columns(m, touched, later[touched]) is None
    assert _by_columns(m, touched, ends[touched]) is not None  # as it stood before the put
    for p in set(later) - {touched}:
        assert _by_columns(m, p, later[p]) is not None


def test_a_map_never_flushed_has_no_columns_past_its_first_op(open_map: OpenMap) -> None:
    m = open_map(partitions=1)
    assert _by_columns(m, 0, 0).columns.length == 0  # nothing to apply: the empty map
    m.put("a", 1)
    assert _by_columns(m, 0, m.applied_offsets()[0]) is None


def test_maps_whose_state_the_columns_do_not_keep_have_no_answer(open_map: OpenMap) -> None:
    """A record prefix (a map sharing its topics), versions and expiry: the replica's way."""
    for name, options in (("v", {"versions": True}), ("e", {"expiry": True}), ("p", {})):
        m = open_map(f"no-columns-{name}", partitions=1, **options)
        m.put("a", 1)
        m.flush()
        end = m.applied_offsets()[0]
        found = _by_columns(m, 0, end, prefix=b"" if options else b"m1:")
        assert found is None, options


def test_a_flush_point_that_does_not_decode_fails_as_a_bootstrap_does(open_map: OpenMap) -> None:
    m = open_map(partitions=1)
    m.put("a", 1)
    m.flush()
    engine = m._engine
    engine.log.append(engine.topics.data, 0, [Record(FLUSH_POINT_KEY, b"\xc1")])
    with pytest.raises(DecodeError, match="flush point"):
        _by_columns(m, 0, m.applied_offsets()[0])
