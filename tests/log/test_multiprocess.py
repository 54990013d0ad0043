"""Many processes on one log directory: appends, wake-ups, compaction, kill -9."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from kafkakv.log import EmbeddedLog, Record

ctx = mp.get_context("spawn")


def _appender(path: str, writer: int, batches: int, size: int) -> None:
    with EmbeddedLog(path, background_cleaner=False) as log:
        for b in range(batches):
            log.append(
                "t", 0, [Record(b"w%d" % writer, b"%d:%d:%d" % (writer, b, i)) for i in range(size)]
            )


def test_concurrent_appends_from_processes_all_land_unbroken(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("t", 1, {"segment.bytes": 32 * 1024})
    writers, batches, size = 4, 150, 7
    procs = [
        ctx.Process(target=_appender, args=(str(tmp_path), w, batches, size))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        records = log.read("t", 0, 0, max_records=10**6, max_bytes=1 << 30)
        assert [r.offset for r in records] == list(range(writers * batches * size))
        # Each batch's records are contiguous and in order: nothing interleaved inside a batch.
        for start in range(0, len(records), size):
            chunk = [r.value.split(b":") for r in records[start : start + size]]  # type: ignore[union-attr]
            assert len({(w, b) for w, b, _ in chunk}) == 1
            assert [int(i) for _, _, i in chunk] == list(range(size))
        # Every writer's batches all arrived, in its own order.
        for w in range(writers):
            mine = [int(r.value.split(b":")[1]) for r in records if r.key == b"w%d" % w]  # type: ignore[union-attr]
            assert mine == [b for b in range(batches) for _ in range(size)]
        assert log.check() == []


def _late_appender(path: str, delay: float) -> None:
    time.sleep(delay)
    with EmbeddedLog(path, background_cleaner=False) as log:
        log.append("t", 0, [Record(b"k", b"%d" % time.monotonic_ns())])


def test_wait_wakes_when_another_process_appends(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("t", 1)
        proc = ctx.Process(target=_late_appender, args=(str(tmp_path), 0.5))
        proc.start()
        try:
            assert log.wait("t", 0, 0, timeout=60) is True
            woke = time.monotonic_ns()
            (record,) = log.read("t", 0, 0)
            assert record.value is not None
            latency_ms = (woke - int(record.value)) / 1e6
            assert latency_ms < 200, f"woke {latency_ms:.1f} ms after the append"
        finally:
            proc.join(30)
        assert proc.exitcode == 0


def _reader(path: str, rounds: int, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    errors = []
    with EmbeddedLog(path, background_cleaner=False) as log:
        for _ in range(rounds):
            try:
                latest: dict[bytes | None, bytes | None] = {}
                for r in log.read("c", 0, 0, max_records=10**6, max_bytes=1 << 30):
                    latest[r.key] = r.value
                if latest.get(b"key-0") is None or len(latest) != 10:
                    errors.append(f"bad view: {len(latest)} keys")
            except Exception as exc:
                errors.append(repr(exc))
    queue.put(errors)


def test_readers_in_other_processes_keep_reading_during_compaction(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": 4096})
        for i in range(3000):
            log.append("c", 0, [Record(b"key-%d" % (i % 10), b"v%d" % i)])
        queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        readers = [ctx.Process(target=_reader, args=(str(tmp_path), 40, queue)) for _ in range(2)]
        for p in readers:
            p.start()
        for round_ in range(5):
            for i in range(300):
                log.append("c", 0, [Record(b"key-%d" % (i % 10), b"r%d-%d" % (round_, i))])
            log.compact("c")
        results = [queue.get(timeout=120) for _ in readers]
        for p in readers:
            p.join(30)
        assert results == [[], []]
        assert log.check() == []


def _crash_writer(path: str, acks: mp.Queue) -> None:  # type: ignore[type-arg]
    with EmbeddedLog(path, background_cleaner=False, fsync="never") as log:
        n = 0
        while True:
            batch = [Record(b"k%d" % (n % 50), b"%d" % (n + i)) for i in range(20)]
            first = log.append("t", 0, batch)
            acks.put((first, len(batch)))
            n += len(batch)


@pytest.mark.parametrize("run", range(3))
def test_kill_9_mid_append_loses_no_acknowledged_batch(tmp_path: Path, run: int) -> None:
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("t", 1, {"segment.bytes": 8192})
    acks: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=_crash_writer, args=(str(tmp_path), acks))
    proc.start()
    acked: list[tuple[int, int]] = [acks.get(timeout=60)]
    time.sleep(0.05 + 0.1 * run)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    while True:
        try:
            acked.append(acks.get(timeout=0.5))
        except Exception:
            break
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        assert log.check() == []
        records = log.read("t", 0, 0, max_records=10**7, max_bytes=1 << 30)
        by_offset = {r.offset: r.value for r in records}
        for first, count in acked:
            for i in range(count):
                assert by_offset[first + i] == b"%d" % (first + i)
        end = log.end_offset("t", 0)
        assert end % 20 == 0 and end >= acked[-1][0] + 20  # whole batches only
        assert [r.offset for r in records] == list(range(end))
        assert log.append("t", 0, [Record(b"k", b"after")]) == end


def _die_between_publishes(path: str) -> None:
    from kafkakv.log.embedded.partition import Partition

    published = []
    real = Partition.publish_locked

    def publish_then_die(self: Partition, head: object, origin: object = None) -> None:
        real(self, head, origin)  # type: ignore[arg-type]
        published.append(1)
        if len(published) == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # after the commit point, one head published

    Partition.publish_locked = publish_then_die  # type: ignore[method-assign]
    with EmbeddedLog(path, background_cleaner=False) as log:
        log.writer("tx").append({("a", 0): [Record(b"k", b"1")], ("b", 0): [Record(b"k", b"2")]})


def _die_before_the_journal(path: str) -> None:
    from kafkakv.log.embedded.txn import TransactionManager

    real = TransactionManager.save

    def save_or_die(self: TransactionManager, journal: object) -> None:
        if getattr(journal, "pending", None):
            os.kill(os.getpid(), signal.SIGKILL)  # batches written, commit point not reached
        real(self, journal)  # type: ignore[arg-type]

    TransactionManager.save = save_or_die  # type: ignore[method-assign]
    with EmbeddedLog(path, background_cleaner=False) as log:
        log.writer("tx").append({("a", 0): [Record(b"k", b"1")], ("b", 0): [Record(b"k", b"2")]})


@pytest.mark.parametrize(
    ("target", "visible"), [(_die_between_publishes, True), (_die_before_the_journal, False)]
)
def test_kill_9_inside_a_transaction_is_all_or_nothing(
    tmp_path: Path, target: object, visible: bool
) -> None:
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("a", 1)
        log.create_topic("b", 1)
    proc = ctx.Process(target=target, args=(str(tmp_path),))  # type: ignore[arg-type]
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        ends = (log.end_offset("a", 0), log.end_offset("b", 0))
        assert ends == ((1, 1) if visible else (0, 0))
        assert log.check() == []
        # Both partitions keep working; a torn transactional tail is cleared by the next append.
        assert log.append("a", 0, [Record(b"k", b"x")]) == ends[0]
        assert log.append("b", 0, [Record(b"k", b"y")]) == ends[1]
        assert [r.value for r in log.read("b", 0, 0)] == ([b"2", b"y"] if visible else [b"y"])


def _first_opener(paths: list[str], start: mp.synchronize.Barrier, out: mp.Queue) -> None:  # type: ignore[type-arg]
    failures = []
    for path in paths:
        start.wait(120)  # every process opens the same fresh path at the same moment
        try:
            EmbeddedLog(path, background_cleaner=False).close()
        except Exception as exc:
            failures.append(f"{path}: {exc!r}")
    out.put(failures)


def test_many_processes_creating_one_log_at_once_all_succeed(tmp_path: Path) -> None:
    processes, rounds = 32, 24
    paths = [str(tmp_path / f"log{i}") for i in range(rounds)]
    os.makedirs(paths[-1])  # the last round: a directory that exists and is empty
    start = ctx.Barrier(processes)
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_first_opener, args=(paths, start, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    failures = [f for _ in procs for f in out.get(timeout=300)]
    for p in procs:
        p.join(30)
    assert failures == []
    for i, path in enumerate(paths):
        assert sorted(os.listdir(path)) == ["kafkakv-log.json", "topics", "txn"]
        with EmbeddedLog(path, background_cleaner=False) as log:
            log.create_topic("t", 1)
            assert log.append("t", 0, [Record(b"k", b"%d" % i)]) == 0
            assert [r.value for r in log.read("t", 0, 0)] == [b"%d" % i]
            assert log.check() == []
