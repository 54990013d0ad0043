"""The map protocol as seen on the log: topics, flushes, bootstrap, fencing, sharding, several
maps per topic set, persistent stores, linearizable reads, close.

Tests reach the log only through the :class:`~kafkakv.log.Log` interface (``db.log``), so the
suite runs unchanged on every backend. Randomized tests print their seed; set
``KAFKAKV_SEED`` to replay one.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest

import kafkakv
from kafkakv.codecs import codec_for
from kafkakv.errors import (
    ClosedError,
    ConfigError,
    DataLossError,
    FencedError,
    TopicMismatchError,
    WrongPartitionError,
)
from kafkakv.log.base import (
    Log,
    LogWriter,
    Record,
    TopicPartition,
)
from kafkakv.log.kafka import KafkaLog
from kafkakv.map import FLUSH_POINT_KEY, ReplicaMap
from kafkakv.map.ops import OpCode, decode_op
from kafkakv.store import LmdbStore, Positions, Store
from tests.conftest import bounded
from tests.doubles import ForwardingLog, ForwardingLogWriter
from tests.map.conftest import OpenMap, compact_if_possible, embedded_only, local_logs
from tests.waiting import wait_for

STR = codec_for("str")
JSON = codec_for("json")


# -- helpers ------------------------------------------------------------------------------
@pytest.fixture
def db(target: str) -> Iterator[kafkakv.Database]:
    """A database of its own on the test's log, to open topics and look at records."""
    with kafkakv.connect(target) as database:
        yield database


def _seed() -> int:
    seed = int(os.environ.get("KAFKAKV_SEED") or random.randrange(1 << 32))
    print(f"seed: {seed} (replay with KAFKAKV_SEED={seed})")
    return seed


def read_all(log: Log, topic: str, partition: int) -> list[Record]:
    """Every record stored in one partition, in offset order."""
    out: list[Record] = []
    position, end = log.start_offset(topic, partition), log.end_offset(topic, partition)
    while position < end:
        batch = log.read(topic, partition, position, max_records=2000)
        if not batch:
            break
        out.extend(batch)
        position = (batch[-1].offset or 0) + 1
    return out


def data_view(records: list[Record]) -> tuple[dict[bytes, bytes], list[int]]:
    """(last value per key of a data topic partition, tombstones removed; its flush points)."""
    latest: dict[bytes, bytes | None] = {}
    points: list[int] = []
    for r in records:
        if r.key == FLUSH_POINT_KEY:
            points.append(msgpack.unpackb(r.value or b"")[0])
        else:
            assert r.key is not None
            latest[r.key] = r.value
    return {k: v for k, v in latest.items() if v is not None}, points


def replay_ops(records: list[Record], upto: int | None = None) -> dict[bytes, bytes]:
    """The state reached by the puts and removes of an ops partition (up to offset ``upto``)."""
    state: dict[bytes, bytes] = {}
    for r in records:
        assert r.offset is not None
        if upto is not None and r.offset > upto:
            break
        op = decode_op(r.value)
        if r.key is None:
            continue
        assert op.code in _PLAIN_WRITES, "only puts and removes in these tests"
        pairs = zip(*op.args, strict=True) if op.code is OpCode.WRITE_MANY else [(r.key, None)]
        for key, value in pairs:
            if op.code is OpCode.PUT:
                value = op.args[0]
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


_PLAIN_WRITES = (OpCode.PUT, OpCode.REMOVE, OpCode.WRITE_MANY)


def decoded(raw: Mapping[bytes, bytes]) -> dict[str, Any]:
    return {STR.decode(k): JSON.decode(v) for k, v in raw.items()}


def compacted_data_topic(log: Log, name: str, partitions: int = 1) -> None:
    """Create a map's data topic beforehand with small segments, so compaction has sealed
    segments to work on (settings a map accepts: compacted, nothing else required)."""
    log.create_topic(
        name,
        partitions,
        {
            "cleanup.policy": "compact",
            "segment.bytes": 1024,
            "min.compaction.lag.ms": 0,
            "delete.retention.ms": 0,
        },
    )


