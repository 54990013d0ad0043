"""Batches of updates applied in bulk: a replica applies a batch of plain puts of distinct keys
in a few passes over the whole batch (``PartitionMachine.apply_puts``) and every other batch record
by record. Both must decide the same: values, the previous values that futures return,
listeners, flushes. Each test runs twice: with every batch offered to the bulk path, and with
none."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from kafkakv.log.base import Record
from kafkakv.map import machine as machine_module
from kafkakv.map.engine import ReplicaEngine
from kafkakv.map.machine import PartitionMachine, Step
from kafkakv.map.ops import OpCode, encode_op
from tests.map.conftest import OpenMap
from tests.map.test_map_protocol import _seed, data_view, read_all
from tests.waiting import wait_for


class BulkCount:
    """What the bulk path did, per engine: batches it applied and batches it handed back."""

    def __init__(self) -> None:
        self.applied: dict[int, int] = {}
        self.refused: dict[int, int] = {}

    def of(self, engine: ReplicaEngine) -> tuple[int, int]:
        key = id(engine.table)  # the machines of one engine share its table
        return self.applied.get(key, 0), self.refused.get(key, 0)


@pytest.fixture(params=["bulk", "record-loop"])
def bulk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[BulkCount]:
    """Offers every batch (``bulk``) or no batch (``record-loop``) to the bulk path."""
    count = BulkCount()
    original = PartitionMachine.apply_puts

    def counted(self: PartitionMachine, records: list[Record], after: int) -> Step | None:
        step = original(self, records, after)
        tally = count.applied if step is not None else count.refused
        tally[id(self.maps)] = tally.get(id(self.maps), 0) + 1
        return step

    monkeypatch.setattr(machine_module, "BULK_MIN", 1 if request.param == "bulk" else 1 << 60)
    monkeypatch.setattr(PartitionMachine, "apply_puts", counted)
    yield count


def test_bulk_and_record_loop_decide_the_same(open_map: OpenMap, bulk: BulkCount) -> None:
    """Rounds of updates of one writer: puts of distinct keys (``PUT`` records that a reader
    catching up applies as one bulk batch), a key put twice, async conditional updates, removes
    and puts (record by record). Every result, every replica's state, a listener's events and
    a change feed's changes match a model applied in submission order. A replica with a feed
    takes the bulk path too (its feed gets a bulk batch's changes as one run), one with a
    listener does not."""
    rng = random.Random(_seed())
    writer = open_map()
    reader = open_map()  # no listener: its catch-up after each round is one batch
    heard: list[tuple[Any, Any, Any]] = []
    listening = open_map()
    listening.add_listener(lambda key, old, new, mine: heard.append((key, old, new)))
    feeding = open_map()
    feed = feeding.changes(timeout=0.5)
    model: dict[str, int] = {}
    changes: list[tuple[Any, Any, Any]] = []

    def put(key: str, value: int) -> int | None:
        old = model.get(key)
        model[key] = value
        if old != value:
            changes.append((key, old, value))
        return old

    keys = [f"k{i}" for i in range(60)]
    for round_no in range(30):
        kind = rng.choice(["distinct", "distinct", "repeated", "mixed"])
        calls: list[tuple[Future[Any], Any]] = []
        if kind == "distinct":  # a PUT record each (put_async would gather them)
            for key in rng.sample(keys, rng.randint(1, 40)):
                value = rng.randrange(4)
                assert writer.put(key, value) == put(key, value)
        elif kind == "repeated":
            twice = rng.choice(keys)
            for i, key in enumerate([*rng.sample(keys, 10), twice, twice]):
                value = round_no * 10 + i
                assert writer.put(key, value) == put(key, value)
        else:
            for key in rng.sample(keys, 12):
                choice = rng.randrange(3)
                if choice == 0:
                    expected = model.get(key) is None
                    calls.append((writer.put_if_absent_async(key, -1), model.get(key)))
                    if expected:
                        put(key, -1)
                elif choice == 1:
                    old = model.pop(key, None)
                    if old is not None:
                        changes.append((key, old, None))
                    calls.append((writer.remove_async(key), old))
                else:
                    calls.append((writer.put_async(key, round_no), put(key, round_no)))
        for future, expected in calls:
            assert future.result(timeout=30) == expected, kind
        reader.sync(timeout=30)
        assert dict(reader) == model, kind
        feeding.sync(timeout=30)  # its catch-up too: one batch per round

    fresh = open_map()  # loads the whole history at once
    for replica in (writer, reader, listening, feeding, fresh):
        replica.sync(timeout=30)
        assert dict(replica) == model
        assert not replica._engine.errors
    assert heard == changes
    with feed:
        assert [(c.key, c.old, c.new) for c in feed] == changes
    if bulk.applied or bulk.refused:  # the "bulk" run: batches took both paths
        for replica in (reader, feeding):
            assert bulk.of(replica._engine)[0] > 0 and bulk.of(replica._engine)[1] > 0
        assert bulk.of(listening._engine) == (0, 0)  # listeners: the record loop
    else:
        assert bulk.of(reader._engine) == (0, 0)


def test_flushes_asked_inside_a_bulk_batch_cover_every_key(
    open_map: OpenMap, bulk: BulkCount
) -> None:
    """A batch crosses several flush marks at once: the flush it asks for, and the one it
    missed while that flush ran, leave every key in the data topic without an explicit flush.

    The batch is 300 of the replica's own ``PUT`` records in one append, at ops offsets 0-299
    (the last one on a mark), as concurrent sync puts of its threads, or an earlier version's
    sender, leave them; the replica's follower applies them. (A tail of puts appended after
    the first flush had read its end offset would cross no mark: the next one is ``covered +
    flush_period``, by design.)"""
    m = open_map(flush_period=10)
    engine = m._engine
    origin, seq, encode = engine.origin, engine.updates.seqs[0], m._values.encode
    own = [
        Record(f"k{i}".encode(), encode_op(OpCode.PUT, origin, next(seq), (encode(i),)))
        for i in range(300)
    ]
    engine.log.append(engine.topics.ops, 0, own)
    log = engine.log
    data, ops = engine.topics.data, engine.topics.ops
    ops_end = log.end_offset(ops, 0)
    assert all(r.key is not None for r in read_all(log, ops, 0)[:300]), "a mark among the puts"

    def flushed_all() -> bool:
        values, points = data_view(read_all(log, data, 0))
        return len(values) == 300 and bool(points)

    wait_for(flushed_all, 60, "a flush of all 300 keys")
    values, points = data_view(read_all(log, data, 0))
    assert max(points) < ops_end
    assert {k.decode(): int(v) for k, v in values.items()} == {f"k{i}": i for i in range(300)}
    fresh = open_map()
    assert dict(fresh) == {f"k{i}": i for i in range(300)}
    if bulk.applied or bulk.refused:
        assert bulk.of(m._engine)[0] > 0
