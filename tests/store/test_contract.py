"""One contract suite for every :class:`~kafkakv.store.Store`, plus what only LMDB promises.

Property tests compare each store with a plain dict; Hypothesis prints a failing example and
replays it with ``--hypothesis-seed=N``.
"""

from __future__ import annotations

import doctest
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kafkakv.store
import kafkakv.store.lmdb
import kafkakv.store.memory
from kafkakv.errors import ClosedError, ConfigError, StoreError
from kafkakv.store import LmdbStore, OrderedStore, Positions, Store, open_store
from tests.waiting import wait_for

KINDS = ["dict", "sorted", "lmdb"]
ORDERED = ["sorted", "lmdb"]
ROOT = Path(__file__).resolve().parents[2]


def make(kind: str, directory: str | Path) -> Store:
    if kind == "lmdb":
        return open_store("lmdb", path=os.path.join(directory, "store"), sync=False)
    return open_store(kind)


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = make(request.param, tmp_path)
    yield s
    s.close()


@pytest.fixture(params=ORDERED)
def ordered(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OrderedStore]:
    s = make(request.param, tmp_path)
    assert isinstance(s, OrderedStore)
    yield s
    s.close()


def model_range(
    keys: list[bytes],
    start: bytes | None,
    stop: bytes | None,
    inclusive: tuple[bool, bool] = (True, False),
    reverse: bool = False,
) -> list[bytes]:
    found = [
        k
        for k in sorted(keys)
        if (start is None or k > start or (inclusive[0] and k == start))
        and (stop is None or k < stop or (inclusive[1] and k == stop))
    ]
    return found[::-1] if reverse else found


# -- every store ----------------------------------------------------------------------
def test_empty(store: Store) -> None:
    assert store.get(b"a") is None and b"a" not in store and len(store) == 0
    assert list(store.keys()) == [] and list(store.items()) == [] and list(store) == []
    assert store.columns() == ([], []) and store.positions() == {} and store.check() == []


def test_write_sets_overwrites_and_deletes(store: Store) -> None:
    store.write({b"a": b"1", b"b": b"2", b"": b"empty key", b"\xff": b""}, {})
    assert store.get(b"a") == b"1" and store.get(b"") == b"empty key" and store.get(b"\xff") == b""
    assert b"b" in store and b"c" not in store and len(store) == 4
    store.write({b"a": b"one", b"b": None, b"missing": None}, {})
    assert store.get(b"a") == b"one" and store.get(b"b") is None and b"b" not in store
    assert len(store) == 3
    assert sorted(store.keys()) == [b"", b"a", b"\xff"] == sorted(store)
    assert sorted(store.items()) == [(b"", b"empty key"), (b"a", b"one"), (b"\xff", b"")]
    assert store.get_many([b"\xff", b"b", b"a", b"a", b""]) == [
        b"",
        None,
        b"one",
        b"one",
        b"empty key",
    ]
    assert store.get_many([]) == []
    store.write({b"\xff": None, b"e": b""}, {})  # an empty value in a batch that deletes
    assert b"\xff" not in store and store.get(b"e") == b"" and len(store) == 3
    assert store.check() == []


def test_positions_roundtrip_and_partial_update(store: Store) -> None:
    given_positions = {0: Positions(5, 2), 3: Positions(1)}
    store.write({b"k": b"v"}, given_positions)
    given_positions[0] = Positions(99)  # the store kept its own mapping
    assert store.positions() == {0: Positions(5, 2), 3: Positions(1, -1)}
    store.write({}, {3: Positions(7, 4)})  # partition 0 is left as it is
    got = store.positions()
    assert got == {0: Positions(5, 2), 3: Positions(7, 4)}
    got[0] = Positions(99)  # positions() returns a mapping of its own
    assert store.positions()[0] == Positions(5, 2)
    assert store.get(b"k") == b"v"
    with pytest.raises(AttributeError):  # a value: what a store holds cannot change under it
        got[3].applied = 99  # type: ignore[misc]


