"""The embedded log's compiled steady-state append (``frame.append_plain``, called from
``Partition.append``): it writes what the Python path writes, byte for byte, declines to the
Python path whenever there is more to do than the steady state, and leaves nothing behind
when a write fails."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from kafkakv.errors import LockTimeoutError
from kafkakv.log import EmbeddedLog, Record
from kafkakv.log.embedded import frame, fs, partition
from kafkakv.log.embedded.head import HEAD_SIZE, unpack_head
from tests.leaks import growth

pytestmark = pytest.mark.skipif(
    not frame.COMPILED, reason="the C module is not built (or KAFKAKV_PURE_PYTHON=1)"
)


def _batches(seed: int) -> list[list[Record]]:
    """Batches of plain records of mixed sizes, timestamps given (the bytes are then the same
    from run to run)."""
    rng = random.Random(seed)
    out = []
    for i in range(400):
        n = rng.choice([1, 1, 1, 2, 5, 40])
        size = rng.choice([0, 10, 100, 100, 700, 3000])
        out.append(
            [
                Record(b"k%d" % rng.randrange(50), rng.randbytes(size), (), 1_700_000_000_000 + i)
                for _ in range(n)
            ]
        )
    return out


def _files(topic_dir: Path) -> dict[str, bytes]:
    """The segment and index files of a partition, by name."""
    return {
        p.name: p.read_bytes()
        for p in sorted((topic_dir / "0").iterdir())
        if p.suffix in (".log", ".index")
    }


@pytest.mark.parametrize("fsync", ["interval", "always", "never"])
@pytest.mark.parametrize(
    "config",
    [
        # rolls (where the C code declines) and index entries often
        {"segment.bytes": 64 * 1024, "index.interval.bytes": 2048},
        # long runs of the C code alone, past the space fsync=always preallocates at a time
        {"segment.bytes": 8 << 20, "index.interval.bytes": 1 << 30},
    ],
    ids=["small-segments", "long-runs"],
)
def test_the_compiled_append_writes_what_the_python_path_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: str, config: dict[str, int]
) -> None:
    """The same batches through both paths: the same offsets, the same segment and index
    bytes (preallocated zeros too), the same published head."""
    taken: Counter[str] = Counter()
    steady = partition.Partition._append_steady

    def counted(self: partition.Partition, *args: object) -> int | None:
        first = steady(self, *args)  # type: ignore[arg-type]
        taken["compiled" if first is not None else "declined"] += 1
        return first

    monkeypatch.setattr(partition.Partition, "_append_steady", counted)
    results = {}
    for path in ("compiled", "python"):
        if path == "python":
            monkeypatch.setattr(partition, "append_plain", None)
        directory = tmp_path / path
        with EmbeddedLog(str(directory), fsync=fsync, background_cleaner=False) as log:
            log.create_topic("t", 1, config)
            offsets = [log.append("t", 0, batch) for batch in _batches(7)]
            head = log._partition("t", 0).published()
        results[path] = (offsets, _files(directory / "topics" / "t"), head[:7])
    assert taken["compiled"] > 200, taken  # the steady state was the usual case
    if config["segment.bytes"] < 1 << 20:
        assert taken["declined"] > 10, taken  # and the Python path had its share
        assert len(results["compiled"][1]) > 4  # rolls
    compiled, python = results["compiled"], results["python"]
    assert compiled[0] == python[0]
    assert compiled[1].keys() == python[1].keys()
    for name, data in compiled[1].items():
        assert data == python[1][name], f"{name} differs"
    assert compiled[2] == python[2]


def test_index_entries_fall_where_the_python_path_puts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of one size, an index interval of exactly three of them: an entry is due when
    the distance reaches the interval, not only past it."""
    record = [Record(b"k" * 16, b"v" * 100, (), 1_700_000_000_000)]
    indexes = []
    for path in ("compiled", "python"):
        if path == "python":
            monkeypatch.setattr(partition, "append_plain", None)
        directory = tmp_path / path
        with EmbeddedLog(str(directory), background_cleaner=False) as log:
            log.create_topic("probe", 1)
            log.append("probe", 0, record)
            size = log._partition("probe", 0).published().active_pos  # one batch
            log.create_topic("t", 1, {"index.interval.bytes": 3 * size})
            for _ in range(40):
                log.append("t", 0, record)
        index = _files(directory / "topics" / "t")
        indexes.append({name: data for name, data in index.items() if name.endswith(".index")})
    assert indexes[0] == indexes[1]
    (entries,) = indexes[0].values()
    assert len(entries) == 8 * 13  # at batches 3, 6, ..., 39


