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
    """Rounds of async updates of one writer: distinct puts (a bulk batch), a key put twice,
    conditional updates and removes (record by record). Every future's result, every replica's
    state and a listener's events match a model applied in submission order."""
    rng = random.Random(_seed())
    writer = open_map()
    heard: list[tuple[Any, Any, Any]] = []
    listening = open_map()
    listening.add_listener(lambda key, old, new, mine: heard.append((key, old, new)))
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
        if kind == "distinct":
            for key in rng.sample(keys, rng.randint(1, 40)):
                value = rng.randrange(4)
                calls.append((writer.put_async(key, value), put(key, value)))
        elif kind == "repeated":
            twice = rng.choice(keys)
            for key in [*rng.sample(keys, 10), twice, twice]:
                value = round_no * 10 + len(calls)
                calls.append((writer.put_async(key, value), put(key, value)))
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

    fresh = open_map()  # loads the whole history at once
    for replica in (writer, listening, fresh):
        replica.sync(timeout=30)
        assert dict(replica) == model
        assert not replica._engine.errors
    assert heard == changes
    if bulk.applied or bulk.refused:  # the "bulk" run: batches took both paths
        assert bulk.of(writer._engine)[0] > 0 and sum(bulk.refused.values()) > 0
        assert bulk.of(listening._engine) == (0, 0)  # listeners: the record loop
    else:
        assert bulk.of(writer._engine) == (0, 0)


def test_flushes_asked_inside_a_bulk_batch_cover_every_key(
    open_map: OpenMap, bulk: BulkCount
) -> None:
    """A batch crosses several flush marks at once: the flush it asks for, and the one it
    missed while that flush ran, leave every key in the data topic without an explicit flush.

    The 300 puts must reach the log in one append, at ops offsets 0-299 (the last one on a
    mark). Left to the sender they sometimes did not: under load the main thread lost the GIL
    in the middle of its puts and the sender appended what it had. A tail of up to 8 puts
    appended after the first flush had read its end offset then crossed no mark (the next
    one is ``covered + flush_period``, by design), so the wait below timed out; a longer tail
    was flushed by a second flush covering the first one's FLUSHED mark, past ``ops_end``.
    The test holds the sender's condition (which the sender takes before it looks at its
    outbox) while it queues the puts, so the sender appends all 300 at once."""
    m = open_map(flush_period=10)
    engine = m._engine
    with engine._sender.ready:
        futures = [m.put_async(f"k{i}", i) for i in range(300)]
    for future in futures:
        future.result(timeout=30)
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
