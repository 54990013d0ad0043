"""Locks held by a stopped process: readers never wait, writers give up at their timeout."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kafkakv.errors import ConfigError, LockTimeoutError, OperationTimeoutError
from kafkakv.log import EmbeddedLog, Record
from kafkakv.log.embedded.cleaner import _clean_lock
from kafkakv.log.embedded.flock import lock_holder
from tests.locks import held, is_held, wait_until_held
from tests.threads import inside_in_another_thread

ctx = mp.get_context("spawn")


@pytest.fixture
def hold() -> Iterator[Callable[[str], int]]:
    """``hold(path)`` has util-linux ``flock`` take ``path`` until the test ends; returns its pid."""
    with contextlib.ExitStack() as stack:
        yield lambda path: stack.enter_context(held(path))


def _filled(path: Path) -> EmbeddedLog:
    log = EmbeddedLog(path, background_cleaner=False)
    log.create_topic("t", 2)
    log.create_topic("c", 1, {"cleanup.policy": "compact"})
    for i in range(10):
        log.append("t", 0, [Record(b"k", b"%d" % i)])
    with log.writer("tx") as w:  # leaves a journal that every later open looks at
        w.append({("t", 0): [Record(b"k", b"tx")], ("t", 1): [Record(b"k", b"tx")]})
    return log


def _lock_of(path: Path, topic: str, partition: int) -> str:
    return str(path / "topics" / topic / str(partition) / "lock")


def _stopped_writer(path: str) -> None:
    """Take partition t-0's lock as an append does, then stop (as under a debugger)."""
    log = EmbeddedLog(path, background_cleaner=False)
    with log._partition("t", 0).locked():
        os.kill(os.getpid(), signal.SIGSTOP)


def test_a_writer_stopped_holding_the_lock_blocks_no_reader(tmp_path: Path) -> None:
    _filled(tmp_path).close()
    writer = ctx.Process(target=_stopped_writer, args=(str(tmp_path),))
    writer.start()
    try:
        wait_until_held(_lock_of(tmp_path, "t", 0))
        started = time.monotonic()
        # A fresh log object: first use of every partition, as in a newly started process.
        with EmbeddedLog(tmp_path, background_cleaner=False) as log:
            assert [r.value for r in log.read("t", 0, 0)][-2:] == [b"9", b"tx"]
            assert log.read_entries("t", 0, 0).next_offset == 11
            assert (log.start_offset("t", 0), log.end_offset("t", 0)) == (0, 11)
            assert log.wait("t", 0, 10, timeout=1) is True
            assert log.wait_any({("t", 0): 11, ("t", 1): 0}, timeout=1) == {("t", 1)}
            assert log.append("t", 1, [Record(b"k", b"other partition")]) == 1
        elapsed = time.monotonic() - started
        assert elapsed < 5, f"reads waited {elapsed:.1f} s for the stopped writer's lock"
        assert is_held(_lock_of(tmp_path, "t", 0)), "the writer lost its lock meanwhile"
    finally:
        writer.kill()
        writer.join(30)


def test_an_append_gives_up_at_its_timeout_naming_the_lock_and_its_holder(
    tmp_path: Path,
) -> None:
    _filled(tmp_path).close()
    writer = ctx.Process(target=_stopped_writer, args=(str(tmp_path),))
    writer.start()
    try:
        lock = _lock_of(tmp_path, "t", 0)
        wait_until_held(lock)
        with EmbeddedLog(tmp_path, background_cleaner=False) as log:
            started = time.monotonic()
            with pytest.raises(LockTimeoutError) as caught:
                log.append("t", 0, [Record(b"k", b"late")], timeout=0.5)
            elapsed = time.monotonic() - started
            assert 0.5 <= elapsed < 2.0
            assert isinstance(caught.value, OperationTimeoutError)
            assert caught.value.path == lock
            assert caught.value.pid == writer.pid
            assert lock in str(caught.value) and f"process {writer.pid}" in str(caught.value)
            assert log.end_offset("t", 0) == 11  # nothing appended
    finally:
        writer.kill()
        writer.join(30)
    with EmbeddedLog(tmp_path, background_cleaner=False) as log:
        assert log.append("t", 0, [Record(b"k", b"after")], timeout=0.5) == 11
        assert log.check() == []


Call = Callable[[EmbeddedLog], object]
_CALLS: dict[str, tuple[str, Call]] = {
    "append": ("topics/t/0/lock", lambda log: log.append("t", 0, [Record(b"k", b"v")])),
    "send": ("topics/t/0/lock", lambda log: log.send("t", 0, [Record(b"k", b"v")])),
    "transaction": (
        "topics/t/1/lock",
        lambda log: log.writer("other").append(
            {("t", 0): [Record(b"k", b"v")], ("t", 1): [Record(b"k", b"v")]}
        ),
    ),
    "writer": ("txn/*.lock", lambda log: log.writer("tx")),
    "compact": ("topics/c/0/clean.lock", lambda log: log.compact("c")),
    "compact (write lock)": ("topics/c/0/lock", lambda log: log.compact("c")),
    "enforce_retention": ("topics/t/0/lock", lambda log: log.enforce_retention("t")),
    "check": ("topics/t/1/lock", lambda log: log.check()),
}


