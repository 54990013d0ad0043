"""A linearizable map on the embedded log asks the log for its end offset only when the head
changed (kafkakv.map.reads.PyEndWatch): reads with nothing appended since the last catch-up
make no Python call, and every read still sees every write completed before it, from this
process or another."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def test_a_map_of_several_partitions_catches_up_on_every_read(tmp_path: Path) -> None:
    with kafkakv.connect(tmp_path) as w, kafkakv.connect(tmp_path) as r:
        writer = w.map("m", partitions=2)
        reader = r.map("m", consistency="linearizable")
        assert getattr(reader._engine, "end_watch", None) is None  # it covers one partition
        calls = _counting_catch_up(reader)
        writer["k"] = 1
        assert [reader["k"] for _ in range(3)] == [1, 1, 1] and len(calls) == 3


def _write_and_tell(path: str, n: int, conn: Any) -> None:
    with kafkakv.connect(path) as db:
        m = db.map("m")
        for i in range(n):
            m["k"] = i
            conn.send(i)  # only after the put returned
    conn.close()


def test_every_write_acknowledged_by_another_process_is_seen(tmp_path: Path) -> None:
    n = 300
    with kafkakv.connect(tmp_path) as db:
        reader = db.map("m", consistency="linearizable")
        reader["k"] = -1
        calls = _counting_catch_up(reader)
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_write_and_tell, args=(str(tmp_path), n, theirs))
        child.start()
        theirs.close()
        seen = []
        try:
            for _ in range(n):
                done = ours.recv()
                value = reader["k"]
                assert value >= done, f"read {value} after the write of {done} was acknowledged"
                seen.append(value)
        finally:
            child.join(60)
        assert child.exitcode == 0
        assert seen == sorted(seen)
        # Reads with nothing new skip the log; each write is caught up with at most once.
        assert len(calls) <= n
