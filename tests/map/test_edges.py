"""The core promise at its edges: replicas that cannot diverge, results that are true.

- a record calling a function this process lacks stalls its partition, never is skipped;
- a record another program wrote, that the map's codecs cannot read, breaks no read;
- closing, and interpreter exit, drain the updates in flight;
- a database inherited through fork is refused in the child, and never deadlocks it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
import unittest
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test import mapping_tests  # type: ignore[import-not-found]  # CPython's test suite: untyped

import kafkakv
from kafkakv import functions
from kafkakv.cli.main import main
from kafkakv.codecs import PickleCodec
from kafkakv.errors import (
    ClosedError,
    ConfigError,
    DecodeError,
    EncodeError,
    LockTimeoutError,
    OperationTimeoutError,
    PartitionStalledError,
    RecordTooLargeError,
    ResultTooLargeError,
)
from kafkakv.log.base import Record
from kafkakv.log.partitioner import partition_for
from kafkakv.map import bootstrap
from kafkakv.map.keyspace import FLUSH_POINT_KEY
from kafkakv.map.ops import OpCode, encode_op
from kafkakv.map.topics import MapTopics, adopt_existing
from tests.map.conftest import OpenMap, embedded_only, local_logs, log_options
from tests.records import offset_of
from tests.waiting import wait_for


@pytest.fixture
def edge_add() -> Iterator[str]:
    name = "edge-add"

    def add(key: str, old: Any, n: int) -> int:
        return int(old or 0) + n

    functions.register(name)(add)
    yield name
    functions.unregister(name)


# -- a function registered in some processes only ------------------------------------------
def test_a_missing_function_stalls_the_partition_until_it_is_registered(
    open_map: OpenMap, edge_add: str
) -> None:
    writer = open_map(partitions=2)
    writer["other"] = 1
    assert writer.compute("k", edge_add, 42) == 42
    offset = writer.applied_offsets()[writer.partition_of("k")] - 1
    add = functions.lookup(edge_add)
    functions.unregister(edge_add)  # a replica in a process that lacks it

    peer = open_map()  # opens all the same, and stops applying k's partition at the record
    p = peer.partition_of("k")
    with pytest.raises(PartitionStalledError, match=edge_add) as raised:
        peer["k"]
    for read in (lambda: peer.get("k"), lambda: "k" in peer):  # every form of read
        with pytest.raises(PartitionStalledError, match=edge_add):
            read()
    assert (raised.value.partition, raised.value.offset) == (p, offset)
    assert raised.value.function == edge_add and str(offset) in str(raised.value)
    assert set(peer.stalled()) == {p}
    assert [(e.partition, e.offset) for e in peer.errors()] == [(p, offset)]
    with pytest.raises(PartitionStalledError):
        list(peer.items())  # every partition is read: one is stalled
    if peer.partition_of("other") != p:
        assert peer["other"] == 1  # the other partition is applied and readable
    # An update of the stalled partition is refused before anything is appended.
    with pytest.raises(PartitionStalledError):
        peer["k"] = 7
    assert writer["k"] == 42

    functions.register(edge_add)(add)  # applying resumes by itself
    wait_for(lambda: not peer.stalled(), 10, "the partition to resume")
    peer.sync()
    assert peer["k"] == 42 and peer == writer


def test_a_restart_with_the_function_resumes_a_stalled_persistent_replica(
    target: str, map_name: str, tmp_path: Path, edge_add: str
) -> None:
    with kafkakv.connect(target, **log_options(target)) as db:
        m = db.map(map_name)
        m.compute("k", edge_add, 5)
        add = functions.lookup(edge_add)
        functions.unregister(edge_add)
        with kafkakv.connect(target, **log_options(target)) as other:
            peer = other.map(map_name, store="lmdb", store_path=str(tmp_path / "s"))
            assert peer.stalled()
        functions.register(edge_add)(add)
        with kafkakv.connect(target, **log_options(target)) as other:
            peer = other.map(map_name, store="lmdb", store_path=str(tmp_path / "s"))
            assert not peer.stalled() and peer["k"] == 5


# -- records the map's codecs cannot read ---------------------------------------------------
def _foreign_put(log: Any, topics: MapTopics, count: int, key: bytes, value: bytes) -> int:
    """Append a PUT as another program could: a well-formed op whose key or value is not
    what the map's codecs write. Returns its offset."""
    p = partition_for(key, count) if count > 1 else 0
    op = encode_op(OpCode.PUT, b"foreign!", 0, [value])
    return int(log.append(topics.ops, p, [Record(key, op)]))