def small_ops_topic(log: Log, name: str, partitions: int = 1) -> None:
    """Create a map's ops topic beforehand with a tiny size retention (retention.ms stays -1,
    as a map requires), so that the log's own retention removes old ops."""
    log.create_topic(
        f"{name}_ops",
        partitions,
        {
            "cleanup.policy": "delete",
            "retention.ms": -1,
            "retention.bytes": 2048,
            "segment.bytes": 1024,
        },
    )


# -- topics -------------------------------------------------------------------------------
def test_map_creates_its_three_topics_with_safe_settings(
    target: str, db: kafkakv.Database, map_name: str
) -> None:
    with kafkakv.connect(target) as other:
        other.map(map_name, partitions=3)
    log = db.log
    names = (map_name, f"{map_name}_ops", f"{map_name}_flush")
    assert set(names) <= set(log.topics())
    assert [log.partitions(t) for t in names] == [3, 3, 3]
    data = log.topic_config(map_name)
    assert data["cleanup.policy"] == "compact"
    for topic in names[1:]:
        config = log.topic_config(topic)
        assert config["cleanup.policy"] == "delete" and config["retention.ms"] == "-1"
    again = db.map(map_name)  # reopening verifies and takes the existing count
    assert again.partitions == (0, 1, 2)
    with pytest.raises(TopicMismatchError, match="3 partitions, not 2"):
        db.map(map_name, partitions=2)


@pytest.mark.parametrize(
    ("topic_suffix", "config", "setting"),
    [
        ("", {"cleanup.policy": "delete"}, "cleanup.policy"),
        ("", {"cleanup.policy": "compact,delete"}, "cleanup.policy"),
        ("_ops", {"cleanup.policy": "delete"}, "retention.ms"),  # 7 days by default
        ("_ops", {"cleanup.policy": "compact"}, "cleanup.policy"),
        ("_flush", {"cleanup.policy": "delete", "retention.ms": 1000}, "retention.ms"),
    ],
)
def test_existing_topic_with_wrong_settings_is_refused(
    db: kafkakv.Database, map_name: str, topic_suffix: str, config: dict[str, Any], setting: str
) -> None:
    topic = map_name + topic_suffix
    db.log.create_topic(topic, 1, config)
    with pytest.raises(TopicMismatchError, match=f"'{topic}'.*{setting}") as info:
        db.map(map_name)
    assert isinstance(info.value, ConfigError)


def test_topics_with_different_partition_counts_are_refused(
    db: kafkakv.Database, map_name: str
) -> None:
    db.log.create_topic(map_name, 1, {"cleanup.policy": "compact"})
    db.log.create_topic(f"{map_name}_ops", 2, {"cleanup.policy": "delete", "retention.ms": -1})
    with pytest.raises(TopicMismatchError, match="equal partition counts"):
        db.map(map_name)


def test_partitions_option_must_match_an_existing_map(db: kafkakv.Database, map_name: str) -> None:
    db.map(map_name, partitions=2)
    with pytest.raises(TopicMismatchError, match="2 partitions, not 4"):
        db.map(map_name, partitions=4)
    assert db.map(map_name, partitions=2).partitions == (0, 1)