@pytest.mark.parametrize(
    ("fsync", "interval_ms", "marked"),
    [("interval", 600_000, True), ("interval", 0, False), ("always", 1000, False)],
)
def test_the_compiled_append_leaves_the_sync_to_the_flusher_as_the_policy_says(
    tmp_path: Path, fsync: str, interval_ms: int, marked: bool
) -> None:
    """Under ``fsync=interval`` an append marks the partition for the flusher (which syncs
    it within the interval); where every append syncs itself, nothing is left to mark."""
    with EmbeddedLog(
        str(tmp_path / "log"), fsync=fsync, fsync_interval_ms=interval_ms, background_cleaner=False
    ) as log:
        log.create_topic("t", 1, {"index.interval.bytes": 1 << 30})
        log.append("t", 0, [Record(b"k", b"v")])  # the Python path
        part = log._partition("t", 0)
        part.sync_pending()
        assert not part._unsynced
        assert part._steady is not None  # so this append is the compiled one
        assert log.append("t", 0, [Record(b"k", b"w")]) == 1
        assert part._unsynced is marked
        assert part.sync_pending() is marked


def test_the_compiled_append_publishes_a_head_every_reader_takes(tmp_path: Path) -> None:
    """The head it writes is the one it returns, and the one a second log (another set of
    descriptors, as another process has) reads and appends after."""
    with (
        EmbeddedLog(str(tmp_path / "log"), background_cleaner=False) as one,
        EmbeddedLog(str(tmp_path / "log"), background_cleaner=False) as two,
    ):
        one.create_topic("t", 1)
        for i in range(300):
            writer = (one, two)[i % 3 == 0]
            assert writer.append("t", 0, [Record(b"k", b"%d" % i)]) == i
        part = one._partition("t", 0)
        raw = (tmp_path / "log" / "topics" / "t" / "0" / "head").read_bytes()[:HEAD_SIZE]
        assert unpack_head(raw) == part.published() == two._partition("t", 0).published()
        assert [r.value for r in two.read("t", 0, 0, max_records=1000)] == [
            b"%d" % i for i in range(300)
        ]


def test_a_lock_held_elsewhere_waits_on_the_python_path_and_times_out(tmp_path: Path) -> None:
    with EmbeddedLog(str(tmp_path / "log"), background_cleaner=False) as log:
        log.create_topic("t", 1)
        log.append("t", 0, [Record(b"k", b"v")])  # the steady state is known from here on
        lock = tmp_path / "log" / "topics" / "t" / "0" / "lock"
        fd = os.open(lock, os.O_RDWR)  # another open file: its flock conflicts with the log's
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            start = time.monotonic()
            with pytest.raises(LockTimeoutError):
                log.append("t", 0, [Record(b"k", b"w")], timeout=0.3)
            assert 0.25 < time.monotonic() - start < 5
        finally:
            os.close(fd)
        assert log.append("t", 0, [Record(b"k", b"x")], timeout=5) == 1
        assert [r.value for r in log.read("t", 0, 0)] == [b"v", b"x"]


def test_a_tail_after_the_published_end_is_cut_before_the_next_batch(tmp_path: Path) -> None:
    """A dead writer's bytes after the published end: the C code declines, the Python path
    cuts them, and the steady state goes on after."""
    with EmbeddedLog(str(tmp_path / "log"), background_cleaner=False) as log:
        log.create_topic("t", 1)
        for i in range(3):
            log.append("t", 0, [Record(b"k", b"%d" % i)])
        part = log._partition("t", 0)
        end = part.published().active_pos
        segment = next((tmp_path / "log" / "topics" / "t" / "0").glob("*.log"))
        with open(segment, "r+b") as f:
            f.seek(end)
            f.write(b"\x07" * 500)  # not zeros: a batch begun and never published
        for i in range(3, 6):
            log.append("t", 0, [Record(b"k", b"%d" % i)])
        assert [r.value for r in log.read("t", 0, 0)] == [b"%d" % i for i in range(6)]
        assert segment.stat().st_size == part.published().active_pos


@pytest.mark.parametrize("fsync", ["interval", "always"])
def test_a_write_that_fails_is_cut_off_and_the_log_goes_on(tmp_path: Path, fsync: str) -> None:
    """A file size limit (RLIMIT_FSIZE) stops a batch part way: the append raises LogIOError
    from the compiled path, the partial batch is cut off, nothing is published, and the next
    append (the limit lifted) lands right after the last good batch; under fsync=always the
    segment is preallocated again after the cut."""
    script = textwrap.dedent(
        """
        import glob, os, resource, signal
        from kafkakv.errors import LogIOError
        from kafkakv.log import EmbeddedLog, Record
        from kafkakv.log.embedded import partition

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error return instead of a kill
        failed = []
        steady = partition.Partition._append_steady

        def watched(self, *args):
            try:
                return steady(self, *args)
            except LogIOError as exc:
                failed.append(exc)
                raise

        partition.Partition._append_steady = watched
        with EmbeddedLog(DIR, fsync=FSYNC, background_cleaner=False) as log:
            log.create_topic("t", 1, {"index.interval.bytes": 1 << 20})
            for i in range(5):
                log.append("t", 0, [Record(b"k", b"%d" % i)])
            part = log._partition("t", 0)
            end = part.published().active_pos
            limit = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (end + 100, limit[1]))
            try:
                log.append("t", 0, [Record(b"k", b"x" * 5000)])
            except LogIOError:
                pass
            else:
                raise SystemExit("the append past the limit did not fail")
            resource.setrlimit(resource.RLIMIT_FSIZE, limit)
            assert len(failed) == 1, failed  # raised by the compiled path
            (segment,) = glob.glob(part.dir + "/*.log")
            assert os.path.getsize(segment) == end, "not cut off"
            assert part.published().active_pos == end and log.end_offset("t", 0) == 5
            assert log.append("t", 0, [Record(b"k", b"5")]) == 5
            if FSYNC == "always":  # preallocated again, not grown write by write
                assert os.path.getsize(segment) > end + 4096, os.path.getsize(segment)
            print([r.value for r in log.read("t", 0, 0)])
        """
    ).replace("DIR", repr(str(tmp_path / "log")))
    script = script.replace("FSYNC", repr(fsync))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.strip() == str([b"%d" % i for i in range(6)])


