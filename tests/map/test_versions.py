"""Versions (``versions=True``): each key carries the ops offset of its last change.

The oracle is the change feed, which tells the offset of every change: a key's version must be
the offset of its last one, the same on every replica, including one that starts after a flush
and compaction and loads the versions from the data topic's headers. Compares by version must
not be fooled by a value that changed and changed back.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kafkakv.errors import ConfigError, OperationFailedError, TopicMismatchError
from kafkakv.map.ops import OpCode
from kafkakv.store import LmdbStore
from tests.map.conftest import OpenMap, compact_if_possible, shared_logs
from tests.map.test_map_protocol import _seed


def _versions(m: Any) -> dict[Any, tuple[Any, int] | None]:
    return {k: m.get_versioned(k) for k in sorted(m)}


def test_versions_are_the_offset_of_each_keys_last_change_on_every_replica(
    open_map: OpenMap,
) -> None:
    """Puts (some of an unchanged value), removes, batches, transactions and
    compare-and-sets from one replica: every key's version is the offset of its last change
    as the feed told it, on the writer, on another replica, and on one that starts after a
    flush (data topic) plus more updates (ops)."""
    rng = random.Random(_seed())
    writer = open_map(partitions=2, versions=True, hash_tags=True, flush_period=100_000)
    reader = open_map(partitions=2, versions=True, hash_tags=True, flush_period=100_000)
    last: dict[Any, int] = {}
    with writer.changes(timeout=0.3) as feed:
        for round_ in range(120):
            key, value = f"{{g{rng.randrange(2)}}}:{rng.randrange(6)}", rng.randrange(3)
            roll = rng.random()
            if roll < 0.4:
                writer.put(key, value)
            elif roll < 0.55:
                writer.remove(key)
            elif roll < 0.7:
                writer.put_all({key: value, f"{key}x": value})
            elif roll < 0.85:
                writer.transaction(expect={key: value}, put={f"{key}y": round_})
            else:
                writer.compare_and_set(key, value, value + 1)
            if round_ == 80:
                writer.flush()
        for change in feed:
            if change.new is None:
                last.pop(change.key, None)
            else:
                last[change.key] = change.offset
    expected = {k: (writer[k], o) for k, o in sorted(last.items())}
    reader.sync()
    assert _versions(writer) == _versions(reader) == expected
    later = open_map(partitions=2, versions=True, hash_tags=True)
    assert _versions(later) == expected


def test_a_compare_by_version_is_not_fooled_by_a_value_that_came_back(open_map: OpenMap) -> None:
    m = open_map(versions=True)
    m["k"] = "a"
    got = m.get_versioned("k")
    assert got is not None
    _, version = got
    m["k"] = "b"
    m["k"] = "a"  # the value came back: a compare by value still matches
    assert m.compare_and_set("k", "a", "a2") is True
    m["k"] = "a"
    assert m.compare_version_and_set("k", version, "c") is False
    assert m["k"] == "a"
    now = m.get_versioned("k")
    assert now is not None and now[1] > version
    assert m.compare_version_and_set("k", now[1], "c") is True
    assert m.compare_version_and_set("absent", None, "new") is True
    assert m.compare_version_and_set("absent", None, "again") is False
    m["same"] = "x"
    same = m.get_versioned("same")
    m["same"] = "x"  # no change: the version stays
    assert m.get_versioned("same") == same
    assert m.transaction(expect_version={"k": version}, put={"k": "t"}) is False
    assert m.transaction(expect_version={"k": m.get_versioned("k")[1]}, put={"k": "t"}) is True  # type: ignore[index]
    assert m.compare_version_and_set_async("k", -5 + 5, "z").result(timeout=30) is False


def test_versions_are_refused_where_the_map_has_none(open_map: OpenMap, map_name: str) -> None:
    plain = open_map()
    plain["k"] = 1
    for call in (
        lambda: plain.get_versioned("k"),
        lambda: plain.compare_version_and_set("k", 0, 2),
        lambda: plain.transaction(expect_version={"k": 0}, put={"k": 2}),
    ):
        with pytest.raises(ConfigError, match="keeps no versions"):
            call()
    # An op that asks anyway (another writer): refused the same way by every replica.
    engine = plain._engine
    future = engine.submit(None, OpCode.SET_IF_VERSION, b"k", 0, (0, b"2"), True)
    with pytest.raises(OperationFailedError, match="keeps no versions"):
        future.result(timeout=30)
    assert plain["k"] == 1
    versioned = open_map(map_name + "-v", versions=True)
    for bad in (1.5, "3", -2, True):
        with pytest.raises(ConfigError):
            versioned.compare_version_and_set("k", bad, 1)  # type: ignore[arg-type]


@shared_logs
@pytest.mark.parametrize("store_kind", ["dict"])
def test_versions_are_fixed_when_the_map_is_created(open_map: OpenMap, map_name: str) -> None:
    m = open_map(versions=True)
    m["k"] = 1
    with pytest.raises(TopicMismatchError, match="versions=True"):
        open_map(versions=False)
    plain = open_map(map_name + "-plain")
    plain["k"] = 1
    with pytest.raises(TopicMismatchError, match="versions=False"):
        open_map(map_name + "-plain", versions=True)


def test_versions_survive_compaction_and_a_restart(open_map: OpenMap) -> None:
    """Also with a store on disk, which reloads the data topic to learn them again."""
    m = open_map(versions=True, flush_period=100_000)
    m.put_all({f"k{i}": i for i in range(50)})
    for i in range(0, 50, 3):
        m[f"k{i}"] = -i
    for i in range(0, 50, 7):
        del m[f"k{i}"]
    m.flush()
    compact_if_possible(m._engine.log, m._engine.topics.data)
    expected = _versions(m)
    assert all(v is not None and v[1] >= 0 for v in expected.values())
    assert _versions(open_map(versions=True)) == expected
    store = m._state.store
    if isinstance(store, LmdbStore):  # reopened on the same store, it reloads, not resumes
        m.close()
        again = open_map(versions=True, store="lmdb", store_path=store.path)
        assert _versions(again) == expected