# -- flushes ------------------------------------------------------------------------------
def test_automatic_flush_writes_plain_records_and_flush_points(
    open_map: OpenMap, db: kafkakv.Database, map_name: str
) -> None:
    m = open_map(flush_period=20)
    for i in range(300):
        m[f"k{i % 40}"] = {"i": i}
        if i % 7 == 3:
            m.remove(f"k{(i * 3) % 40}")
    for j in range(5):
        del m[f"k{j}"]  # removed for good: tombstones once flushed
    for i in range(60):
        m[f"tail{i}"] = {"i": i}  # more updates, so that automatic flushes cover the removals
    ops_topic = f"{map_name}_ops"
    gone = {STR.encode(f"k{j}") for j in range(5)}

    def flush_marks() -> list[int]:
        return [
            decode_op(r.value).args[0]
            for r in read_all(db.log, ops_topic, 0)
            if r.key is None and decode_op(r.value).code is OpCode.FLUSHED
        ]

    def removals_flushed() -> bool:
        last = {r.key: r.value for r in read_all(db.log, map_name, 0)}
        return all(k in last and last[k] is None for k in gone)

    wait_for(removals_flushed, 10, "automatic flushes covering the removals")
    # A slow flusher (a loaded machine, a disk slow to sync a commit) may cover every mark so
    # far in one flush; updates after it cross marks again, so that at least two flush points
    # are checked below.
    extra = 0

    def two_flushes() -> bool:
        nonlocal extra
        if len(data_view(read_all(db.log, map_name, 0))[1]) >= 2:
            return True
        for _ in range(25):
            m[f"tail{extra % 60}"] = {"i": extra}
            extra += 1
        return False

    wait_for(two_flushes, 20, "a second automatic flush")
    data = read_all(db.log, map_name, 0)
    latest, points = data_view(data)
    assert not gone & set(latest), "removed keys are written as tombstones"
    # Plain records: every key decodes with the key codec, every value with the value codec.
    for r in data:
        if r.key != FLUSH_POINT_KEY:
            assert r.key is not None and STR.decode(r.key).startswith(("k", "tail"))
            if r.value is not None:
                assert set(JSON.decode(r.value)) == {"i"}
    # One flush point per flush, each matching the FLUSHED mark of its batch, increasing.
    # (How many: the 360 ops take a few tens of ms, and marks crossed while a flush runs are
    # covered by the one flush that follows it, so a slow flusher makes fewer, larger flushes.)
    assert points == sorted(set(points)) and len(points) >= 2
    assert points == flush_marks()[: len(points)]
    # The data topic is the map as of its last flush point; later ops complete it.
    ops = read_all(db.log, ops_topic, 0)
    assert decoded(latest) == decoded(replay_ops(ops, upto=points[-1]))
    m.sync()
    assert decoded(replay_ops(ops)) == dict(m)
    after = {**latest}
    for r in ops:
        assert r.offset is not None
        if r.offset > points[-1] and r.key is not None:
            op = decode_op(r.value)
            if op.code is OpCode.PUT:
                after[r.key] = op.args[0]
            else:
                after.pop(r.key, None)
    assert decoded(after) == dict(m)


def _flush_despite_fencing(m: ReplicaMap[Any, Any], attempts: int = 50) -> None:
    for _ in range(attempts - 1):
        try:
            m.flush()
            return
        except FencedError:  # another replica's flusher took the writer meanwhile
            time.sleep(0.01)
    m.flush()


@local_logs
def test_fresh_replica_after_flushes_and_compactions_equals_the_others(
    open_map: OpenMap, db: kafkakv.Database, map_name: str
) -> None:
    rng = random.Random(_seed())
    compacted_data_topic(db.log, map_name, partitions=2)
    a, b = open_map(flush_period=10), open_map(flush_period=10)
    model: dict[str, int] = {}
    removed = 0
    for round_ in range(4):
        for i in range(120):
            key, writer = f"k{rng.randrange(50)}", rng.choice((a, b))
            if rng.random() < 0.3:
                removed += writer.remove(key) is not None
                model.pop(key, None)
            else:
                writer[key] = round_ * 1000 + i
                model[key] = round_ * 1000 + i
        # Automatic flushes run on the flusher thread, which may lag behind under load: a
        # flush now makes sure each round's values are in the data topic before compacting.
        # b's automatic flushes share the flush writer's id and may fence it (twice, and
        # flush() raises): then again, until one is written.
        _flush_despite_fencing(a)
        assert len(db.log.compact(map_name)) == 2
    assert removed > 0
    stored = sum(len(read_all(db.log, map_name, p)) for p in (0, 1))
    offsets = sum(db.log.end_offset(map_name, p) - db.log.start_offset(map_name, p) for p in (0, 1))
    assert stored < offsets, "compaction removed records"
    fresh = open_map()
    a.sync()
    b.sync()
    assert fresh == a == b == model
    for i in range(60):
        key = f"k{rng.randrange(80)}"
        if i % 4 == 0:
            a.remove(key)
            model.pop(key, None)
        else:
            b[key] = -i
            model[key] = -i
    for m in (a, b, fresh):
        m.sync()
    assert fresh == a == b == model
    assert fresh.check() == [] and open_map() == model