@pytest.mark.parametrize("name", list(_CALLS))
def test_every_lock_wait_ends_at_the_logs_lock_timeout(
    tmp_path: Path, hold: Callable[[str], int], name: str
) -> None:
    _filled(tmp_path).close()
    where, call = _CALLS[name]
    (lock,) = tmp_path.glob(where) if "*" in where else [tmp_path / where]
    pid = hold(str(lock))
    with EmbeddedLog(tmp_path, background_cleaner=False, lock_timeout=0.3) as log:
        started = time.monotonic()
        with pytest.raises(LockTimeoutError) as caught:
            call(log)
        assert 0.3 <= time.monotonic() - started < 1.5
        assert (caught.value.path, caught.value.pid) == (str(lock), pid)


def test_a_per_call_timeout_overrides_the_logs(tmp_path: Path, hold: Callable[[str], int]) -> None:
    _filled(tmp_path).close()
    hold(_lock_of(tmp_path, "t", 0))
    hold(str(next((tmp_path / "txn").glob("*.lock"))))
    with EmbeddedLog(tmp_path, background_cleaner=False, lock_timeout=60) as log:
        for call in (
            lambda: log.append("t", 0, [Record(b"k", b"v")], timeout=0.2),
            lambda: log.send("t", 0, [Record(b"k", b"v")], timeout=0.2),
            lambda: log.writer("other").append({("t", 0): [Record(b"k", b"v")]}, timeout=0.2),
            lambda: log.writer("tx", timeout=0.2),
            lambda: log.append("t", 0, [Record(b"k", b"v")], timeout=-1),  # past: tries once
        ):
            started = time.monotonic()
            with pytest.raises(LockTimeoutError):
                call()
            assert time.monotonic() - started < 1.5


def test_another_thread_holding_the_lock_is_named_too(tmp_path: Path) -> None:
    with _filled(tmp_path) as log:
        part = log._partition("t", 0)
        with inside_in_another_thread(part.locked):
            with pytest.raises(LockTimeoutError, match="another thread of this process") as caught:
                log.append("t", 0, [Record(b"k", b"v")], timeout=0.2)
            assert caught.value.pid == os.getpid()
        assert log.append("t", 0, [Record(b"k", b"v")], timeout=0.2) == 11


def test_a_thread_queued_behind_another_process_names_that_process(
    tmp_path: Path, hold: Callable[[str], int]
) -> None:
    with _filled(tmp_path) as log:
        pid = hold(_lock_of(tmp_path, "t", 0))
        queued = threading.Thread(target=lambda: _suppress_timeout(log, 5.0))
        queued.start()
        try:
            time.sleep(0.2)  # the thread holds the thread lock, polling the file lock
            with pytest.raises(LockTimeoutError, match=f"process {pid}") as caught:
                log.append("t", 0, [Record(b"k", b"v")], timeout=0.2)
            assert caught.value.pid == pid
        finally:
            queued.join(30)


def _suppress_timeout(log: EmbeddedLog, timeout: float) -> None:
    with contextlib.suppress(LockTimeoutError):
        log.append("t", 0, [Record(b"k", b"v")], timeout=timeout)


def test_lock_holder_reads_proc_locks(tmp_path: Path, hold: Callable[[str], int]) -> None:
    lock = str(tmp_path / "lock")
    assert lock_holder(lock) is None  # missing file
    open(lock, "wb").close()
    assert lock_holder(lock) is None  # nobody holds it
    pid = hold(lock)
    assert lock_holder(lock) == pid


@pytest.mark.parametrize("value", [-1, float("nan"), "30", True])
def test_a_bad_lock_timeout_is_refused(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError, match="lock_timeout"):
        EmbeddedLog(tmp_path, lock_timeout=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("which", ["partition", "transactional id", "cleaner"])
def test_a_lock_released_while_a_forked_child_lives_is_free(tmp_path: Path, which: str) -> None:
    """A child forked while a lock is held shares the locked open file: the lock must still be
    free once the parent releases it (closing the parent's descriptor alone did not free it,
    and a map's flush waited on it for as long as the child lived)."""
    log = _filled(tmp_path)
    part = log._partition("c", 0)
    far = time.monotonic() + 10
    locks: dict[str, tuple[Callable[[], contextlib.AbstractContextManager[object]], str]] = {
        "partition": (part.locked, part.lock_path),
        "transactional id": (lambda: log._txn.id_lock("tx", far), log._txn._stem("tx") + ".lock"),
        "cleaner": (
            lambda: _clean_lock(part, block=True, deadline=far),
            os.path.join(part.dir, "clean.lock"),
        ),
    }
    take, path = locks[which]
    with take():
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child only keeps the descriptors open
            time.sleep(20)
            os._exit(0)
    try:
        assert not is_held(path), f"{path} stays held while the forked child lives"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        log.close()
