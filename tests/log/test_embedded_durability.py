"""Settings, reboot recovery of transactional tails, and waiting on a closing log."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from kafkakv.errors import ClosedError, ConfigError
from kafkakv.log import EmbeddedLog, FsyncPolicy, Record
from kafkakv.log.embedded import fs
from kafkakv.log.embedded.head import HeadFile
from tests.waiting import wait_for


@pytest.mark.parametrize("policy", ["always", "interval", "never", FsyncPolicy.ALWAYS])
def test_every_fsync_policy_appends_and_reopens(tmp_path: Path, policy: object) -> None:
    with EmbeddedLog(tmp_path, fsync=policy, background_cleaner=False) as log:  # type: ignore[arg-type]
        log.create_topic("t", 1, {"segment.bytes": 2048})
        for i in range(100):
            log.append("t", 0, [Record(b"k", b"%d" % i)])
        with log.writer("w") as w:
            w.append({("t", 0): [Record(b"k", b"tx")]})
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        assert log.end_offset("t", 0) == 101
        assert log.check() == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fsync": "sometimes"}, "fsync must be"),
        ({"fsync_interval_ms": -1}, "fsync_interval_ms"),
        ({"cleaner_interval_s": 0}, "cleaner_interval_s"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EmbeddedLog(tmp_path, **kwargs)  # type: ignore[arg-type]


def _pretend_reboot(path: Path, topic: str) -> None:
    """Rewrite a head as if it had been written before the machine restarted."""
    head_path = str(path / "topics" / topic / "0" / "head")
    hf = HeadFile(head_path)
    state = hf.read()
    assert state is not None
    hf.publish(state._replace(boot_id=b"\x01" * 16))
    hf.close()


def test_after_a_reboot_committed_transactions_stay_and_abandoned_ones_go(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"plain", b"0")])
        with log.writer("tx") as w:
            w.append({("t", 0): [Record(b"k", b"committed")]})
        # An abandoned transaction: its batch written, the commit point never reached.
        part = log._partition("t", 0)
        with part.locked():
            head = part.prepare_locked(resolve_pending=False)
            from kafkakv.log.embedded.txn import producer_id

            body, count, bts, mts = log._encode(part, [Record(b"k", b"abandoned")])
            part.write_locked(head, body, count, bts, mts, producer=producer_id("tx"))
    _pretend_reboot(tmp_path, "t")
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        assert [r.value for r in log.read("t", 0, 0)] == [b"0", b"committed"]
        assert log.end_offset("t", 0) == 2
        assert log.check() == []


def test_a_non_transactional_tail_survives_a_reboot(tmp_path: Path) -> None:
    with EmbeddedLog(tmp_path, background_cleaner=False, fsync="always") as log:
        log.create_topic("t", 1, {"index.interval.bytes": 100})
        for i in range(40):
            log.append("t", 0, [Record(b"k", b"v%d" % i * 10)])
    _pretend_reboot(tmp_path, "t")
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        assert log.end_offset("t", 0) == 40
        assert log.read("t", 0, 39)[0].value == b"v39" * 10
        assert log.check() == []


def test_wait_raises_when_the_log_is_closed_meanwhile(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path, background_cleaner=False)
    log.create_topic("t", 1)
    threading.Timer(0.1, log.close).start()
    start = time.monotonic()
    with pytest.raises(ClosedError):
        log.wait("t", 0, 0, timeout=30)
    assert time.monotonic() - start < 5


def _count_fdatasyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Record (thread name, file) of every ``fdatasync`` of the log from now on."""
    calls: list[tuple[str, str]] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        calls.append((threading.current_thread().name, os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(fs, "fdatasync", counting)
    return calls


def test_interval_appends_never_wait_for_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_fdatasyncs(monkeypatch)
    with EmbeddedLog(tmp_path, fsync_interval_ms=20, background_cleaner=False) as log:
        log.create_topic("t", 1)
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:  # many intervals' worth of appends
            log.append("t", 0, [Record(b"k", b"v")])
            time.sleep(0.001)
        assert [c for c in calls if c[0] != "kafkakv-flusher"] == []
        assert sum(c[1].endswith(".log") for c in calls) >= 3  # the flusher did sync


def test_a_transaction_commit_syncs_its_batches_under_every_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its batches are on disk before its journal is, whatever the policy: the order that keeps
    a transaction whole through a power loss (the crash-state explorer found it broken)."""
    for policy in ("interval", "never"):
        with EmbeddedLog(
            tmp_path / policy, fsync=policy, fsync_interval_ms=3_600_000, background_cleaner=False
        ) as log:
            log.create_topic("a", 1)
            log.create_topic("b", 1)
            writer = log.writer("w")
            calls = _count_fdatasyncs(monkeypatch)
            writer.append({("a", 0): [Record(b"k", b"1")], ("b", 0): [Record(b"k", b"2")]})
            synced = sorted(c[1].rsplit("/", 3)[-3] for c in calls if c[1].endswith(".log"))
            assert synced == ["a", "b"], calls
            monkeypatch.undo()


def test_interval_data_is_synced_within_about_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_fdatasyncs(monkeypatch)
    with EmbeddedLog(tmp_path, fsync_interval_ms=50, background_cleaner=False) as log:
        log.create_topic("t", 2)
        log.append("t", 1, [Record(b"k", b"v")])
        segment = str(tmp_path / "topics" / "t" / "1" / "00000000000000000000-0.log")
        wait_for(lambda: segment in [f for _, f in calls], 2, "a sync", interval=0.005)
        assert (threading.current_thread().name, segment) not in calls
        assert ("kafkakv-flusher", segment) in calls
        n = len(calls)
        time.sleep(0.2)  # nothing appended since: nothing more to sync
        assert len(calls) == n
        log.append("t", 0, [Record(b"k", b"v")])
    # close() synced what was pending, in the closing thread
    other = str(tmp_path / "topics" / "t" / "0" / "00000000000000000000-0.log")
    assert other in [f for _, f in calls]


def test_interval_zero_syncs_in_the_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_fdatasyncs(monkeypatch)
    with EmbeddedLog(tmp_path, fsync_interval_ms=0, background_cleaner=False) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"k", b"v")])
        assert [t for t, _ in calls] == [threading.current_thread().name]
        assert log._flusher is None


def test_a_failed_background_flush_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with EmbeddedLog(tmp_path, fsync_interval_ms=20, background_cleaner=False) as log:
        log.create_topic("t", 1)

        def failing(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(fs, "fdatasync", failing)
        log.append("t", 0, [Record(b"k", b"v")])  # the append itself does not flush
        wait_for(lambda: log.background_errors, 5, "a background error", interval=0.005)
        assert [e.errno for e in log.background_errors if isinstance(e, OSError)] == [5]
        monkeypatch.undo()


def _read_until_closed(
    log: EmbeddedLog, kind: int, end: int, start: threading.Barrier, wrong: list[BaseException]
) -> None:
    """Read in a loop (sequentially, from the start, or entries) until ClosedError; note any
    other error or a wrong batch in ``wrong``."""
    start.wait()
    position = 0
    try:
        while True:
            if kind == 0:
                records = log.read("t", 0, position, max_records=100)
                assert [r.offset for r in records] == list(range(position, position + len(records)))
                position = (position + len(records)) % end
            elif kind == 1:
                assert len(log.read("t", 0, 0, max_records=2000)) == 2000
            else:
                assert len(log.read_entries("t", 0, position % end, max_records=50))
                position += 37
            os.close(os.open(os.devnull, os.O_RDONLY))  # takes the numbers a close frees
    except ClosedError:
        return
    except BaseException as exc:  # the test reports it
        wrong.append(exc)


def test_reads_in_flight_when_the_log_closes_end_in_their_records_or_closed_error(
    tmp_path: Path,
) -> None:
    """Threads read while another closes the log. Each read returns the records it asked for
    or raises ClosedError: a descriptor closed under a read gave OSError(EBADF), and one reused
    meanwhile by a file opened elsewhere could feed the read another file's bytes."""
    path = tmp_path / "log"
    with EmbeddedLog(path, background_cleaner=False) as log:
        log.create_topic("t", 1, {"segment.bytes": 64 * 1024})
        for _ in range(50):
            log.append("t", 0, [Record(b"k%d" % j, b"v" * 100) for j in range(40)])
    wrong: list[BaseException] = []
    for _ in range(40):
        log = EmbeddedLog(path, background_cleaner=False)
        start = threading.Barrier(5)
        end = log.end_offset("t", 0)
        threads = [
            threading.Thread(target=_read_until_closed, args=(log, k % 3, end, start, wrong))
            for k in range(4)
        ]
        _close_under(log, threads, start, 0.002, wrong)


def test_threads_reading_one_partition_each_get_the_records_they_asked_for(tmp_path: Path) -> None:
    """Sequential readers that stop inside batches, a reader of entries and a reader of the
    whole partition, at once, with the interpreter switching threads as often as it can. A
    read that went on from where another thread's read stopped, without the rows that read
    kept, took the whole batch from its start: asked for 1300, it got 1280 on (a fresh-clone
    run). Bounded: 3 s."""
    path = tmp_path / "log"
    with EmbeddedLog(path, background_cleaner=False) as log:
        log.create_topic("t", 1, {"segment.bytes": 64 * 1024})
        for _ in range(50):  # batches of 40: a read of 100 stops inside one
            log.append("t", 0, [Record(b"k%d" % j, b"v" * 100) for j in range(40)])
    wrong: list[tuple[int, int | None]] = []
    stop = time.monotonic() + 3

    def sequential() -> None:
        position = 0
        while time.monotonic() < stop and not wrong:
            records = log.read("t", 0, position, max_records=100)
            if [r.offset for r in records] != list(range(position, position + len(records))):
                wrong.append((position, records[0].offset))
            position = (position + len(records)) % end

    def whole() -> None:
        while time.monotonic() < stop and not wrong:
            log.read("t", 0, 0, max_records=2000)

    def entries() -> None:
        position = 0
        while time.monotonic() < stop and not wrong:
            log.read_entries("t", 0, position % end, max_records=50)
            position += 37

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with EmbeddedLog(path, background_cleaner=False) as log:
            end = log.end_offset("t", 0)
            threads = [threading.Thread(target=f) for f in (sequential, sequential, whole, entries)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads)
    assert wrong == [], "a read at the first offset got records from the second on"


def _append_until_closed(
    log: EmbeddedLog,
    name: bytes,
    start: threading.Barrier,
    landed: list[tuple[int, bytes]],
    wrong: list[BaseException],
) -> None:
    start.wait()
    try:
        for i in range(1_000_000):
            value = b"%s-%d" % (name, i)
            landed.append((log.append("t", 0, [Record(b"k", value)]), value))
    except ClosedError:
        return
    except BaseException as exc:  # the test reports it
        wrong.append(exc)


def test_appends_racing_the_close_land_or_raise_closed_error(tmp_path: Path) -> None:
    """Threads append while another closes the log. Each append returns its offset, and then
    its record is in the log when it is opened again, or raises ClosedError."""
    path = tmp_path / "log"
    with EmbeddedLog(path, background_cleaner=False) as log:
        log.create_topic("t", 1)
    wrong: list[BaseException] = []
    for round_ in range(30):
        log = EmbeddedLog(path, background_cleaner=False)
        landed: list[tuple[int, bytes]] = []
        start = threading.Barrier(4)
        threads = [
            threading.Thread(
                target=_append_until_closed,
                args=(log, b"%d-%d" % (round_, k), start, landed, wrong),
            )
            for k in range(3)
        ]
        _close_under(log, threads, start, 0.002, wrong)
        with EmbeddedLog(path, background_cleaner=False) as again:
            for offset, value in landed:
                assert again.read("t", 0, offset, max_records=1)[0].value == value


def _close_under(
    log: EmbeddedLog,
    threads: list[threading.Thread],
    start: threading.Barrier,
    after: float,
    wrong: list[BaseException],
) -> None:
    """Start ``threads``, close ``log`` ``after`` seconds into their work, and check that
    every thread ended with nothing wrong and no file of the log left open."""
    for t in threads:
        t.start()
    start.wait()
    time.sleep(after)
    log.close()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert wrong == [], [repr(e) for e in wrong[:5]]
    assert _descriptors_under(log.path) == []


def _descriptors_under(path: str | Path) -> list[str]:
    """The files under ``path`` this process holds open."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith(str(path)):
            found.append(target)
    return found


def test_partitions_first_used_while_the_log_closes_are_not_left_open(tmp_path: Path) -> None:
    """Threads touch partitions for the first time (each opens its files then) while another
    closes the log: each call answers or raises ClosedError, and once close() returned and the
    threads ended, no file of the log is open. A partition opened just after close() released
    the others stayed open, and usable, on the closed log."""
    path = tmp_path / "log"
    with EmbeddedLog(path, background_cleaner=False) as log:
        log.create_topic("t", 64)
    wrong: list[BaseException] = []

    def touch(log: EmbeddedLog, partitions: range, start: threading.Barrier) -> None:
        start.wait()
        try:
            for p in partitions:
                log.end_offset("t", p)
        except ClosedError:
            return
        except BaseException as exc:  # the test reports it
            wrong.append(exc)

    for _ in range(20):
        log = EmbeddedLog(path, background_cleaner=False)
        start = threading.Barrier(4)
        threads = [
            threading.Thread(target=touch, args=(log, range(k, 64, 3), start)) for k in range(3)
        ]
        _close_under(log, threads, start, 0.0005, wrong)
