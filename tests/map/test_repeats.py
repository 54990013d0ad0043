"""Each update applied at most once, on every log and store, whatever the transport repeats.

A repeat is an ops record written again with the same bytes, as librdkafka's idempotent
producer may write a batch again after it bumps its epoch: in issue 44's run a ``remove`` came
back about a thousand offsets later and erased a later, acknowledged put on every replica.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import kafkakv
from kafkakv.log.base import Record
from kafkakv.map import ReplicaMap
from kafkakv.map.ops import OpCode, decode_op
from tests.map.conftest import OpenMap, log_options


@pytest.fixture
def db(target: str) -> Iterator[kafkakv.Database]:
    """A database of its own on the test's log, to write records as a transport would."""
    with kafkakv.connect(target, **log_options(target)) as database:
        yield database


def _repeat(db: kafkakv.Database, m: ReplicaMap[str, int], code: OpCode) -> int:
    """Append again, byte for byte, the last ops record of ``m``'s partition 0 whose op is
    ``code``; return the offset of the copy."""
    ops = m._engine.topics.ops
    records, position = [], 0
    while batch := db.log.read(ops, 0, position, max_records=1000):
        records.extend(batch)
        position = (batch[-1].offset or 0) + 1
    original = next(
        r for r in reversed(records) if r.key is not None and decode_op(r.value).code is code
    )
    return db.log.append(ops, 0, [Record(original.key, original.value)])


def test_a_repeated_remove_changes_no_replica_also_one_loaded_after_a_flush(
    open_map: OpenMap, db: kafkakv.Database, store_kind: str, tmp_path: Path
) -> None:
    """The defect of issue 44: a remove, a later put of the same key, a flush, then the
    remove's record again. A replica that was following, one resumed from its own store
    (LMDB: it learns the ids from the flush mark), and a fresh one loaded from the data topic
    all keep the put."""
    writer = open_map(partitions=1)
    path = str(tmp_path / "resumed")
    resumed = open_map(partitions=1, store_path=path) if store_kind == "lmdb" else None
    follower = open_map(partitions=1)
    writer["k"] = 1
    assert writer.remove("k") == 1
    writer["k"] = 2
    writer.flush()  # covers all three: the remove's id is in the flushed table
    if resumed is not None:
        resumed.sync()  # applies the flush mark: its store's flush point covers the remove
        resumed.close()
    copy = _repeat(db, writer, OpCode.REMOVE)
    writer.sync()
    follower.sync()
    fresh = open_map(partitions=1)
    replicas = [writer, follower, fresh]
    if resumed is not None:
        replicas.append(open_map(partitions=1, store_path=path))
    for replica in replicas:
        replica.sync()
        assert dict(replica) == {"k": 2}
        assert [e.offset for e in replica.errors() if "applied before" in e.error] == [copy]
        assert replica._engine.positions()[0].applied > copy


def test_a_repeated_put_all_of_another_replica_is_skipped(
    open_map: OpenMap, db: kafkakv.Database
) -> None:
    """A batch record (WRITE_MANY) repeated after later changes of its keys."""
    writer, reader = open_map(partitions=1), open_map(partitions=1)
    writer.put_all({f"k{i}": i for i in range(20)})
    writer.put_all({f"k{i}": -i for i in range(10)})
    writer["k15"] = 150
    _repeat(db, writer, OpCode.WRITE_MANY)  # the second put_all
    del writer["k3"]
    _repeat(db, writer, OpCode.WRITE_MANY)
    expected = {f"k{i}": (-i if i < 10 else i) for i in range(20)} | {"k15": 150}
    del expected["k3"]
    for replica in (writer, reader, open_map(partitions=1)):
        replica.sync()
        assert dict(replica) == expected


def test_a_replicas_numbers_stay_dense_in_each_partition(open_map: OpenMap) -> None:
    """Sync and async updates from several threads, over three partitions: once applied,
    each partition's table holds one range per lane of the writer (updates waited for, and
    those the sender pipelines), no hole (the tables stay small), and nothing was refused."""
    writer = open_map(partitions=3)
    other = open_map(partitions=3)

    def work(t: int) -> None:
        sent = []
        for i in range(60):
            if i % 3:
                sent.append(writer.put_async(f"t{t}-{i}", i))
            else:
                writer[f"t{t}-{i}"] = i
        writer.put_all({f"b{t}-{i}": i for i in range(30)})
        for future in sent:
            future.result(timeout=30)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    other.sync()
    writer.sync()
    origin = writer._engine.origin
    for replica in (writer, other):
        for p, machine in replica._engine.machines.items():
            _, rows = machine.ids.snapshot()
            lanes = sorted((row[0], row[1], row[4]) for row in rows)
            assert lanes == [(origin, p, []), (origin, 3 + p, [])]
    assert not [e for e in other.errors() if "applied before" in e.error]
    missing = {f"t{t}-{i}" for t in range(4) for i in range(60)} - set(other)
    assert not missing, (sorted(missing), other.errors()[:3], set(writer) - set(other))
    assert len(other) == 4 * 90