def test_the_compiled_append_leaks_no_memory_and_no_references(tmp_path: Path) -> None:
    with EmbeddedLog(str(tmp_path / "log"), background_cleaner=False) as log:
        log.create_topic("t", 1, {"index.interval.bytes": 1 << 30})
        records = [Record(b"k" * 16, b"v" * 100)]
        log.append("t", 0, records)
        part = log._partition("t", 0)
        head = part._head

        def work() -> None:
            for _ in range(3_000):
                log.append("t", 0, records)
            with contextlib.suppress(TypeError):
                frame.append_plain()  # type: ignore[misc]

        found = growth(work, (records[0].key, records[0].value, head._mm, None))
        assert found.allocated < 64 * 1024, f"{found.allocated} bytes still allocated"
        assert found.refs_after[:3] == found.refs_before[:3]
        assert abs(found.refs_after[3] - found.refs_before[3]) < 100


# What each of fs's functions writes or syncs on an append's Python path: the batch (with
# pwritev, header and body side by side, and its fdatasync) and the head (with pwrite).
_APPEND_TOUCHES = {"pwritev": "batch", "pwrite": "head", "fdatasync": "batch"}


@pytest.mark.parametrize("name", sorted(_APPEND_TOUCHES))
def test_a_recorder_of_the_writes_sees_every_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Tests that rebind ``fs``'s functions (the crash-state explorer's recorder) must see
    every write: with any of them rebound, appends take the Python path, which calls them."""
    calls: Counter[int] = Counter()
    real = getattr(fs, name)

    def recorded(fd: int, *args: object) -> object:
        calls[fd] += 1
        return real(fd, *args)

    with EmbeddedLog(str(tmp_path / "log"), fsync="always", background_cleaner=False) as log:
        log.create_topic("t", 1, {"index.interval.bytes": 1 << 30})
        log.append("t", 0, [Record(b"k", b"v")])
        part = log._partition("t", 0)
        assert part._steady is not None
        monkeypatch.setattr(fs, name, recorded)
        for i in range(10):
            log.append("t", 0, [Record(b"k", b"%d" % i)])
        fd = {"batch": part._wfd, "head": part._head._fd}[_APPEND_TOUCHES[name]]
        assert calls[fd] == 10, f"{name} on the {_APPEND_TOUCHES[name]}: {dict(calls)}"
        assert sum(calls.values()) == 10


_COUNTING_SYNC = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
static int calls;
int fdatasync(int fd)
{
    static int (*real)(int);
    if (!real) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    }
    calls++;
    return real(fd);
}
int fdatasync_calls(void) { return calls; }
"""


@pytest.mark.parametrize(("fsync", "syncs"), [("always", 10), ("interval", 0)])
def test_the_compiled_append_syncs_as_the_policy_says(
    tmp_path: Path, fsync: str, syncs: int
) -> None:
    """Counted at the C library (a preloaded ``fdatasync`` that counts its calls): under
    ``always`` each compiled append syncs the segment once; under ``interval`` it leaves the
    sync to the flusher."""
    shim = tmp_path / "counting_sync.so"
    source = tmp_path / "counting_sync.c"
    source.write_text(_COUNTING_SYNC)
    built = subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(shim), str(source), "-ldl"],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, f"cannot build the counting shim with gcc: {built.stderr}"
    script = textwrap.dedent(
        """
        import ctypes
        from kafkakv.log import EmbeddedLog, Record
        from kafkakv.log.embedded import partition

        steady = partition.Partition._append_steady
        compiled = []

        def watched(self, *args):
            first = steady(self, *args)
            compiled.append(first is not None)
            return first

        partition.Partition._append_steady = watched
        calls = ctypes.CDLL(SHIM).fdatasync_calls
        with EmbeddedLog(DIR, fsync=FSYNC, fsync_interval_ms=600_000,
                         background_cleaner=False) as log:
            log.create_topic("t", 1)
            log.append("t", 0, [Record(b"k", b"v")])  # the Python path, once
            before = calls()
            for i in range(10):
                log.append("t", 0, [Record(b"k", b"%d" % i)])
            print(calls() - before, compiled == [True] * 10)
        """
    )
    script = (
        script.replace("SHIM", repr(str(shim)))
        .replace("DIR", repr(str(tmp_path / "log")))
        .replace("FSYNC", repr(fsync))
    )
    env = dict(os.environ, LD_PRELOAD=str(shim))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.split() == [str(syncs), "True"]