def test_drop_partition(store: Store) -> None:
    store.write({b"a": b"1", b"b": b"2", b"c": b"3"}, {0: Positions(3, 1), 1: Positions(2)})
    store.drop_partition(0, iter([b"a", b"b", b"never-written"]))
    assert sorted(store.keys()) == [b"c"] and store.positions() == {1: Positions(2)}
    store.drop_partition(1)
    assert store.positions() == {} and len(store) == 1
    store.drop_partition(7)  # unknown partition: nothing to forget


def test_check_reports_broken_positions(store: Store) -> None:
    store.write({}, {0: Positions(-1, -2), 1: Positions(4, 3)})
    problems = store.check()
    assert len(problems) == 2 and all("partition 0" in p for p in problems)


def test_closed_store_raises(store: Store) -> None:
    store.write({b"a": b"1"}, {0: Positions(1)})
    with store:
        pass  # __exit__ closes
    store.close()  # idempotent
    calls = [
        lambda: store.get(b"a"),
        lambda: b"a" in store,
        lambda: len(store),
        store.keys,
        store.items,
        store.columns,
        store.positions,
        lambda: store.write({b"b": b"2"}, {}),
        lambda: store.drop_partition(0),
        store.check,
    ]
    if isinstance(store, OrderedStore):
        calls += [store.first, store.last, lambda: store.floor(b"a"), lambda: store.range()]
    for call in calls:
        with pytest.raises(ClosedError):
            call()


def test_a_table_is_the_live_data_and_holds_nothing_after_close(store: Store) -> None:
    """Store.table: what a map's fast reads index with [] and in (memory stores only)."""
    store.write({b"a": b"1"}, {})
    table = store.table()
    if table is None:
        assert isinstance(store, LmdbStore)  # it keeps no dict
        return
    assert table[b"a"] == b"1" and b"a" in table and b"b" not in table
    store.write({b"b": b"2", b"a": None}, {})
    assert table[b"b"] == b"2" and b"a" not in table  # live, not a copy
    store.close()
    assert b"b" not in table and len(table) == 0  # the data is let go of
    closed = store.table()
    assert closed is not None
    with pytest.raises(ClosedError):
        closed[b"b"]


