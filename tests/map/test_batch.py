"""Batch updates: ``put_all`` and ``remove_all`` (and their async forms), sent as a few
``WRITE_MANY`` records. Each pair must end as ``put`` or ``remove`` would leave it, on every
replica, with listeners told of each change; bad input is refused before anything is appended.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkakv.errors import (
    ClosedError,
    EncodeError,
    RecordTooLargeError,
    WrongPartitionError,
)
from kafkakv.log.base import Batch, Log, Record
from kafkakv.map.follower import ReplicaFollower
from kafkakv.map.ops import MANY_PAIRS, OpCode, encode_op, write_many_chunks
from tests.doubles import ForwardingLog
from tests.map.conftest import OpenMap, local_logs
from tests.map.test_map_protocol import _seed
from tests.waiting import wait_for


def _end(m: Any) -> int:
    engine = m._engine
    return sum(engine.log.end_offset(engine.topics.ops, p) for p in engine.held)


def test_put_all_and_remove_all_end_as_one_by_one_updates(open_map: OpenMap) -> None:
    """Rounds of batches (keys repeated within and across them, values replaced and
    removed) from one replica: its counts, both replicas' contents and a listener's changes
    match a dict that took the same updates one by one."""
    rng = random.Random(_seed())
    writer, reader = open_map(), open_map()
    heard: list[tuple[Any, Any, Any]] = []
    reader.add_listener(lambda k, old, new, mine: heard.append((k, old, new)))
    model: dict[str, int] = {}
    expected_changes: list[tuple[Any, Any, Any]] = []
    for _ in range(12):
        if rng.random() < 0.6:
            pairs = [
                (f"k{rng.randrange(40)}", rng.randrange(5)) for _ in range(rng.randrange(1, 30))
            ]
            had = len({k for k, _ in pairs} & model.keys())
            for k, v in dict(pairs).items():  # the last value of a key given twice
                if model.get(k) != v:
                    expected_changes.append((k, model.get(k), v))
                model[k] = v
            assert writer.put_all(pairs) == had
        else:
            keys = [f"k{rng.randrange(40)}" for _ in range(rng.randrange(1, 20))]
            gone = [k for k in dict.fromkeys(keys) if k in model]
            for k in gone:
                expected_changes.append((k, model.pop(k), None))
            assert writer.remove_all(keys) == len(gone)
    assert dict(writer) == model
    reader.sync()
    assert dict(reader) == model
    wait_for(lambda: len(heard) >= len(expected_changes), what="the reader's listener")
    assert heard == expected_changes


def test_a_batch_larger_than_a_record_reaches_every_partition(open_map: OpenMap) -> None:
    """More pairs than one record holds, values large enough that size cuts records too,
    over three partitions."""
    writer = open_map(partitions=3, value_codec="bytes")
    reader = open_map(partitions=3, value_codec="bytes")
    pairs = {f"key-{i}": bytes([i % 251]) * (40 + i % 300) for i in range(9000)}
    assert writer.put_all(pairs) == 0
    assert writer.put_all_async({"key-1": b"x"}).result(30) == 1
    pairs["key-1"] = b"x"
    reader.sync()
    assert dict(reader) == pairs
    assert reader.remove_all_async(list(pairs)[:5000]).result(30) == 5000
    writer.sync()
    assert len(writer) == 4000


def test_bad_batches_are_refused_before_anything_is_appended(open_map: OpenMap) -> None:
    m = open_map(value_codec="bytes")
    m.put_all({"a": b"1"})
    end = _end(m)
    with pytest.raises(EncodeError, match="None is not a value"):
        m.put_all({"b": b"2", "c": None})
    with pytest.raises(EncodeError):
        m.put_all({"b": b"2", 3: b"3"})
    with pytest.raises(EncodeError):
        m.put_all({"b": b"2", "c": "not bytes"})
    limit = m._engine.max_record_bytes
    with pytest.raises(RecordTooLargeError, match="nothing of the batch was sent"):
        m.put_all({"b": b"2", "big": b"x" * limit})
    assert _end(m) == end
    assert dict(m) == {"a": b"1"}
    assert m.put_all([]) == 0 and m.remove_all([]) == 0
    assert _end(m) == end


def test_a_batch_takes_what_a_single_put_takes(open_map: OpenMap) -> None:
    """A value too large for the batch records' usual size still goes, in a record alone."""
    m = open_map(value_codec="bytes")
    big = b"y" * (m._engine.max_record_bytes // 2 + 1000)
    m.put_all({"a": b"1", "big": big, "c": b"3"})
    assert m["big"] == big and len(m) == 3


def test_a_sharded_replica_refuses_a_batch_with_keys_it_does_not_hold(
    open_map: OpenMap,
) -> None:
    whole = open_map(partitions=2)
    half = open_map(partitions=2, shard=[0])
    outside = next(k for k in (f"k{i}" for i in range(100)) if whole.partition_of(k) == 1)
    inside = next(k for k in (f"k{i}" for i in range(100)) if whole.partition_of(k) == 0)
    end = _end(whole)
    with pytest.raises(WrongPartitionError, match=r"partitions \[1\]"):
        half.put_all({inside: 1, outside: 2})
    assert _end(whole) == end
    assert half.put_all({inside: 1}) == 0
    whole.sync()
    assert whole[inside] == 1


def test_batches_after_close_raise_closed_error(open_map: OpenMap) -> None:
    m = open_map()
    m.put_all({"a": 1})
    m.close()
    with pytest.raises(ClosedError):
        m.put_all({"b": 2})
    with pytest.raises(ClosedError):
        m.remove_all(["a"])
    with pytest.raises(ClosedError):
        m["a"]


def test_a_large_batch_makes_a_flush_due(open_map: OpenMap) -> None:
    """A batch counts as its pairs toward the flush period: the data topic gets them
    without further updates."""
    m = open_map(flush_period=100)
    m.put_all({f"k{i}": i for i in range(1000)})
    engine = m._engine
    wait_for(lambda: engine.positions()[0].flushed >= 0, what="a flush after the batch")


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.integers(1, 300), st.one_of(st.none(), st.integers(0, 3000))),
        min_size=1,
        max_size=300,
    ),
    limit=st.integers(4000, 20000),
    prefix=st.sampled_from([b"", b"\x03abc"]),
)
def test_batch_records_keep_order_and_fit_the_record_limit(
    sizes: list[tuple[int, int | None]], limit: int, prefix: bytes
) -> None:
    """write_many_chunks cuts a batch into records whose encoded size, record key included,
    is within the limit, in order, never more than MANY_PAIRS pairs each."""
    keys = [bytes([i % 256]) * n for i, (n, _) in enumerate(sizes)]
    values = [None if v is None else b"v" * v for _, v in sizes]
    chunks = list(write_many_chunks(keys, values, limit - len(prefix)))
    assert [k for ks, _ in chunks for k in ks] == keys
    assert [v for _, vs in chunks for v in vs] == values
    for ks, vs in chunks:
        assert 0 < len(ks) <= MANY_PAIRS
        value = encode_op(OpCode.WRITE_MANY, b"o" * 8, 1 << 40, (ks, vs))
        assert len(prefix + ks[0]) + len(value) <= limit