@local_logs
def test_bootstrap_does_not_stall_on_offset_gaps(
    open_map: OpenMap, db: kafkakv.Database, map_name: str
) -> None:
    compacted_data_topic(db.log, map_name)
    m = open_map(flush_period=10**6)
    for i in range(60):
        m.update({f"k{j}": i for j in range(5)})
        m.flush()  # 60 flushes of the same 5 keys
    db.log.compact(map_name)
    start, end = db.log.start_offset(map_name, 0), db.log.end_offset(map_name, 0)
    stored = read_all(db.log, map_name, 0)
    assert len(stored) * 4 < end - start, "compaction left most data offsets empty"
    began = time.monotonic()
    fresh = open_map(timeout=5)
    assert time.monotonic() - began < 2
    assert fresh == m == {f"k{j}": 59 for j in range(5)}


# -- fencing and stale flushes ------------------------------------------------------------
def test_flush_storm_from_two_replicas_never_regresses_data(
    open_map: OpenMap, db: kafkakv.Database, map_name: str
) -> None:
    seed = _seed()
    if not isinstance(db.log, KafkaLog):  # small segments, so that compaction has work
        compacted_data_topic(db.log, map_name, partitions=2)
    a, b = open_map(flush_period=7, partitions=2), open_map(flush_period=7, partitions=2)
    stop = threading.Event()
    failures: list[BaseException] = []

    def flusher(m: ReplicaMap[Any, Any]) -> None:
        while not stop.is_set():
            try:
                m.flush()  # fenced by the other replica's flushes: decides again, no error
            except BaseException as exc:
                failures.append(exc)
                return

    def writer(m: ReplicaMap[Any, Any], rng: random.Random, tag: str) -> None:
        try:
            for i in range(bounded(150, 250)):
                key = f"k{rng.randrange(30)}"
                if rng.random() < 0.2:
                    m.remove(key)
                else:
                    m[key] = f"{tag}{i}"
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=flusher, args=(m,)) for m in (a, b, a, b)]
    threads += [
        threading.Thread(target=writer, args=(m, random.Random(seed + n), tag))
        for n, (m, tag) in enumerate(((a, "a"), (b, "b")))
    ]
    for t in threads:
        t.start()
    for t in threads[4:]:
        t.join()
    stop.set()
    for t in threads[:4]:
        t.join()
    assert failures == []
    a.sync()
    b.sync()
    assert a == b
    assert open_map() == a
    compact_if_possible(db.log, map_name)
    assert open_map() == a