def test_iterate_while_another_thread_writes(store: Store) -> None:
    """Each iteration is paused half-way until the writer has written more batches."""
    stable = {b"s%05d" % i: b"stable" for i in range(3000)}
    store.write(stable, {})
    stop, failures, written = threading.Event(), [], [0]

    def writer() -> None:
        try:
            i = 0
            while not stop.is_set():
                store.write({b"t%05d" % i: b"t", b"t%05d" % (i // 2): None}, {0: Positions(i)})
                i = written[0] = i + 1
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    def read_across_writes(pairs: Iterator[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        seen = list(itertools.islice(pairs, 1500))
        target = written[0] + 20
        wait_for(lambda: written[0] >= target or failures, 30, "20 more writes", interval=0.001)
        return seen + list(pairs)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        reads = [zip(store.keys(), itertools.repeat(b"")), store.items()]
        if isinstance(store, OrderedStore):
            reads += [store.range(), store.range(reverse=True)]
        for i, pairs in enumerate(reads):
            got = read_across_writes(pairs)
            keys = [k for k, _ in got]
            assert len(keys) == len(set(keys)) and stable.keys() <= set(keys)
            if isinstance(store, OrderedStore):
                assert keys == sorted(keys, reverse=i == 3)
            if i:
                assert all(v == (b"stable" if k[:1] == b"s" else b"t") for k, v in got)
    finally:
        stop.set()
        thread.join()
    assert failures == []
    assert store.check() == []


KEY = st.builds(bytes, st.lists(st.sampled_from([0, 1, 0x61, 0x80, 0xFF]), max_size=3))
BATCH = st.dictionaries(KEY, st.none() | st.binary(max_size=8), max_size=8)
POSITIONS = st.dictionaries(
    st.integers(0, 3), st.builds(Positions, st.integers(0, 10**12), st.integers(-1, 10**12))
)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.tuples(BATCH, POSITIONS), max_size=12))
def test_matches_a_dict(
    kind: str, batches: list[tuple[dict[bytes, bytes | None], dict[int, Positions]]]
) -> None:
    model: dict[bytes, bytes] = {}
    positions: dict[int, Positions] = {}
    with tempfile.TemporaryDirectory() as tmp, make(kind, tmp) as store:
        for changes, new_positions in batches:
            store.write(changes, new_positions)
            for k, v in changes.items():
                if v is None:
                    model.pop(k, None)
                else:
                    model[k] = v
            positions.update(new_positions)
            assert len(store) == len(model)
            assert sorted(store.items()) == sorted(model.items())
            keys, values = store.columns()  # the same pairs, in the order items() gives
            assert list(zip(keys, values, strict=True)) == list(store.items())
            for k in changes:
                assert store.get(k) == model.get(k) and (k in store) == (k in model)
            asked = list(changes) + list(model)[:3]
            assert store.get_many(asked) == [model.get(k) for k in asked]
            assert store.positions() == positions
        assert store.check() == []


# -- ordered stores -------------------------------------------------------------------
def test_ordered_empty(ordered: OrderedStore) -> None:
    assert ordered.first() is None and ordered.last() is None
    for query in (ordered.floor, ordered.ceiling, ordered.lower, ordered.higher):
        assert query(b"m") is None
    assert list(ordered.range()) == [] and list(ordered.range(reverse=True)) == []


@pytest.mark.parametrize(
    ("query", "key", "expected"),
    [
        ("floor", b"d", b"d"),
        ("floor", b"c", b"b"),
        ("floor", b"a", None),
        ("floor", b"z", b"f"),
        ("ceiling", b"d", b"d"),
        ("ceiling", b"c", b"d"),
        ("ceiling", b"g", None),
        ("ceiling", b"", b"b"),
        ("lower", b"d", b"b"),
        ("lower", b"b", None),
        ("lower", b"z", b"f"),
        ("higher", b"d", b"f"),
        ("higher", b"f", None),
        ("higher", b"", b"b"),
    ],
)
def test_navigation(ordered: OrderedStore, query: str, key: bytes, expected: bytes | None) -> None:
    ordered.write({b"b": b"1", b"d": b"2", b"f": b"3"}, {})
    assert getattr(ordered, query)(key) == expected
    assert ordered.first() == b"b" and ordered.last() == b"f"


@pytest.mark.parametrize("inclusive", [(True, False), (True, True), (False, False), (False, True)])
@pytest.mark.parametrize("reverse", [False, True])
def test_range_bounds(ordered: OrderedStore, inclusive: tuple[bool, bool], reverse: bool) -> None:
    keys = [b"a", b"b", b"c", b"d", b"e"]
    ordered.write({k: k.upper() for k in keys}, {})
    for start, stop in [(b"b", b"d"), (None, b"c"), (b"c", None), (None, None), (b"bb", b"dd")]:
        got = list(ordered.range(start, stop, inclusive=inclusive, reverse=reverse))
        assert [k for k, _ in got] == model_range(keys, start, stop, inclusive, reverse)
        assert all(v == k.upper() for k, v in got)
    assert list(ordered.range(b"d", b"b", inclusive=inclusive, reverse=reverse)) == []


def test_keys_are_ordered_as_unsigned_bytes(ordered: OrderedStore) -> None:
    keys = [b"\xff", b"\x80", b"\x7f", b"ab", b"a", b"", b"\x00", b"a\x00"]
    ordered.write({k: b"v" for k in keys}, {})
    assert list(ordered.keys()) == sorted(keys) == [k for k, _ in ordered.items()]
    assert ordered.first() == b"" and ordered.last() == b"\xff"


def test_range_spans_many_chunks(ordered: OrderedStore) -> None:
    keys = [b"%05d" % i for i in range(5000)]
    ordered.write({k: k for k in keys}, {})
    assert [k for k, _ in ordered.range()] == keys
    assert [k for k, _ in ordered.range(reverse=True)] == keys[::-1]
    assert [k for k, _ in ordered.range(b"00100", b"04000", inclusive=(False, True))] == keys[
        101:4001
    ]
    it = ordered.range(reverse=True)
    assert next(it) == (b"04999", b"04999")  # lazy: starts before the whole range is read
    ordered.close()
    with pytest.raises(ClosedError):
        list(it)  # a running iteration reads its next chunk from a closed store


@pytest.mark.parametrize("kind", ORDERED)
@settings(max_examples=40, deadline=None)
@given(
    keys=st.lists(KEY, max_size=20),
    probes=st.lists(
        st.tuples(st.none() | KEY, st.none() | KEY, st.tuples(st.booleans(), st.booleans())),
        max_size=8,
    ),
    reverse=st.booleans(),
)
def test_ordered_queries_match_a_sorted_list(
    kind: str,
    keys: list[bytes],
    probes: list[tuple[bytes | None, bytes | None, tuple[bool, bool]]],
    reverse: bool,
) -> None:
    with tempfile.TemporaryDirectory() as tmp, make(kind, tmp) as store:
        assert isinstance(store, OrderedStore)
        store.write({k: b"v" for k in keys}, {})
        ks = sorted(set(keys))
        for start, stop, inclusive in probes:
            got = [k for k, _ in store.range(start, stop, inclusive=inclusive, reverse=reverse)]
            assert got == model_range(ks, start, stop, inclusive, reverse)
            probe = start or b""
            assert store.floor(probe) == max((k for k in ks if k <= probe), default=None)
            assert store.lower(probe) == max((k for k in ks if k < probe), default=None)
            assert store.ceiling(probe) == min((k for k in ks if k >= probe), default=None)
            assert store.higher(probe) == min((k for k in ks if k > probe), default=None)


# -- LMDB -----------------------------------------------------------------------------
def test_lmdb_reopen_keeps_data_and_positions(tmp_path: Path) -> None:
    with LmdbStore(tmp_path / "s") as store:
        store.write({b"a": b"1", b"b": b"2"}, {0: Positions(10, 4), 2: Positions(3)})
        store.write({b"b": None}, {2: Positions(5, 3)})
    with LmdbStore(tmp_path / "s") as store:
        assert store.persistent
        assert list(store.items()) == [(b"a", b"1")] and len(store) == 1
        assert store.positions() == {0: Positions(10, 4), 2: Positions(5, 3)}
        assert store.check() == []


def test_lmdb_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with LmdbStore(tmp_path / "s", sync=False) as store:
        store.write({b"a": b"1"}, {0: Positions(1)})
        with pytest.raises(StoreError, match="510"):
            store.write({b"b": b"2", b"x" * 600: b"3"}, {0: Positions(3)})
        assert list(store.items()) == [(b"a", b"1")] and store.positions() == {0: Positions(1)}


def test_lmdb_full_map_raises_store_error_and_stays_usable(tmp_path: Path) -> None:
    with LmdbStore(tmp_path / "s", map_size=1 << 20, sync=False) as store:
        with pytest.raises(StoreError) as info:
            store.write({b"big": b"x" * (2 << 20)}, {0: Positions(1)})
        assert info.value.__cause__ is not None
        store.write({b"small": b"x"}, {0: Positions(2)})
        assert store.get(b"small") == b"x" and store.positions() == {0: Positions(2)}


CHILD = """
import sys
from kafkakv.store import LmdbStore, Positions
store = LmdbStore(sys.argv[1], sync=False)
i = 0
while True:
    store.write({b"k%08d" % i: b"v" * 100, b"k%08d" % (i + 1): b"next"}, {0: Positions(i + 1)})
    i += 1
    if i == 200:
        print("ready", flush=True)
"""


def test_lmdb_killed_writer_leaves_each_batch_with_its_offset(tmp_path: Path) -> None:
    """A writer killed mid-stream (no close): the reopened store holds exactly the batches
    whose offset it records. (sync=False survives a process crash, not an OS crash.)"""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    path = str(tmp_path / "s")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    finally:
        child.kill()
        child.wait()
    with LmdbStore(path) as store:
        applied = store.positions()[0].applied
        assert applied >= 200 and len(store) == applied + 1
        assert store.get(b"k%08d" % applied) == b"next"
        assert store.get(b"k%08d" % (applied - 1)) == b"v" * 100
        assert store.check() == []


CLOSE_UNDER_CALLS = """
import sys, threading, time
from kafkakv.errors import ClosedError
from kafkakv.store import OrderedStore, Positions, open_store
kind, path = sys.argv[1], sys.argv[2]
store = open_store(kind, path=path, sync=False) if kind == "lmdb" else open_store(kind)
store.write({b"k%05d" % i: b"v" * 100 for i in range(2000)}, {0: Positions(1)})
calls = [lambda: store.get(b"k00007"), lambda: len(store), lambda: list(store.items())]
calls.append(lambda: store.write({b"w": b"x"}, {0: Positions(2)}))
if isinstance(store, OrderedStore):
    calls.append(lambda: list(store.range(b"k00100", b"k00900")))
started, wrong = threading.Barrier(len(calls) + 1), []
def loop(call):
    started.wait()
    try:
        while True:
            call()
    except ClosedError:
        pass
    except BaseException as exc:
        wrong.append(repr(exc))
threads = [threading.Thread(target=loop, args=(c,)) for c in calls]
for t in threads:
    t.start()
started.wait()
time.sleep(0.05)
store.close()
for t in threads:
    t.join(10)
print("alive", sum(t.is_alive() for t in threads), "wrong", wrong, flush=True)
"""


@pytest.mark.parametrize("kind", KINDS)
def test_close_under_calls_in_flight(kind: str, tmp_path: Path) -> None:
    """close() while other threads read and write: each call answers or raises ClosedError,
    and none runs on a closed environment (py-lmdb 2.0 made its close wait for the calls that
    released the GIL; 1.8 passes this test too). In a child process, so that a crash is a
    failure with its output, not the end of the test run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONFAULTHANDLER": "1"}
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", CLOSE_UNDER_CALLS, kind, str(tmp_path / "s")],
            capture_output=True,
            env=env,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout == "alive 0 wrong []\n", done.stdout + done.stderr[-3000:]
        shutil.rmtree(tmp_path / "s", ignore_errors=True)


def test_lmdb_garbage_directory_raises_store_error(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "data.mdb").write_bytes(b"not a database " * 1000)
    with pytest.raises(StoreError, match="not an LMDB store"):
        LmdbStore(tmp_path / "s")
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(StoreError):
        LmdbStore(tmp_path / "file")


def test_lmdb_open_twice_in_one_process(tmp_path: Path) -> None:
    with LmdbStore(tmp_path / "s"), pytest.raises(StoreError, match="already open"):
        LmdbStore(tmp_path / "s")
    LmdbStore(tmp_path / "s").close()  # closed: may open again


def test_lmdb_keys_longer_than_its_limit(tmp_path: Path) -> None:
    top, below = b"a" * 510, b"a" * 509 + b"b"
    with LmdbStore(tmp_path / "s", sync=False) as store:
        store.write({top: b"1", below: b"2"}, {})
        long = b"a" * 511
        assert store.get(long) is None and long not in store
        assert store.floor(long) == top and store.ceiling(long) == below
        assert [k for k, _ in store.range(long)] == [below]
        assert [k for k, _ in store.range(None, long, reverse=True)] == [top]
        store.drop_partition(0, iter([long]))  # not a stored key: nothing to delete
        assert len(store) == 2


def test_lmdb_check_finds_an_unreadable_meta_entry(tmp_path: Path) -> None:
    import lmdb

    with LmdbStore(tmp_path / "s") as store:
        store.write({b"a": b"1"}, {0: Positions(1)})
    env = lmdb.open(str(tmp_path / "s"), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"junk", b"?", db=env.open_db(b"meta", txn=txn))
    env.close()
    with LmdbStore(tmp_path / "s") as store:
        assert [p for p in store.check() if "unreadable meta entry b'junk'" in p]
        with pytest.raises(StoreError):
            store.positions()


# -- open_store and the docs ----------------------------------------------------------
def test_open_store_refuses_bad_settings(tmp_path: Path) -> None:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("btree", {}),
        ("lmdb", {}),
        ("dict", {"path": str(tmp_path)}),
        ("sorted", {"sync": True}),
        ("lmdb", {"path": str(tmp_path), "mapsize": 1}),
        ("lmdb", {"path": str(tmp_path), "map_size": "1G"}),
        ("lmdb", {"path": str(tmp_path), "sync": 1}),
    ]
    for kind, kwargs in cases:
        with pytest.raises(ConfigError):
            open_store(kind, **kwargs)
    assert type(open_store("dict")).__name__ == "DictStore"


@pytest.mark.parametrize("module", [kafkakv.store, kafkakv.store.memory, kafkakv.store.lmdb])
def test_doctests(module: ModuleType) -> None:
    failed, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failed == 0
