"""``m.check(deep=True)``: the store compared with the state the log gives, key by key.

A byte flipped in a value of an LMDB store's ``data.mdb`` leaves the store's structure sound
(``check()`` finds nothing) and the store serves the wrong value; the deep check names the key.
A sound map, or one that keeps applying other replicas' updates during the check, reports
nothing.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkakv import functions
from kafkakv.errors import FencedError
from kafkakv.map import ReplicaMap
from kafkakv.store import LmdbStore, Positions
from tests.map.conftest import OpenMap
from tests.waiting import wait_for


@pytest.fixture(autouse=True)
def _add() -> Iterator[None]:
    functions.register("deep-add")(lambda key, old, n: (old or 0) + n)
    yield
    functions.unregister("deep-add")


def _keys_named(problems: list[str]) -> dict[str, str]:
    """The key each problem names (``partition P, key 'K': ...``) → the problem."""
    named = {}
    for problem in problems:
        assert ", key '" in problem, problem
        named[problem.split("key '", 1)[1].split("'", 1)[0]] = problem
    return named


def _flip(path: Path, old: bytes, new: bytes) -> int:
    """Replace every copy of ``old`` in the LMDB file ``path`` by ``new`` (as long); return
    how many there were. Old copies in free pages are changed too, which changes nothing."""
    assert len(old) == len(new)
    data = path.read_bytes()
    count = data.count(old)
    path.write_bytes(data.replace(old, new))
    return count


@pytest.mark.parametrize("store_kind", ["lmdb"])
@pytest.mark.parametrize("shared", [False, True], ids=["own-topics", "shared-topics"])
def test_deep_check_reports_bytes_flipped_in_data_mdb(
    open_map: OpenMap, map_name: str, tmp_path: Path, shared: bool
) -> None:
    store = tmp_path / "flipped"
    topics = {"topics": f"{map_name}-base"} if shared else {}
    m = open_map(store_path=str(store), partitions=3, flush_period=100, **topics)
    m.update({f"k{i:04d}a": f"value {i:04d} xxxxxxxx" for i in range(500)})
    m.flush()  # some values the data topic holds, some only the ops after its flush point
    m.update({f"k{i:04d}a": f"value {i:04d} yyyyyyyy" for i in range(0, 500, 2)})
    expected = dict(m.items())
    m.close()
    # Two values and one key changed on disk, each to bytes that still decode.
    data = store / "data.mdb"
    assert _flip(data, b"value 0123 xxxxxxxx", b"value 0123 xxxxxxxz") >= 1
    assert _flip(data, b"value 0124 yyyyyyyy", b"value 0124 yyyyyyyz") >= 1
    assert _flip(data, b"k0300a", b"k0300b") >= 1

    again = open_map(store_path=str(store), partitions=3, **topics)
    # The store serves the flipped bytes, and its own check sees nothing wrong.
    assert again["k0123a"] == "value 0123 xxxxxxxz" and again["k0124a"] == "value 0124 yyyyyyyz"
    assert "k0300a" not in again and again["k0300b"] == expected["k0300a"]
    assert again.check() == []

    problems = again.check(deep=True)
    named = _keys_named(problems)
    assert sorted(named) == ["k0123a", "k0124a", "k0300a", "k0300b"], problems
    for key, problem in named.items():
        assert problem.startswith(f"partition {again.partition_of(key)}, key '{key}': "), problem
    assert (
        "holds b'\"value 0123 xxxxxxxz\"'; the log says b'\"value 0123 xxxxxxxx\"'"
        in (named["k0123a"])
    )
    assert "missing from the store" in named["k0300a"]
    assert "the log has no such key" in named["k0300b"]
    # The log is sound: a fresh replica holds what was written.
    assert dict(open_map(store="dict", **topics).items()) == expected


def test_deep_check_reports_a_store_changed_behind_the_log(open_map: OpenMap) -> None:
    m = open_map(partitions=2, flush_period=20)
    m.update({f"k{i}": i for i in range(100)})
    m.flush()
    m.update({f"k{i}": -i for i in range(0, 100, 3)})
    # Flushed now, so that no periodic flush is left to run after the store is changed
    # below: a flush writes the store's values, and would carry the change into the log.
    m.flush()
    assert m.check(deep=True) == []
    # Written to the store alone, as a damaged disk or a bug would: no op on the log.
    store = m._store
    with m._engine.paused():
        store.write({b"k5": b"55", b"k6": None, b"ghost": b"1"}, {})
    named = _keys_named(m.check(deep=True))
    assert sorted(named) == ["ghost", "k5", "k6"]
    assert named["k5"].endswith("the store holds b'55'; the log says b'5'")
    assert named["k6"].endswith("missing from the store; the log says b'-6'")
    assert named["ghost"].startswith(f"partition {m.partition_of('ghost')}, key 'ghost': ")
    assert m.check() == []  # the structure is sound


def test_deep_check_of_sound_maps_is_empty(open_map: OpenMap, map_name: str) -> None:
    a = open_map(partitions=3, flush_period=30)
    b = open_map(partitions=3, flush_period=30, store="dict")
    rng = random.Random(19)
    for i in range(400):
        key = f"k{rng.randrange(60)}"
        replica = a if i % 2 else b
        match rng.randrange(5):
            case 0:
                replica.pop(key, None)
            case 1:
                replica.compute(key, "deep-add", i)
            case 2:
                replica.put_if_absent(key, i)
            case 3:
                replica.compare_and_set(key, replica.get(key), i)
            case _:
                replica[key] = i
    a.flush()
    a.update({f"late{i}": i for i in range(50)})  # after the last flush: ops only
    b.sync()
    sharded = open_map(partitions=3, shard=[0, 2])
    assert a.check(deep=True) == [] and b.check(deep=True) == [] and sharded.check(deep=True) == []
    assert dict(sharded.items()) == {k: v for k, v in a.items() if a.partition_of(k) != 1}
    # Maps sharing topics: each compares its own keys only.
    base = f"{map_name}-shared"
    one = open_map(f"{map_name}-one", topics=base, partitions=2, flush_period=10)
    two = open_map(f"{map_name}-two", topics=base, partitions=2, flush_period=10)
    for i in range(60):
        one[f"k{i}"] = i
        two[f"k{i % 7}"] = -i
    one.flush()
    two.sync()
    assert one.check(deep=True) == [] and two.check(deep=True) == []
    empty = open_map(f"{map_name}-empty", partitions=2)
    assert empty.check(deep=True) == []


def test_deep_check_while_the_replica_follows_concurrent_writes(open_map: OpenMap) -> None:
    checked = open_map(partitions=2, flush_period=25)
    writer = open_map(partitions=2, flush_period=25, store="dict")
    stop = threading.Event()
    failures: list[BaseException] = []

    def write(m: ReplicaMap[Any, Any], seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                key = f"k{rng.randrange(300)}"
                if rng.random() < 0.2:
                    m.pop(key, None)
                elif rng.random() < 0.3:
                    m.compute(key, "deep-add", 1)
                else:
                    m.update({f"{key}-{j}": rng.random() for j in range(rng.randrange(1, 40))})
                if rng.random() < 0.05:
                    with contextlib.suppress(FencedError):  # the other flusher won the race
                        m.flush()
                time.sleep(0.001)  # a steady stream: each check rebuilds from all of it
        except BaseException as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=write, args=(writer, 1)),
        threading.Thread(target=write, args=(checked, 2)),
    ]
    for thread in threads:
        thread.start()
    try:
        # Both writers under way first, so that the checks have something to rebuild. A
        # millisecond's sleep between checks: back to back, this thread kept the GIL from the
        # writers for up to 2 s in about one run in 50 (CPython asks the holder to let go only
        # for a waiter that saw no switch for 5 ms, and the replicas' own threads switch more
        # often than that). The replica lock gives the appliers their turn however the checks
        # come: tests/map/test_replicalock.py checks that hand-over directly.
        wait_for(lambda: all(checked.applied_offsets().values()), 30, "the first writes")
        start = checked.applied_offsets()
        checks: list[list[str]] = []
        deadline = time.monotonic() + 2
        while len(checks) < 10 or time.monotonic() < deadline:
            checks.append(checked.check(deep=True))
            time.sleep(0.001)
        moved = checked.applied_offsets()
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not failures, failures
    assert checks == [[]] * len(checks)
    assert all(moved[p] > start[p] for p in start), (
        f"the replica applied nothing in some partition during {len(checks)} checks: "
        f"offsets {start} before, {moved} after"
    )
    writer.sync()
    checked.sync()
    assert checked == writer and checked.check(deep=True) == []


def test_deep_check_of_a_replica_behind_the_data_topic(open_map: OpenMap) -> None:
    """Another replica flushed ops that this one has not applied yet: the check brings it up
    to the flush point first and compares there."""
    m = open_map(partitions=1, flush_period=1000)
    other = open_map(partitions=1, flush_period=1000, store="dict")
    m.update({f"k{i}": i for i in range(50)})
    other.sync()
    log, data = m._engine.log, m._engine.topics.data
    with m._engine.paused():  # re-entrant: this thread's check may apply, the follower not
        other.update({f"k{i}": -i for i in range(100)})
        end = log.end_offset(data, 0)
        covered = other._engine.flush(0)
        assert covered is not None
        # The flush is readable when it returns. The check reads the data topic up to the end
        # the brokers report, even where this process's consumer reported the end before and
        # has not fetched the flush yet (on Kafka under load it once compared at the flush
        # before: tests/kafka/test_reader.py has that case alone).
        assert log.end_offset(data, 0) > end
        before = m.applied_offsets()[0]
        assert before <= covered
        assert m.check(deep=True) == []
        assert m.applied_offsets()[0] > covered
    assert dict(m.items()) == {f"k{i}": -i for i in range(100)}


@pytest.mark.parametrize("store_kind", ["lmdb"])
def test_deep_check_reports_a_stored_position_past_the_end_of_the_log(
    open_map: OpenMap, map_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "ahead"
    m = open_map(store_path=str(path))
    for i in range(20):  # 20 ops records
        m[f"k{i}"] = i
    m.close()
    with LmdbStore(path) as kept:  # as a flipped byte in the meta entry would leave it
        kept.write({}, {0: Positions(applied=1_000_000, flushed=-1)})
    again = open_map(store_path=str(path))
    assert again.check() == []
    assert again.check(deep=True) == [
        f"partition 0: the replica is at ops offset 1000000 (it applied every op before it), "
        f"but {map_name}_ops[0] ends at 20"
    ]
