"""A linearizable map on the embedded log asks the log for its end offset only when the head
changed (kafkakv.map.reads.PyEndWatch): reads with nothing appended since the last catch-up
make no Python call, and every read still sees every write completed before it, from this
process or another."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kafkakv
from kafkakv.map.replica import ReplicaMap


def _counting_catch_up(m: ReplicaMap[Any, Any]) -> list[bytes]:
    """Record every catch-up of ``m``'s reads (the field its read path calls)."""
    calls: list[bytes] = []
    catch_up: Callable[[bytes], None] = m._catch_up  # type: ignore[assignment]

    def counted(record_key: bytes) -> None:
        calls.append(record_key)
        catch_up(record_key)

    m._catch_up = counted
    return calls


def test_reads_with_nothing_appended_do_not_catch_up(tmp_path: Path) -> None:
    with kafkakv.connect(tmp_path) as w, kafkakv.connect(tmp_path) as r:
        writer = w.map("m")
        reader = r.map("m", consistency="linearizable")
        calls = _counting_catch_up(reader)
        for i in range(5):
            writer["k"] = i
            assert reader["k"] == i  # the head moved: this read catches up
            for _ in range(100):
                assert reader["k"] == i and reader.get("k") == i and "k" in reader
            assert len(calls) == i + 1, f"{len(calls)} catch-ups for {i + 1} appends"
        writer.remove("k")
        assert "k" not in reader and len(calls) == 6


def test_a_map_of_several_partitions_catches_up_only_after_an_append(tmp_path: Path) -> None:
    with kafkakv.connect(tmp_path) as w, kafkakv.connect(tmp_path) as r:
        writer = w.map("m", partitions=4)
        reader = r.map("m", consistency="linearizable")
        engine = reader._engine
        keys = [f"k{i}" for i in range(40)]
        by_partition = {reader.partition_of(k): k for k in keys}
        assert sorted(by_partition) == [0, 1, 2, 3]
        for k in by_partition.values():
            writer[k] = -1
        calls = _counting_catch_up(reader)
        for round_ in range(3):
            for p, k in sorted(by_partition.items()):
                writer[k] = round_
                # The partition written moved: the next read catches up (its own partition,
                # or another's, which leaves the moved one stale), then sees the write.
                before = len(calls)
                assert reader[k] == round_
                assert len(calls) == before + 1
                for other in by_partition.values():  # every partition caught up once
                    reader.get(other)
                settled = len(calls)
                for _ in range(50):  # nothing appended: no read catches up
                    assert reader[k] == round_ and k in reader
                    assert all(reader.get(o) is not None for o in by_partition.values())
                assert len(calls) == settled, f"partition {p}, round {round_}"
        assert engine.end_watches is not None and len(engine.end_watches) == 4


def test_a_shard_of_a_map_has_no_end_watches(tmp_path: Path) -> None:
    with kafkakv.connect(tmp_path) as w, kafkakv.connect(tmp_path) as r:
        w.map("m", partitions=4)["k"] = 1
        shard = r.map("m", consistency="linearizable", shard=[0, 1])
        assert shard._engine.end_watches is None  # reads take the checked path
        whole = w.map("m", barriers="shared", consistency="linearizable")
        assert whole._engine.end_watches is None  # a barrier is a record: nothing to watch


_KEYS = [f"k{i}" for i in range(8)]


def _write_and_tell(path: str, n: int, partitions: int, conn: Any) -> None:
    with kafkakv.connect(path) as db:
        m = db.map("m", partitions=partitions)
        for i in range(n):
            m[_KEYS[i % len(_KEYS)]] = i
            conn.send(i)  # only after the put returned
    conn.close()


@pytest.mark.parametrize("partitions", [1, 4])
def test_every_write_acknowledged_by_another_process_is_seen(
    tmp_path: Path, partitions: int
) -> None:
    n = 300
    with kafkakv.connect(tmp_path) as db:
        reader = db.map("m", consistency="linearizable", partitions=partitions)
        for k in _KEYS:
            reader[k] = -1
        calls = _counting_catch_up(reader)
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_write_and_tell, args=(str(tmp_path), n, partitions, theirs))
        child.start()
        theirs.close()
        seen: dict[str, list[int]] = {k: [] for k in _KEYS}
        try:
            for _ in range(n):
                done = ours.recv()
                k = _KEYS[done % len(_KEYS)]
                value = reader[k]
                assert value >= done, f"read {value} after the write of {done} was acknowledged"
                seen[k].append(value)
                for j, other in enumerate(_KEYS):  # every key, whichever its partition
                    last = done - (done - j) % len(_KEYS) if done >= j else -1
                    assert reader[other] >= last, f"{other} read before its write {last}"
        finally:
            child.join(60)
        assert child.exitcode == 0
        assert all(values == sorted(values) for values in seen.values())
        # The writer goes on while the reader reads, so how many reads found nothing new
        # varies; the tests above count the catch-ups where nothing runs alongside.
        assert 0 < len(calls) <= (len(_KEYS) + 1) * n
