"""Sorted maps: key order, navigation and range queries on every ordered store, checked
against a plain sorted list.

Runs on every log backend and on the ordered stores ("sorted" in memory, "lmdb" on disk).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kafkakv
from kafkakv.errors import ConfigError
from kafkakv.map import SortedReplicaMap

ORDERED_STORES = ["sorted", "lmdb"]

OpenSorted = Callable[..., SortedReplicaMap[Any, Any]]

STR_KEYS = ["", "a", "ab", "abc", "b", "ba", "m", "z", "zz", "É", "é", "日本", "\U0001f600"]
INCLUSIVE: list[tuple[bool, bool]] = [(True, True), (True, False), (False, True), (False, False)]
INT_KEYS = [-(2**63), -(2**40), -1000, -2, -1, 0, 1, 2, 999, 2**31, 2**63 - 1]


@pytest.fixture(params=ORDERED_STORES)
def ordered_store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_sorted(
    target: str, ordered_store: str, map_name: str, tmp_path: Path
) -> Iterator[OpenSorted]:
    """``open_sorted(**options)``: one more replica of the test's sorted map, each with its own
    database (as another process would); all closed at the end."""
    dbs: list[kafkakv.Database] = []
    counter = itertools.count()

    def open_one(**options: Any) -> SortedReplicaMap[Any, Any]:
        db = kafkakv.connect(target)
        dbs.append(db)
        options.setdefault("store", ordered_store)
        if options["store"] == "lmdb":
            options.setdefault("store_path", str(tmp_path / f"store-{next(counter)}"))
        return db.sorted_map(map_name, **options)

    yield open_one
    for db in dbs:
        db.close()


# -- a model of every query -----------------------------------------------------------------
def _in_range(k: Any, start: Any, stop: Any, inclusive: tuple[bool, bool]) -> bool:
    if start is not None and (k < start or (k == start and not inclusive[0])):
        return False
    return not (stop is not None and (k > stop or (k == stop and not inclusive[1])))


def expected_range(
    keys: list[Any], start: Any, stop: Any, inclusive: tuple[bool, bool], reverse: bool
) -> list[Any]:
    found = [k for k in sorted(keys) if _in_range(k, start, stop, inclusive)]
    return found[::-1] if reverse else found


def check_navigation(
    m: SortedReplicaMap[Any, Any], model: dict[Any, Any], probes: list[Any]
) -> None:
    """Every query of ``m`` against the sorted keys of ``model``, at every probe."""
    keys = sorted(model)
    assert list(m) == keys
    assert list(m.items()) == [(k, model[k]) for k in keys]
    assert m.first_key() == (keys[0] if keys else None)
    assert m.last_key() == (keys[-1] if keys else None)
    for p in probes:
        assert m.floor_key(p) == max((k for k in keys if k <= p), default=None), p
        assert m.ceiling_key(p) == min((k for k in keys if k >= p), default=None), p
        assert m.lower_key(p) == max((k for k in keys if k < p), default=None), p
        assert m.higher_key(p) == min((k for k in keys if k > p), default=None), p
    bounds = [None, *probes[:: max(1, len(probes) // 6)]]
    for start, stop in itertools.product(bounds, repeat=2):
        for inclusive in INCLUSIVE:
            for reverse in (False, True):
                got = list(m.range(start, stop, inclusive=inclusive, reverse=reverse))
                want = expected_range(keys, start, stop, inclusive, reverse)
                assert got == [(k, model[k]) for k in want], (start, stop, inclusive, reverse)


# -- tests ----------------------------------------------------------------------------------
def test_str_keys_in_code_point_order(open_sorted: OpenSorted) -> None:
    m = open_sorted(partitions=3)  # the order spans partitions
    empty: dict[str, Any] = {}
    check_navigation(m, empty, ["", "a", "zz"])
    model = {k: i for i, k in enumerate(STR_KEYS[::2])}
    m.update(model)
    probes = sorted({*STR_KEYS, "aa", "abd", "c", "\uffff"})
    check_navigation(m, model, probes)
    assert [k for k, _ in m.range("a", "b")] == ["ab"]
    assert [k for k, _ in m.range("b", inclusive=(False, False))] == ["m", "zz", "é", "\U0001f600"]
    assert [k for k, _ in m.range(stop="b", reverse=True)] == ["ab", ""]
    window = m.range("ab", "m", inclusive=(True, True), reverse=True)
    assert [k for k, _ in window] == ["m", "b", "ab"]


def test_int_keys_order_numerically_with_negatives(open_sorted: OpenSorted) -> None:
    m = open_sorted(key_codec="int", partitions=2)
    model = {k: f"v{k}" for k in INT_KEYS}
    m.update(model)
    probes = sorted({*INT_KEYS, -3, -1001, 3, 1000, 2**62})
    check_navigation(m, model, probes)
    assert m.first_key() == -(2**63) and m.last_key() == 2**63 - 1
    assert [k for k, _ in m.range(-2, 2, inclusive=(True, True))] == [-2, -1, 0, 1, 2]
    assert [k for k, _ in m.range(-1000, 0, reverse=True)] == [-1, -2, -1000]
    assert [k for k, _ in m.range(None, -(2**40), inclusive=(True, True))] == [-(2**63), -(2**40)]
    assert m.floor_key(-3) == -1000 and m.ceiling_key(-3) == -2


def test_pop_first_and_pop_last(open_sorted: OpenSorted) -> None:
    m, other = open_sorted(key_codec="int"), open_sorted(key_codec="int")
    m.update({k: k * 10 for k in (5, -7, 3, 0, 12)})
    assert m.pop_first() == (-7, -70)
    assert m.pop_last() == (12, 120)
    other.sync()  # reads are local: catch up with m first
    assert other.pop_first() == (0, 0)
    m.sync()
    assert list(m) == [3, 5]
    assert m.pop_last() == (5, 50) and m.pop_first() == (3, 30)
    for pop in (m.pop_first, m.pop_last):
        with pytest.raises(KeyError):
            pop()
    other.sync()
    assert len(other) == 0 and other.first_key() is None and other.last_key() is None


def test_replicas_on_every_ordered_store_see_one_order(
    open_sorted: OpenSorted, ordered_store: str
) -> None:
    a = open_sorted(partitions=4)
    b = open_sorted(store="sorted")
    c = open_sorted(store="lmdb")
    for i in range(120):
        (a, b, c)[i % 3][f"key-{(i * 37) % 101:03d}"] = i
    del a["key-000"]
    a.flush()
    d = open_sorted()  # loads the data topic, then replays the ops
    for m in (a, b, c, d):
        m.sync()
    keys = sorted(a)
    assert keys == list(b) == list(c) == list(d) and "key-000" not in keys
    assert list(a.items()) == list(b.items()) == list(c.items()) == list(d.items())
    window = list(a.range("key-020", "key-060", inclusive=(False, True), reverse=True))
    assert window == list(d.range("key-020", "key-060", inclusive=(False, True), reverse=True))
    assert [k for k, _ in window] == sorted(k for k in keys if "key-020" < k <= "key-060")[::-1]


@pytest.mark.parametrize("codec", ["json", "msgpack"])
def test_sorted_map_refuses_an_unordered_key_codec(
    target: str, ordered_store: str, map_name: str, tmp_path: Path, codec: str
) -> None:
    options: dict[str, Any] = {"store": ordered_store, "key_codec": codec}
    if ordered_store == "lmdb":
        options["store_path"] = str(tmp_path / "store")
    with kafkakv.connect(target) as db, pytest.raises(ConfigError, match="ordered"):
        db.sorted_map(map_name, **options)


def test_sorted_map_needs_an_ordered_store(target: str, map_name: str) -> None:
    with kafkakv.connect(target) as db, pytest.raises(ConfigError, match="ordered store"):
        db.sorted_map(map_name, store="dict")