def test_a_pair_too_large_for_any_record_is_refused_before_any_chunk() -> None:
    with pytest.raises(RecordTooLargeError, match="nothing of the batch was sent"):
        next(write_many_chunks([b"a", b"b"], [b"1", b"x" * 5000], 4000))


class _Shifting(Mapping[str, int]):
    """A mapping whose order changes between two passes, as one that another thread (or
    replica) updates meanwhile may."""

    def __init__(self) -> None:
        self.passes = 0

    def __getitem__(self, key: str) -> int:
        return {"a": 1, "b": 2}[key]

    def __iter__(self) -> Iterator[str]:
        self.passes += 1
        return iter(["a", "b"] if self.passes % 2 else ["b", "a"])

    def __len__(self) -> int:
        return 2


def test_put_all_reads_a_mapping_once(open_map: OpenMap) -> None:
    m = open_map()
    m.put_all(_Shifting())
    assert dict(m) == {"a": 1, "b": 2}


def test_a_blocking_put_all_applies_all_its_records_itself(
    open_map: OpenMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a follower that applies nothing, put_all still returns: the caller applies up to
    the last record it appended in the partition (reads stop at about 1 MiB, so the first
    record alone would leave most of these six unapplied until the timeout)."""
    monkeypatch.setattr(ReplicaFollower, "_handle", lambda self, ready: True)
    m = open_map(value_codec="bytes", timeout=3.0, flush_period=1_000_000)  # no flusher
    pairs = {f"k{i}": bytes([i % 251]) * 1000 for i in range(3000)}
    assert m.put_all(pairs) == 0
    assert len(m) == 3000


class _Watched(ForwardingLog):
    """Notes the ops offsets each thread reads from; ``before_append`` runs before every
    append of the ops topic (another replica's update, say)."""

    def __init__(self, inner: Log) -> None:
        super().__init__(inner)
        self.reads: list[tuple[threading.Thread, int]] = []
        self.before_append: Callable[[], None] = lambda: None

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        timeout: float | None = None,
    ) -> int:
        if topic.endswith("_ops"):
            self.before_append()
        return super().append(topic, partition, records, timeout=timeout)

    def read_batch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> Batch:
        if topic.endswith("_ops"):
            self.reads.append((threading.current_thread(), offset))
        return super().read_batch(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )


def _watched(m: Any) -> _Watched:
    log = m._engine.log
    assert isinstance(log, _Watched)
    return log


@local_logs  # on Kafka a transaction's marker follows the last applied record: read past it
def test_a_blocking_put_all_applies_its_own_records_without_reading_them_back(
    open_map: OpenMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller appended the batch's records: with everything before them applied, it
    applies them as it sent them, with no read of the log. (Followers apply nothing here, so
    every read is the caller's.) Another replica, which decodes them, ends with the same
    contents and its listeners hear the same changes."""
    monkeypatch.setattr(ReplicaFollower, "_handle", lambda self, ready: True)
    m = open_map(log=_Watched, flush_period=1_000_000)  # no flush record in between
    log = _watched(m)
    other = open_map(flush_period=1_000_000)
    heard: list[tuple[Any, Any, Any]] = []
    other.add_listener(lambda k, old, new, mine: heard.append((k, old, new)))
    m.put_all({f"k{i}": i for i in range(10)})
    pairs = {f"k{i}": -i for i in range(5, 6000)}  # several records
    assert m.put_all(pairs) == 5
    assert log.reads == []
    expected = {f"k{i}": i for i in range(5)} | pairs
    assert dict(m) == expected
    other.sync()  # reads and decodes both batches
    assert dict(other) == expected
    assert heard[-len(pairs) :] == [(k, None if i >= 10 else i, -i) for i, k in enumerate(pairs, 5)]


def test_a_blocking_put_all_reads_what_another_replica_appended_before_it(
    open_map: OpenMap,
) -> None:
    """An update of another replica lands between this replica's last applied offset and its
    batch: it is read and applied first (by the caller or the follower), then the batch, and
    the batch counts the key the other replica put."""
    m = open_map(log=_Watched, flush_period=1_000_000)
    log = _watched(m)
    other = open_map()
    m.put_all({"a": 1})

    def put_first() -> None:
        log.before_append = lambda: None
        other.put("b", 2)

    log.before_append = put_first
    log.reads.clear()
    assert m.put_all({"b": 3, "c": 4}) == 1  # "b" was there: the other's put came first
    assert log.reads, "the other replica's update was applied without reading it"
    assert dict(m) == {"a": 1, "b": 3, "c": 4}
    wait_for(lambda: dict(other) == {"a": 1, "b": 3, "c": 4}, what="the other replica caught up")


class _Interleaving(ForwardingLog):
    """A log on which another producer's records may land inside a batch, as on Kafka: the
    first ops append of several records runs ``between`` after its first record."""

    appends_contiguously = False

    def __init__(self, inner: Log) -> None:
        super().__init__(inner)
        self.appends_contiguously = False
        self.between: Callable[[], None] | None = None

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        timeout: float | None = None,
    ) -> int:
        between, self.between = self.between, None
        if between is None or len(records) < 2 or not topic.endswith("_ops"):
            return super().append(topic, partition, records, timeout=timeout)
        first = super().append(topic, partition, records[:1], timeout=timeout)
        between()
        super().append(topic, partition, records[1:], timeout=timeout)
        return first


@local_logs
def test_a_batch_another_update_landed_inside_is_read_back(open_map: OpenMap) -> None:
    """Where the log may store another writer's record inside a batch, the writer does not
    apply the batch from what it sent (that would skip the other record): it reads it back,
    and both replicas end alike, with the other update."""
    m = open_map(log=_Interleaving, flush_period=1_000_000)
    other = open_map(flush_period=1_000_000)
    log = m._engine.log
    assert isinstance(log, _Interleaving)
    log.between = lambda: other.put("inside", -1)
    pairs = {f"k{i}": i for i in range(6000)}  # several records
    assert m.put_all(pairs) == 0
    expected = pairs | {"inside": -1}
    assert dict(m) == expected
    other.sync()
    assert dict(other) == expected