def test_an_update_that_does_not_decode_breaks_no_read_and_shows_in_errors(
    open_map: OpenMap, map_name: str
) -> None:
    m = open_map(partitions=3)
    m.update({f"k{i}": i for i in range(20)})
    log, topics = m._engine.log, MapTopics.for_name(map_name)
    bad_value = _foreign_put(log, topics, 3, b"k3", b"not json")
    bad_key = _foreign_put(log, topics, 3, b"\xff\xfe", b"1")
    m.sync()
    expected = {f"k{i}": i for i in range(20) if i != 3}
    for replica in (m, open_map()):  # the writer's replica, and one that bootstraps
        replica.sync()
        assert dict(replica.items()) == expected
        assert sorted(replica) == sorted(expected) and len(replica) == len(expected)
        assert sorted(replica.keys()) == sorted(expected)
        with pytest.raises(DecodeError):
            replica["k3"]
        noted = {(e.key, e.offset) for e in replica.errors()}
        assert noted == {(b"k3", bad_value), (b"\xff\xfe", bad_key)}
        assert {e.partition for e in replica.errors()} == {
            partition_for(b"k3", 3),
            partition_for(b"\xff\xfe", 3),
        }
    m["k3"] = 33  # a readable value replaces the unreadable one
    assert m["k3"] == 33 and len(m) == 20


def test_a_flushed_unreadable_value_reads_the_same_on_every_replica(
    open_map: OpenMap, map_name: str
) -> None:
    m = open_map()
    m["a"] = 1
    offset = _foreign_put(m._engine.log, MapTopics.for_name(map_name), 1, b"b", b"\x00junk")
    m.sync()
    m.flush()
    fresh = open_map()  # loads "b" from the data topic
    assert dict(fresh.items()) == dict(m.items()) == {"a": 1}
    assert [e.key for e in fresh.errors()] == [b"b"]
    assert fresh.errors()[0].topic in (map_name, f"{map_name}_ops")
    assert [e.offset for e in m.errors()] == [offset]


def test_an_adopted_topic_with_an_unreadable_record_reads_and_reports_it(
    log: Any, topic: str
) -> None:
    log.create_topic(topic, 1, {"cleanup.policy": "compact"})
    log.append(topic, 0, [Record(b"good", b'"yes"'), Record(b"bad", b"{oops")])
    adopt_existing(log, MapTopics.for_name(topic))
    with kafkakv.connect(log) as db:
        m = db.map(topic)
        assert dict(m.items()) == {"good": "yes"}
        assert [(e.partition, e.offset, e.key, e.topic) for e in m.errors()] == [
            (0, 1, b"bad", topic)
        ]