class _Gate:
    """Stops the next transactional append until released, as a flusher that stalls (GC
    pause, slow disk) between deciding its batch and writing it."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.used = False


class _GatedWriter(ForwardingLogWriter):
    def __init__(self, inner: LogWriter, log: _GatedLog) -> None:
        super().__init__(inner)
        self.log = log

    def append(
        self, batches: Mapping[TopicPartition, Sequence[Record]], *, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        gate = self.log.gate
        if gate is not None and not gate.used:
            gate.used = True
            gate.entered.set()
            assert gate.release.wait(10), "the stalled flush was never released"
        return super().append(batches, timeout=timeout)


class _GatedLog(ForwardingLog):
    """A log whose transactional writers can be stalled (see :class:`_Gate`)."""

    def __init__(self, inner: Log) -> None:
        super().__init__(inner)
        self.gate: _Gate | None = None

    def writer(self, transactional_id: str, *, timeout: float | None = None) -> LogWriter:
        return _GatedWriter(super().writer(transactional_id, timeout=timeout), self)


@pytest.fixture
def gated(target: str) -> Iterator[tuple[_GatedLog, kafkakv.Database]]:
    """A database on a log whose flush writers the test can stall."""
    with kafkakv.connect(target) as inner:
        log = _GatedLog(inner.log)
        with kafkakv.connect(log) as database:
            yield log, database


def test_a_test_double_of_the_log_stands_for_it_in_every_update(
    gated: tuple[_GatedLog, kafkakv.Database], map_name: str
) -> None:
    # put_async reaches the log through send(..., on_failure, timeout=...): a double that
    # restated send with an older signature made it raise TypeError (tests/doubles.py).
    log, gdb = gated
    m = gdb.map(map_name)
    futures = [m.put_async(f"k{i}", i) for i in range(20)]
    assert [f.result(timeout=10) for f in futures] == [None] * 20
    m["sync"] = -1
    m.flush()
    assert dict(m) == {"sync": -1, **{f"k{i}": i for i in range(20)}}
    latest, _ = data_view(read_all(log, map_name, 0))
    assert decoded(latest) == dict(m)


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _stall_next_flush(
    log: _GatedLog, m: ReplicaMap[Any, Any]
) -> tuple[_Gate, threading.Thread, list[Any]]:
    """Start ``m.flush()`` in a thread that stops just before writing the batch it decided."""
    gate = log.gate = _Gate()
    thread, outcome = _in_thread(m.flush)
    assert gate.entered.wait(10)
    return gate, thread, outcome


def test_a_flush_mark_crossed_during_a_flush_is_flushed_after_it(
    gated: tuple[_GatedLog, kafkakv.Database], map_name: str
) -> None:
    # The automatic flusher is busy (stalled here) while this replica's ops cross the next
    # flush marks; no more ops come. The marks must still be flushed once it is free.
    log, gdb = gated
    gate = log.gate = _Gate()
    m = gdb.map(map_name, flush_period=5)
    for i in range(5):
        m[f"k{i}"] = i  # the fifth op crosses the first mark: the flusher stalls on it
    assert gate.entered.wait(10)
    for i in range(5, 17):
        m[f"k{i}"] = i  # two more marks crossed while that flush is stalled
    gate.release.set()
    last = log.end_offset(f"{map_name}_ops", 0) - 1

    def covered() -> int:
        return max(data_view(read_all(log, map_name, 0))[1], default=-1)

    wait_for(lambda: covered() >= last, 10, "a flush covering every op")
    latest, _ = data_view(read_all(log, map_name, 0))
    assert decoded(latest) == {f"k{i}": i for i in range(17)}


@pytest.mark.parametrize("store_kind", ["dict"])
def test_zombie_flush_of_another_replica_is_fenced(
    gated: tuple[_GatedLog, kafkakv.Database], open_map: OpenMap, map_name: str
) -> None:
    log, gdb = gated
    a = gdb.map(map_name, flush_period=10**6)
    b = open_map(store="dict", flush_period=10**6)
    a["k"] = "old"
    a["other"] = 1
    a.flush()
    a["k"] = "mid"
    gate, thread, outcome = _stall_next_flush(log, a)  # decided k="mid", stalls
    b["k"] = "new"
    b.flush()  # later ops, flushed by b, which fences a's flush writer
    gate.release.set()
    thread.join()
    assert len(outcome) == 1 and isinstance(outcome[0], FencedError | None)
    latest, _ = data_view(read_all(log, map_name, 0))
    assert decoded(latest) == {"k": "new", "other": 1}
    a.sync()
    assert open_map(store="dict") == a == b == {"k": "new", "other": 1}


@pytest.mark.parametrize("store_kind", ["dict"])
def test_concurrent_flushes_of_one_replica_never_write_older_values(
    gated: tuple[_GatedLog, kafkakv.Database], open_map: OpenMap, map_name: str
) -> None:
    # Two flushes of one partition in one replica (the automatic flusher and a user's flush(),
    # or two user threads): the one that decided first must not land last.
    log, gdb = gated
    a = gdb.map(map_name, flush_period=10**6)
    a["k"] = "old"
    gate, first, first_outcome = _stall_next_flush(log, a)  # decided k="old", stalls
    a["k"] = "new"
    second, second_outcome = _in_thread(a.flush)  # decides k="new"
    second.join(1.0)  # done unless flushes of a partition wait for each other
    gate.release.set()
    first.join()
    second.join()
    assert len(first_outcome) == 1 and isinstance(first_outcome[0], int | FencedError | None)
    assert len(second_outcome) == 1 and isinstance(second_outcome[0], int | None)
    latest, _ = data_view(read_all(log, map_name, 0))
    assert open_map(store="dict") == a == {"k": "new"}
    assert decoded(latest) == {"k": "new"}


@pytest.mark.parametrize("store_kind", ["dict"])
def test_a_fenced_replica_can_flush_again(
    open_map: OpenMap, db: kafkakv.Database, map_name: str
) -> None:
    # Bug: after flush() raised FencedError, the fenced writer stays cached, and every later
    # flush of that replica (by flush() or automatic) fails with ClosedError forever.
    a, b = open_map(flush_period=10**6), open_map(flush_period=10**6)
    a["k"] = 1
    a.flush()
    b["k"] = 2
    b.flush()  # b's writer fences a's
    a["k"] = 3
    with contextlib.suppress(FencedError):
        a.flush()  # may report the fence once
    a["k"] = 4
    a.flush()
    latest, _ = data_view(read_all(db.log, map_name, 0))
    assert decoded(latest) == {"k": 4}


@embedded_only
def test_removed_ops_before_a_flush_raise_data_loss(
    target: str, db: kafkakv.Database, map_name: str
) -> None:
    small_ops_topic(db.log, map_name)
    with kafkakv.connect(target) as writer_db:
        m = writer_db.map(map_name, flush_period=10**6)  # never flushes by itself
        for i in range(300):
            m[f"k{i % 20}"] = i
        # The log's own size retention (a background task on every backend) removes old ops.
        wait_for(lambda: db.log.start_offset(f"{map_name}_ops", 0) > 0, 15, "ops retention")
        with pytest.raises(DataLossError, match=f"{map_name}_ops"):
            db.map(map_name)
        m["after"] = 1  # the live replica is unaffected
        m.flush()  # and once a flush covers the ops, new replicas start again
        assert db.map(map_name) == m


# -- several maps per topic set -----------------------------------------------------------
def test_several_maps_share_one_topic_set(
    target: str, store_kind: str, db: kafkakv.Database, map_name: str, tmp_path: Path
) -> None:
    def open_maps(where: str) -> dict[str, ReplicaMap[Any, Any]]:
        database = kafkakv.connect(target)
        opened.append(database)
        options: dict[str, Any] = {"store": store_kind}
        if store_kind == "lmdb":
            options["store_path"] = str(tmp_path / where)
        return database.maps(map_name, ["a", "b"], partitions=2, **options)

    opened: list[kafkakv.Database] = []
    try:
        first = open_maps("first")
        a, b = first["a"], first["b"]
        for i in range(60):
            a[f"k{i}"] = i
            b[f"k{i}"] = f"b{i}"
        a["only-a"] = True
        b["only-b"] = True
        del a["k0"]
        b.flush()  # flushes both maps: one engine
        compact_if_possible(db.log, map_name)
        a["k1"] = "late"  # after the last flush: from the ops topic
        second = open_maps("second")
        assert second["a"] == a and second["b"] == b
        assert a["k1"] == "late" and b["k1"] == "b1" and "k0" not in a and b["k0"] == "b0"
        alone = db.map("a", topics=map_name)  # only "a" of the set
        assert alone == a and "only-b" not in alone
        b["k2"] = "b-again"
        a["k2"] = "a-again"
        alone.sync()
        assert alone["k2"] == "a-again" and alone == a
    finally:
        for database in opened:
            database.close()


# -- sharding -----------------------------------------------------------------------------
def test_shard_replicas_hold_only_their_partitions(
    open_map: OpenMap, db: kafkakv.Database, map_name: str
) -> None:
    full = open_map(partitions=4)
    low, high = open_map(shard=[0, 1]), open_map(shard=[3, 2])
    assert low.partitions == (0, 1) and high.partitions == (2, 3)
    keys = [f"k{i}" for i in range(200)]
    full.update({k: i for i, k in enumerate(keys)})
    for m in (low, high):
        m.sync()
    assert {full.partition_of(k) for k in keys} == {0, 1, 2, 3}
    assert all(low.partition_of(k) in (0, 1) for k in low)
    assert all(high.partition_of(k) in (2, 3) for k in high)
    assert {**low, **high} == full and len(low) + len(high) == len(full) == 200
    foreign = next(k for k in keys if low.partition_of(k) == 3)
    calls: list[Callable[[], Any]] = [
        lambda: low.get(foreign),
        lambda: low[foreign],
        lambda: low.put(foreign, 1),
    ]
    for call in calls:
        with pytest.raises(WrongPartitionError) as info:
            call()
        assert isinstance(info.value, KeyError)
    mine = next(k for k in keys if low.partition_of(k) == 1)
    low[mine] = "from-low"
    full.sync()
    assert full[mine] == "from-low"
    full.flush()
    compact_if_possible(db.log, map_name)
    fresh_high = open_map(shard=[2, 3])
    assert fresh_high == high == {k: v for k, v in full.items() if full.partition_of(k) >= 2}
    with pytest.raises(ConfigError):
        open_map(shard=[4])


# -- persistent stores --------------------------------------------------------------------
class _CountingStore(Store):
    """A store that delegates to another one and counts what the replica asks of it."""

    persistent = True

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.written = 0
        self.dropped: list[int] = []

    def get(self, key: bytes) -> bytes | None:
        return self.inner.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self.inner

    def __len__(self) -> int:
        return len(self.inner)

    def keys(self) -> Iterator[bytes]:
        return self.inner.keys()

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.items()

    def positions(self) -> dict[int, Positions]:
        return self.inner.positions()

    def write(
        self, changes: Mapping[bytes, bytes | None], positions: Mapping[int, Positions]
    ) -> None:
        self.written += len(changes)
        self.inner.write(changes, positions)

    def drop_partition(self, partition: int, keys: Iterable[bytes] | None = None) -> None:
        self.dropped.append(partition)
        self.inner.drop_partition(partition, keys)

    def check(self) -> list[str]:
        return self.inner.check()

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("store_kind", ["lmdb"])
def test_the_store_holds_the_position_past_offsets_with_nothing_to_apply(
    open_map: OpenMap, tmp_path: Path
) -> None:
    """On Kafka a flush writes its mark in a transaction, which ends with a commit marker: an
    offset with nothing to apply that the replica steps over. The store records that step
    too: after close it holds the positions the replica had (it held the one before the
    marker, from a fresh-clone run)."""
    path = str(tmp_path / "kept")
    m = open_map(store="lmdb", store_path=path, partitions=2, barriers="offset")
    m.update({f"k{i}": i for i in range(20)})
    m.flush()
    m.sync()  # applies up to the end offset, which is past the marker on Kafka
    before = m._engine.positions()
    m.close()
    with LmdbStore(path) as kept:
        assert kept.positions() == before


@pytest.mark.parametrize("store_kind", ["lmdb"])
def test_persistent_store_resumes_where_it_stopped(
    open_map: OpenMap, db: kafkakv.Database, map_name: str, tmp_path: Path
) -> None:
    path = str(tmp_path / "persistent")
    other = open_map(store="dict", partitions=2)
    p = open_map(store="lmdb", store_path=path, flush_period=300)
    p.update({f"k{i}": i for i in range(1000)})
    before = p._engine.positions()
    p.close()
    with LmdbStore(path) as kept:
        assert kept.positions() == before and len(kept) == 1000
    # Meanwhile another replica changes 150 keys, flushes and the data topic is compacted.
    other.sync()
    other.update({f"k{i}": -i for i in range(0, 1000, 10)})
    for i in range(1, 1000, 20):
        del other[f"k{i}"]
    other.flush()
    compact_if_possible(db.log, map_name)
    counting = _CountingStore(LmdbStore(path))
    again = open_map(store=counting)
    assert again == other
    assert counting.dropped == [], "resumed: no partition reloaded"
    assert counting.written <= 150, "resumed: only the ops it had not applied"
    assert again.check() == []
    again.close()
    reopened = open_map(store="lmdb", store_path=path)  # a third start, nothing new
    assert reopened == other


@embedded_only
@pytest.mark.parametrize("store_kind", ["lmdb"])
def test_persistent_store_reloads_when_its_ops_are_gone(
    open_map: OpenMap, db: kafkakv.Database, map_name: str, tmp_path: Path
) -> None:
    small_ops_topic(db.log, map_name)
    path = str(tmp_path / "persistent")
    p = open_map(store="lmdb", store_path=path, flush_period=50)
    p.update({f"k{i}": i for i in range(100)})
    p.close()
    other = open_map(store="dict")
    for i in range(0, 100, 3):
        del other[f"k{i}"]  # keys the closed store still holds
    for i in range(300):
        other[f"n{i % 30}"] = i
    other.flush()
    db.log.compact(map_name)
    ops = f"{map_name}_ops"
    with LmdbStore(path) as kept:
        before_offset = kept.positions()[0].applied
    wait_for(lambda: db.log.start_offset(ops, 0) > before_offset, 15, "ops retention")
    counting = _CountingStore(LmdbStore(path))
    again = open_map(store=counting)
    assert counting.dropped == [0], "the ops it needed are gone: reloaded from the data topic"
    assert again == other and not any(f"k{i}" in again for i in range(0, 100, 3))
    assert again.check() == []


# -- reads --------------------------------------------------------------------------------
def test_linearizable_reads_see_writes_of_another_replica(open_map: OpenMap) -> None:
    writer = open_map(partitions=3)
    reader = open_map(consistency="linearizable")
    for i in range(150):
        writer[f"k{i % 10}"] = i
        assert reader[f"k{i % 10}"] == i
        assert reader.get(f"k{i % 10}") == i and f"k{i % 10}" in reader


def test_concurrent_linearizable_readers_never_read_the_past(open_map: OpenMap) -> None:
    writer = open_map()
    reader = open_map(consistency="linearizable")
    writer["n"] = 0
    done = [0]  # the last value whose write completed
    stop = threading.Event()
    failures: list[BaseException] = []
    reads = [0]

    def write() -> None:
        for i in range(1, 400):
            if stop.is_set():
                return
            writer["n"] = i
            done[0] = i

    def read() -> None:
        try:
            for _ in range(40):
                before = done[0]
                seen = reader["n"]
                assert seen >= before, f"read {seen} after the write of {before} completed"
                reads[0] += 1
        except BaseException as exc:
            failures.append(exc)

    w = threading.Thread(target=write)
    w.start()
    readers = [threading.Thread(target=read) for _ in range(16)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    stop.set()
    w.join()
    assert failures == [] and reads[0] == 16 * 40


# -- close --------------------------------------------------------------------------------
def test_close_drains_pending_async_updates_then_refuses_every_method(
    open_map: OpenMap,
) -> None:
    m = open_map()
    m["k"] = 1
    # Hold the replica's applying lock, so no update is applied before close: close() sends
    # and applies them (this thread holds the re-entrant lock), and each gets its result.
    with m._engine._lock:
        futures = [m.put_async(f"a{i}", i) for i in range(50)]
        m.close()
    assert [f.result(timeout=0) for f in futures] == [None] * 50
    other = open_map()
    assert all(other[f"a{i}"] == i for i in range(50))
    calls: list[Callable[[], Any]] = [
        lambda: m["k"],
        lambda: m.get("k"),
        lambda: "k" in m,
        lambda: len(m),
        lambda: list(m),
        lambda: list(m.items()),
        lambda: m.put("k", 2),
        lambda: m.put_async("k", 2),
        lambda: m.remove("k"),
        lambda: m.sync(),
        lambda: m.flush(),
    ]
    for call in calls:
        with pytest.raises(ClosedError):
            call()
    m.close()