def test_a_bootstrap_notes_what_does_not_read_with_the_offset_of_its_last_record(
    log: Any, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain map loads its data topic as the last value per key (Log.read_latest), without
    offsets: a stretch holding a key or value its codecs cannot read is read again, record by
    record, for the offsets."""
    monkeypatch.setattr(bootstrap, "_LATEST_BYTES", 1)  # stretches of one batch: three records
    log.create_topic(topic, 1, {"cleanup.policy": "compact"})
    batches: list[list[tuple[bytes, bytes | None]]] = [
        [(b"a", b'"1"'), (b"b", b"{oops"), (b"g", b'"7"')],
        [(b"d", b'"4"'), (b"b", b"{again"), (b"g", b"[x")],  # g readable no more
        [(b"a", None), (b"\xff", b'"k"'), (b"d", b'"44"')],  # a key that is not UTF-8
        [(b"e", b"{"), (b"e", b'"5"')],  # unreadable, then readable in the same stretch
    ]
    for batch in batches:
        log.append(topic, 0, [Record(k, v) for k, v in batch])
    offsets = [offset_of(r) for r in log.read(topic, 0, 0, max_records=100)]
    adopt_existing(log, MapTopics.for_name(topic))
    with kafkakv.connect(log) as db:
        m = db.map(topic)
        assert dict(m.items()) == {"d": "44", "e": "5"}
        noted = [(b"b", offsets[4]), (b"g", offsets[5]), (b"\xff", offsets[7])]
        assert sorted((e.key, e.offset) for e in m.unreadable()) == noted
        assert set(noted) <= {(e.key, e.offset) for e in m.errors()}
        with pytest.raises(DecodeError):
            m["g"]


# -- closing and exit drain ------------------------------------------------------------------
def test_close_resolves_every_async_update_that_reached_the_log(target: str, map_name: str) -> None:
    with kafkakv.connect(target, **log_options(target)) as db:
        m = db.map(map_name)
        futures = [m.put_async(f"k{i}", i) for i in range(5000)]
    assert all(f.done() for f in futures)
    assert [f.exception(0) for f in futures] == [None] * 5000
    with kafkakv.connect(target, **log_options(target)) as db:
        assert len(db.map(map_name)) == 5000


@local_logs
def test_a_close_out_of_time_fails_only_what_it_cannot_vouch_for(
    target: str, map_name: str
) -> None:
    db = kafkakv.connect(target)
    m = db.map(map_name)
    futures = [m.put_async(f"k{i}", i) for i in range(20_000)]
    db.close(timeout=0)  # drain nothing: whatever is not applied yet fails
    with kafkakv.connect(target) as fresh:
        stored = fresh.map(map_name)
        for i, future in enumerate(futures):
            assert future.done()
            error = future.exception(0)
            if error is None:
                assert stored[f"k{i}"] == i  # a result reported is true
            else:
                assert isinstance(error, ClosedError)
                if "never reached the log" in str(error):
                    assert f"k{i}" not in stored
                else:
                    assert "outcome is unknown" in str(error)


_EXIT_SCRIPT = """
import sys, kafkakv
db = kafkakv.connect(sys.argv[1])
m = db.map("exit")
for i in range(1000):
    m.put_async(f"k{i}", i)
"""


def test_exit_without_close_delivers_async_updates(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", _EXIT_SCRIPT, path], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert "could not be delivered" not in done.stderr
        with kafkakv.connect(path) as db:
            assert len(db.map("exit")) == 1000
        kafkakv.connect(path).close()


# -- fork ------------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_map_inherited_through_fork_is_refused_in_the_child_and_never_deadlocks(
    tmp_path: Path,
) -> None:
    """tests/map/forking.py forks while threads write, in an interpreter of its own (its
    docstring says why)."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "tests.map.forking", str(tmp_path / "log")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=4 * 60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "8 children as promised"


# -- the CPython mapping protocol ------------------------------------------------------------
def test_update_takes_an_object_with_keys_and_getitem_only(open_map: OpenMap) -> None:
    class KeysOnly:
        def keys(self) -> list[str]:
            return ["a", "b"]

        def __getitem__(self, key: str) -> int:
            return {"a": 1, "b": 2}[key]

    m = open_map()
    m.update(KeysOnly())
    assert dict(m.items()) == {"a": 1, "b": 2}


@pytest.mark.parametrize("target", ["embedded"], indirect=True)
def test_the_cpython_mapping_protocol_suite_passes(target: str, tmp_path: Path) -> None:
    """CPython's own ``BasicTestMappingProtocol``, unchanged, on a map (pickle values, so
    that the suite's tuples come back as tuples)."""
    db = kafkakv.connect(target)
    names = iter(range(1_000_000))

    class MapProtocol(mapping_tests.BasicTestMappingProtocol):  # type: ignore[misc]  # untyped base
        @staticmethod
        def type2test(*args: Any, **kwargs: Any) -> Any:
            m = db.map(f"cp{next(names)}", value_codec=PickleCodec(trusted=True))
            m.update(*args, **kwargs)
            return m

    suite = unittest.defaultTestLoader.loadTestsFromTestCase(MapProtocol)
    result = unittest.TestResult()
    suite.run(result)
    db.close()
    problems = [f"{t}: {e}" for t, e in result.failures + result.errors]
    assert result.testsRun > 5 and problems == []


# -- errors that arrived raw -----------------------------------------------------------------
def test_an_unknown_connect_option_is_a_config_error_naming_the_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fsync") as raised:
        kafkakv.connect(str(tmp_path / "log"), fsnyc="always")
    assert "fsnyc" in str(raised.value) and not (tmp_path / "log").exists()


def test_nested_nan_is_refused_before_anything_is_appended(open_map: OpenMap) -> None:
    m = open_map()
    log, ops, p = m._engine.log, m._engine.topics.ops, m.partition_of("k")
    end = log.end_offset(ops, p)
    for value in ([float("nan")], {"x": 1e309}):
        with pytest.raises(EncodeError, match="NaN"):
            m["k"] = value
    assert log.end_offset(ops, p) == end and "k" not in m


# -- a writer stopped while it holds the embedded log's lock ---------------------------------
def _hold_lock(path: Path) -> subprocess.Popen[bytes]:
    """Another process that takes the flock of ``path`` and keeps it (as a stopped writer)
    until it is killed (``-o``: the ``sleep`` it runs does not hold the lock too)."""
    path.touch()  # a partition not yet written to has no lock file yet
    holder = subprocess.Popen(["flock", "-o", str(path), "sleep", "120"])
    with open(path, "rb") as probe:

        def held() -> bool:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(probe, fcntl.LOCK_UN)
            return False

        wait_for(held, 10, f"flock to take {path}", interval=0.02)
    return holder


@embedded_only
def test_a_held_log_lock_delays_no_open_or_read_and_updates_time_out_naming_it(
    target: str, map_name: str
) -> None:
    with kafkakv.connect(target) as db:
        db.map(map_name)["a"] = 1
    lock = Path(target) / "topics" / f"{map_name}_ops" / "0" / "lock"
    holder = _hold_lock(lock)
    try:
        started = time.monotonic()
        with kafkakv.connect(target) as db:
            m = db.map(map_name, timeout=2)
            assert m["a"] == 1 and time.monotonic() - started < 2
            started = time.monotonic()
            with pytest.raises(LockTimeoutError) as raised:
                m["b"] = 2
            assert 1.5 < time.monotonic() - started < 6
            assert raised.value.pid == holder.pid and str(holder.pid) in str(raised.value)
            assert str(lock) in str(raised.value)
            future = m.put_async("c", 3)
        assert isinstance(future.exception(0), (LockTimeoutError, ClosedError))
    finally:
        holder.kill()
        holder.wait()
    with kafkakv.connect(target) as db:
        m = db.map(map_name)


@embedded_only
def test_a_put_held_at_the_log_then_behind_a_listener_returns_within_the_maps_timeout(
    target: str, map_name: str
) -> None:
    """A sync put is one deadline: the wait for the log's lock and the wait to apply its
    update (behind a slow listener here) both count towards it (the apply had a whole timeout
    of its own, so this put returned after 3 s, with no error)."""
    with kafkakv.connect(target) as db, kafkakv.connect(target) as other:
        m = db.map(map_name, timeout=2)
        seen = threading.Event()

        def slow(key: Any, old: Any, new: Any, mine: bool) -> None:
            if key == "slow":
                seen.set()
                time.sleep(3.0)  # the replica's lock held meanwhile

        m.add_listener(slow)
        other.map(map_name)["slow"] = 1
        assert seen.wait(5)
        holder = _hold_lock(Path(target) / "topics" / f"{map_name}_ops" / "0" / "lock")
        letgo = threading.Timer(1.2, holder.kill)  # the put appends after 1.2 s
        try:
            letgo.start()
            started = time.monotonic()
            with pytest.raises(OperationTimeoutError, match="not applied in time"):
                m["b"] = 2
            took = time.monotonic() - started
        finally:
            letgo.cancel()
            holder.kill()
            holder.wait()
        assert took < 2 + 0.75, f"the put took {took:.2f} s with a timeout of 2 s"
        m.sync()
        assert m["b"] == 2  # appended: it applied later, as the error says it may


@embedded_only
def test_a_flush_held_at_two_locks_returns_within_the_maps_timeout(
    target: str, map_name: str
) -> None:
    """m.flush() is one deadline through every step: the wait to hand in its request and the
    wait to write the data both count towards it (the write had a whole timeout of its own)."""
    with kafkakv.connect(target) as db:
        m = db.map(map_name, timeout=2)
        m["a"] = 1
        topics = Path(target) / "topics"
        request = _hold_lock(topics / f"{map_name}_flush" / "0" / "lock")
        data = _hold_lock(topics / map_name / "0" / "lock")
        letgo = threading.Timer(1.2, request.kill)  # the request goes in after 1.2 s
        try:
            letgo.start()
            started = time.monotonic()
            with pytest.raises(LockTimeoutError) as raised:
                m.flush()
            took = time.monotonic() - started
        finally:
            letgo.cancel()
            for holder in (request, data):
                holder.kill()
                holder.wait()
        assert str(data.pid) in str(raised.value)  # the data write is what ran out
        assert took < 2 + 0.75, f"flush() took {took:.2f} s with a timeout of 2 s"
        m.flush()  # nothing in the way now
        wait_for(lambda: m.flushed_offsets() == {0: 0}, what="the flush point applied")

        assert dict(m.items()) == {"a": 1}  # nothing that failed was stored


_EXIT_BLOCKED = """
import sys, kafkakv
db = kafkakv.connect(sys.argv[1])
m = db.map("exit", timeout=1)
print("ready", flush=True)
sys.stdin.readline()
for i in range(100):
    m.put_async(f"k{i}", i)
"""


def test_exit_warns_with_the_count_of_updates_it_could_not_deliver(tmp_path: Path) -> None:
    path = tmp_path / "log"
    child = subprocess.Popen(
        [sys.executable, "-c", _EXIT_BLOCKED, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    holder = _hold_lock(path / "topics" / "exit_ops" / "0" / "lock")
    try:
        started = time.monotonic()
        child.stdin.write("go\n")
        child.stdin.flush()
        _, stderr = child.communicate(timeout=60)
        assert time.monotonic() - started < 15  # the drain is bounded by the map's timeout
    finally:
        holder.kill()
        holder.wait()
    assert child.returncode == 0, stderr
    assert "100 updates could not be delivered before exit" in stderr
    with kafkakv.connect(str(path)) as db:
        assert len(db.map("exit")) == 0  # the warning told the truth


def test_map_dump_prints_what_decodes_and_names_what_it_leaves_out(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with kafkakv.connect(path) as db:
        m = db.map("dumped")
        m.update({"a": 1, "b": 2})
        offset = _foreign_put(db.log, MapTopics.for_name("dumped"), 1, b"c", b"{broken")
    result = CliRunner().invoke(main, ["map", "-p", path, "dump", "dumped"])
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"key": "a", "value": 1},
        {"key": "b", "value": 2},
    ]
    assert f"left out: key b'c' (partition 0, offset {offset} of dumped_ops)" in result.stderr


def test_the_flush_point_key_is_refused_as_a_map_key(open_map: OpenMap) -> None:
    """A plain map's record key is its encoded key: one equal to the data topic's flush-point
    key would be flushed as a flush point, and every later bootstrap would fail on it."""
    m = open_map(key_codec="bytes")
    reserved = FLUSH_POINT_KEY
    for attempt in (
        lambda: m.put(reserved, 1),
        lambda: m.put_async(reserved, 1),
        lambda: m.put_if_absent(reserved, 1),
        lambda: m.compare_and_set(reserved, None, 1),
    ):
        with pytest.raises(EncodeError, match="reserved"):
            attempt()
    assert reserved not in m and m.get(reserved) is None  # reads are fine: it is never there
    m[b"\x00other"] = 2  # other keys starting with a zero byte are keys like any other
    m.flush()
    assert dict(open_map(key_codec="bytes")) == {b"\x00other": 2}


def test_a_closed_map_lets_go_of_its_data(tmp_path: Path) -> None:
    """A map object kept after close (a closed database's maps, say) holds no keys: its
    fast read path keeps the store's lookup function, whose dict close() must empty."""
    with kafkakv.connect(tmp_path / "log") as db:
        for store in ("dict", "sorted"):
            m = db.map(f"m-{store}", store=store)
            m.put_all({f"k{i}": i for i in range(1000)})
            held = m._lookup
            assert held is not None  # a replica of every partition reads through it
            m.close()
            assert held(b"k1") is None


def test_a_flush_that_close_overtakes_ends_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """close() marks the map closed, then drains while the flusher may still take a queued
    partition: that flush finds the map closed, which is the end of flushing, not a failure
    to warn about (it was logged as "flush of ... failed: map is closed")."""
    with kafkakv.connect(str(tmp_path / "log")) as db:
        m = db.map("quiet")
        m["k"] = 1
        engine = m._engine
        flusher = next(t for t in engine._threads if t.name.endswith("-flusher"))
        with caplog.at_level(logging.INFO, logger="kafkakv"):
            with engine._lock:  # the state close() is in while it drains
                engine._closed = True
                engine.flusher.request(0)
            flusher.join(timeout=10)
            assert not flusher.is_alive()  # flushing ended with close
            engine._closed = False
            m.close()
    assert [r.getMessage() for r in caplog.records if "flush of" in r.getMessage()] == []


def test_a_flush_behind_another_returns_within_the_maps_timeout(open_map: OpenMap) -> None:
    """m.flush() waits at most the map's timeout for all its partitions together, the wait
    for a flush of one already under way here included (it came on top of the timeout, and
    each partition had a timeout of its own).

    Only the flush under test runs with a timeout of 1 s: a map opened with it also had its
    set-up writes bounded by 1 s, and under load the first append of a new producer took
    longer (a fresh-clone run). flush() reads the map's timeout when called."""
    m = open_map(partitions=2)
    m.put_all({f"k{n}": n for n in range(20)})
    settings = m._engine.settings
    busy = m._engine.flusher.locks[1]
    busy.acquire()  # partition 1's flush under way, and slow
    release = threading.Timer(6.0, busy.release)
    release.start()
    m._engine.settings = dataclasses.replace(settings, timeout=1.0)
    try:
        started = time.monotonic()
        # Whichever step of the flush runs when the one deadline passes raises, and the
        # machine's load decides which: partition 1's wait for the flush under way, its
        # request not acknowledged in time, or (under load, fresh run 41) partition 0's
        # offsets request, left no time. The promise is the error's type and the bound.
        with pytest.raises(
            OperationTimeoutError,
            match=r"did not begin within [01]\.\d\d s|not acknowledged in time|no answer within",
        ):
            m.flush()
        took = time.monotonic() - started
    finally:
        m._engine.settings = settings
        release.cancel()
        if busy.locked():
            busy.release()
    assert took < 1.0 + 0.75, f"flush() took {took:.2f} s with a timeout of 1 s"
    m.flush()  # nothing in the way now
    assert set(m.flushed_offsets()) == {0, 1}


def test_the_largest_update_a_map_takes_also_flushes(open_map: OpenMap) -> None:
    """An update the map takes must fit every record it leads to: the ops record and, once
    flushed, the data record with its headers (a version and a deadline). Before, the largest
    put with a ttl that the ops topic took was refused by the data topic at every flush."""
    m = open_map(value_codec="bytes", versions=True, expiry=True)
    low, high = 1, 2 << 20  # the largest value a put with a ttl is taken with
    while low < high:
        middle = (low + high + 1) // 2
        try:
            m.put("k", b"x" * middle, ttl=3600)
            low = middle
        except RecordTooLargeError:
            high = middle - 1
    assert low > 1 << 19
    m.put("k", b"x" * low, ttl=3600)
    m.flush()  # raised RecordTooLargeError on the parent
    wait_for(lambda: _flushed(m, b"k", b"x" * low), what="the value in the data topic")


def _flushed(m: Any, key: bytes, value: bytes) -> bool:
    """Whether map ``m``'s data topic holds ``value`` for store key ``key`` (every partition
    read through: the record may share it with others and with flush points)."""
    log, data, record_key = m._engine.log, m._engine.topics.data, m._state.prefix + key
    for p in range(log.partitions(data)):
        offset, end = 0, log.end_offset(data, p)
        while offset < end:
            records, offset = log.read_batch(data, p, offset, max_bytes=8 << 20)
            if any(r[0] == record_key and r[1] == value for r in records):
                return True
    return False


@functions.register("test_edges.grow")
def _grow(key: str, old: bytes | None, size: int) -> bytes:
    return b"x" * size


@functions.register("test_edges.double")
def _double(old: bytes, given: bytes) -> bytes:
    return old + given


def test_a_computed_value_too_large_for_a_record_fails_everywhere_and_flushes_stay_well(
    open_map: OpenMap,
) -> None:
    """A function's result must fit a data record as a put's value must. Before, one too large
    was applied on every replica and every flush of its partition then failed with
    RecordTooLargeError; now the op fails alike everywhere (the room travels in the op) and
    the largest result that fits flushes, headers included."""
    m = open_map(value_codec="bytes", versions=True, expiry=True)
    other = open_map(value_codec="bytes", versions=True, expiry=True)
    room = m._engine.max_record_bytes - len(m._state.prefix)
    with pytest.raises(ResultTooLargeError, match="bytes a record of the map may hold"):
        m.compute("k", "test_edges.grow", 2 * room)
    with pytest.raises(RecordTooLargeError):  # a ResultTooLargeError is one
        m.compute_async("k", "test_edges.grow", room).result(timeout=30)
    half = b"y" * (room // 2 + 10)  # a put of it fits, and so does a merge's argument
    m["j"] = half
    with pytest.raises(ResultTooLargeError):
        m.merge("j", half, "test_edges.double")
    assert "k" not in m and m["j"] == half
    other.sync()
    assert "k" not in other and other["j"] == half
    assert m.compute("k", "test_edges.grow", room - 1) == b"x" * (room - 1)  # key "k": 1 byte
    m.flush()  # raised RecordTooLargeError on the parent after the first compute
    largest = b"x" * (room - 1)
    wait_for(lambda: _flushed(m, b"k", largest), what="the largest computed value flushed")
    other.sync()
    assert other["k"] == b"x" * (room - 1)


def test_compute_async_refuses_arguments_msgpack_cannot_carry(open_map: OpenMap) -> None:
    """As compute does: a typed error before anything is appended (it was msgpack's own
    TypeError)."""
    m = open_map()
    with pytest.raises(EncodeError, match="msgpack"):
        m.compute_async("k", "test_edges.grow", object())
