"""Benchmark of the embedded log, each measurement next to a baseline taken in the same run.

Command (from the project root)::

    .venv/bin/python benchmarks/bench_log.py [--quick] [--only append,read,visibility,compaction]
                                            [--dir DIR]

``--quick`` shrinks every workload (for a smoke test or a profile); ``--only`` picks some of the
four measurements; ``--dir`` sets where the scratch directory is created (default: the system
temporary directory; it must be on the disk you want to measure). The script prints the
machine, two markdown tables and, as its last line, one JSON object with every number.

Workload: records with 16-byte keys and 100-byte values.

1. ``append``: batched appends from one process (records/s) under ``fsync=never``,
   ``fsync=interval`` and, with bigger batches, ``fsync=always``. Baseline: a plain sequential
   ``write`` of the same bytes in chunks of the same size as the stored batches (plus one
   ``os.fdatasync`` per chunk for the ``always`` comparison).
2. ``read``: reading everything from offset 0 with ``read(max_records=10000, max_bytes=8 MiB)``.
   Baselines: ``f.read`` of the segment file in chunks of the same byte size (the physical
   ceiling), and ``msgpack.unpackb`` of the same records packed as lists of ``[key, value]``.
3. ``visibility``: a writer process appends one record every 2 ms, its value carrying
   ``time.monotonic_ns()`` (one clock for every process on Linux); the parent sleeps in
   ``log.wait`` then reads it. Baseline: the same ping through an ``os.pipe``.
4. ``compaction``: ``log.compact`` of a topic holding about 100 MB of updates to 50,000 keys
   (MB/s of input). Baseline: ``shutil.copyfile`` of the same segment files.

Throughput rows report the median and the slowest of the runs, and per-call times (p50 / p90 /
p99 / max of every append, read, write or compact call of every measured run); latency rows
report percentiles of all samples. No means. The first run of each measurement (and the first
samples of each latency round) are a warm-up and are discarded. Runs of a system and its
baseline alternate, and ``os.sync()`` plus ``gc.collect()`` run outside the timed parts so that
the writeback or garbage of one run does not land in the next. Results and method for one
machine are in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from kafkakv.log.base import Record
from kafkakv.log.embedded.log import EmbeddedLog
from kafkakv.log.embedded.manifest import Manifest

KEY_BYTES = 16
VALUE_BYTES = 100
TOPIC = "bench"


# -- sizes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    records: int  # records per append / read run
    batch: int  # records per append call (never, interval)
    batch_always: int  # records per append call under fsync=always
    runs: int  # measured runs per throughput measurement (after one warm-up run)
    read_records: int  # max_records of each read call
    ping_rounds: int  # visibility: rounds, each with a log and a pipe writer
    ping_samples: int  # visibility: measured samples per round and per system
    ping_warmup: int  # visibility: samples discarded at the start of each round
    ping_period_s: float
    compact_bytes: int  # stored bytes to fill before compacting
    compact_keys: int
    compact_runs: int
    compact_warmup_bytes: int


FULL = Sizes(
    records=1_000_000,
    batch=1000,
    batch_always=10_000,
    runs=5,
    read_records=10_000,
    ping_rounds=3,
    ping_samples=1000,
    ping_warmup=100,
    ping_period_s=0.002,
    compact_bytes=100_000_000,
    compact_keys=50_000,
    compact_runs=3,
    compact_warmup_bytes=10_000_000,
)
QUICK = Sizes(
    records=100_000,
    batch=1000,
    batch_always=10_000,
    runs=3,
    read_records=10_000,
    ping_rounds=2,
    ping_samples=300,
    ping_warmup=50,
    ping_period_s=0.002,
    compact_bytes=10_000_000,
    compact_keys=5_000,
    compact_runs=2,
    compact_warmup_bytes=2_000_000,
)


# -- statistics -------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    data = sorted(values)
    k = (len(data) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


@dataclass
class Throughput:
    """Runs of one series: ``rates`` (one per run) and every call's duration in seconds."""

    measurement: str
    series: str
    unit: str  # of the rates: "records/s" or "MB/s"
    rates: list[float] = field(default_factory=list)
    call_s: list[float] = field(default_factory=list)

    def add_run(self, amount: float, seconds: float, calls: list[float]) -> None:
        self.rates.append(amount / seconds)
        self.call_s.extend(calls)

    def summary(self) -> dict[str, Any]:
        return {
            "measurement": self.measurement,
            "series": self.series,
            "unit": self.unit,
            "runs": len(self.rates),
            "rate_median": statistics.median(self.rates),
            "rate_slowest_run": min(self.rates),
            "rate_fastest_run": max(self.rates),
            "calls": len(self.call_s),
            "call_ms_p50": percentile(self.call_s, 50) * 1e3,
            "call_ms_p90": percentile(self.call_s, 90) * 1e3,
            "call_ms_p99": percentile(self.call_s, 99) * 1e3,
            "call_ms_max": max(self.call_s) * 1e3,
        }


@dataclass
class Latency:
    measurement: str
    series: str
    samples_ns: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ms = [s / 1e6 for s in self.samples_ns]
        return {
            "measurement": self.measurement,
            "series": self.series,
            "samples": len(ms),
            "ms_p50": percentile(ms, 50),
            "ms_p90": percentile(ms, 90),
            "ms_p99": percentile(ms, 99),
            "ms_max": max(ms),
        }


@dataclass
class Comparison:
    """A kafkakv series, its baselines, and the target it is held to."""

    subject: Throughput | Latency
    baselines: list[Throughput | Latency]
    target: str
    met: bool | None  # None: no target for this row
    extra: dict[str, object] = field(default_factory=dict)
    diagnostics: list[Throughput] = field(default_factory=list)
    """Extra kafkakv series that explain the result; not baselines."""


# -- workload ---------------------------------------------------------------------------------
def make_values(count: int, rng: random.Random) -> list[bytes]:
    return [rng.randbytes(VALUE_BYTES) for _ in range(count)]


def record_batches(n: int, batch: int, seed: int = 0) -> Iterator[list[Record]]:
    """``n`` records in lists of ``batch``: distinct 16-byte keys, 100-byte random values.

    Built lazily, so the benchmark process never holds the whole workload: a million live
    ``Record`` objects would make every cyclic garbage collection (and so the code measured)
    slower; ``read`` measures that effect on purpose, as a separate diagnostic series.
    """
    pool = make_values(4096, random.Random(seed))
    for start in range(0, n, batch):
        stop = min(start + batch, n)
        yield [Record(i.to_bytes(KEY_BYTES, "big"), pool[i & 4095]) for i in range(start, stop)]


def fresh_dir(root: str, name: str) -> str:
    path = os.path.join(root, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def partition_dir(log_dir: str) -> str:
    return os.path.join(log_dir, "topics", TOPIC, "0")


def stored_bytes(log_dir: str) -> int:
    pdir = partition_dir(log_dir)
    return sum(
        os.path.getsize(os.path.join(pdir, n)) for n in os.listdir(pdir) if n.endswith(".log")
    )


def settle() -> None:
    """Flush earlier runs' dirty pages (so their writeback does not land in the next timing)
    and collect garbage (so every run starts from the same heap)."""
    os.sync()
    gc.collect()


# -- 1. append --------------------------------------------------------------------------------
def append_run(
    root: str, batches: Iterator[list[Record]], policy: str
) -> tuple[float, list[float], int]:
    """Append every batch to a fresh log; return (seconds, per-call seconds, stored bytes).

    Only the ``append`` calls are timed (building the next batch is not); closing the log,
    which flushes under ``interval`` and ``always``, is not timed either.
    """
    path = fresh_dir(root, "append-log")
    settle()
    calls: list[float] = []
    with EmbeddedLog(path, fsync=policy, background_cleaner=False) as log:
        log.create_topic(TOPIC, 1)
        append = log.append
        clock = time.perf_counter
        for batch in batches:
            t = clock()
            append(TOPIC, 0, batch)
            calls.append(clock() - t)
        size = stored_bytes(path)
    shutil.rmtree(path)
    return sum(calls), calls, size


def write_run(root: str, chunk: bytes, count: int, sync: bool) -> tuple[float, list[float]]:
    """Write ``chunk`` ``count`` times to a new file (fdatasync after each when ``sync``)."""
    path = os.path.join(fresh_dir(root, "append-file"), "data")
    settle()
    calls: list[float] = []
    clock = time.perf_counter
    with open(path, "wb", buffering=0) as f:
        fd = f.fileno()
        for _ in range(count):
            t = clock()
            f.write(chunk)
            if sync:
                os.fdatasync(fd)
            calls.append(clock() - t)
    shutil.rmtree(os.path.dirname(path))
    return sum(calls), calls


def bench_append(root: str, sizes: Sizes) -> list[Comparison]:
    out = []
    rng = random.Random(1)
    for policy, batch in (
        ("never", sizes.batch),
        ("interval", sizes.batch),
        ("always", sizes.batch_always),
    ):
        calls_per_run = -(-sizes.records // batch)
        name = f"append fsync={policy}, {batch} rec/call"
        subject = Throughput(name, "kafkakv EmbeddedLog.append", "records/s")
        base = Throughput(
            name,
            "file write" + (" + fdatasync" if policy == "always" else "") + ", same bytes/chunk",
            "records/s",
        )
        chunk = b""
        for run in range(sizes.runs + 1):
            elapsed, calls, size = append_run(root, record_batches(sizes.records, batch), policy)
            if run == 0:  # warm-up; also tells the stored size of a batch
                chunk = rng.randbytes(size // calls_per_run)
                continue
            subject.add_run(sizes.records, elapsed, calls)
            b_elapsed, b_calls = write_run(root, chunk, calls_per_run, sync=policy == "always")
            base.add_run(sizes.records, b_elapsed, b_calls)
        target = ">= 300,000 records/s" if policy != "always" else "(none; vs its baseline)"
        met = statistics.median(subject.rates) >= 300_000 if policy != "always" else None
        out.append(Comparison(subject, [base], target, met, {"stored_bytes_per_call": len(chunk)}))
    return out


# -- 2. read ----------------------------------------------------------------------------------
def read_all(path: str, sizes: Sizes) -> tuple[float, list[float]]:
    """Read the whole partition from offset 0 through a freshly opened log (no index or
    descriptor cache carried over from another run); return (seconds, per-call seconds)."""
    calls: list[float] = []
    seen = 0
    clock = time.perf_counter
    with EmbeddedLog(path, fsync="never", background_cleaner=False) as log:
        read = log.read
        offset = 0
        start = clock()
        while True:
            t = clock()
            got = read(TOPIC, 0, offset, max_records=sizes.read_records, max_bytes=8 << 20)
            calls.append(clock() - t)
            if not got:
                break
            seen += len(got)
            offset = got[-1].offset + 1
        elapsed = clock() - start
    if seen != sizes.records:
        raise AssertionError(f"read {seen} records, expected {sizes.records}")
    return elapsed, calls


def bench_read(root: str, sizes: Sizes) -> list[Comparison]:
    path = fresh_dir(root, "read-log")
    packed = []
    with EmbeddedLog(path, fsync="never", background_cleaner=False) as log:
        log.create_topic(TOPIC, 1)
        for part in record_batches(sizes.records, sizes.read_records):
            for i in range(0, len(part), sizes.batch):
                log.append(TOPIC, 0, part[i : i + sizes.batch])
            packed.append(msgpack.packb([[r.key, r.value] for r in part], use_bin_type=True))
    m = Manifest.load(partition_dir(path))
    seg_files = [os.path.join(partition_dir(path), s.name + ".log") for s in m.segments]
    total = sum(os.path.getsize(f) for f in seg_files)
    chunk_bytes = total * sizes.read_records // sizes.records

    name = f"read from offset 0, max_records={sizes.read_records}, max_bytes=8 MiB"
    subject = Throughput(name, "kafkakv EmbeddedLog.read", "records/s")
    raw = Throughput(name, f"file f.read, {chunk_bytes} B chunks (physical ceiling)", "records/s")
    unpack = Throughput(name, "msgpack.unpackb of [key, value] lists", "records/s")
    clock = time.perf_counter
    for run in range(sizes.runs + 1):
        settle()
        elapsed, calls = read_all(path, sizes)
        if run:
            subject.add_run(sizes.records, elapsed, calls)

        # the same bytes with plain reads
        calls = []
        start = clock()
        for seg in seg_files:
            with open(seg, "rb", buffering=0) as f:
                while True:
                    t = clock()
                    data = f.read(chunk_bytes)
                    calls.append(clock() - t)
                    if not data:
                        break
        elapsed = clock() - start
        if run:
            raw.add_run(sizes.records, elapsed, calls)

        # the same records decoded by msgpack alone
        calls = []
        unpackb = msgpack.unpackb
        start = clock()
        for buf in packed:
            t = clock()
            unpackb(buf, use_list=False, raw=False)
            calls.append(clock() - t)
        elapsed = clock() - start
        if run:
            unpack.add_run(sizes.records, elapsed, calls)

    # Diagnostic, not a baseline: the same reads while the process holds as many live Record
    # objects as the log has (as an application replaying the log into a dict would). Run
    # after the main series, because building that heap takes a while.
    heavy = Throughput(
        name,
        f"diagnostic: kafkakv read with {sizes.records:,} live Records in the heap",
        "records/s",
    )
    ballast = [r for part in record_batches(sizes.records, sizes.read_records) for r in part]
    for run in range(sizes.runs + 1):
        settle()
        elapsed, calls = read_all(path, sizes)
        if run:
            heavy.add_run(sizes.records, elapsed, calls)
    del ballast
    shutil.rmtree(path)
    met = statistics.median(subject.rates) >= 1_000_000
    return [
        Comparison(
            subject,
            [raw, unpack],
            ">= 1,000,000 records/s",
            met,
            {"stored_bytes": total},
            diagnostics=[heavy],
        )
    ]


# -- 3. cross-process visibility ----------------------------------------------------------------
_LOG_WRITER = """
import sys, time
from kafkakv.log.base import Record
from kafkakv.log.embedded.log import EmbeddedLog
path, topic, count, period = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
pad = bytes(92)
with EmbeddedLog(path, fsync="interval", background_cleaner=False) as log:
    log.end_offset(topic, 0)
    time.sleep(0.2)
    for i in range(count):
        time.sleep(period)
        stamp = time.monotonic_ns()
        log.append(topic, 0, [Record(b"%016d" % i, stamp.to_bytes(8, "little") + pad)])
"""

_PIPE_WRITER = """
import os, sys, time
fd, count, period = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
pad = bytes(108)
time.sleep(0.2)
for i in range(count):
    time.sleep(period)
    os.write(fd, time.monotonic_ns().to_bytes(8, "little") + pad)
"""

_PING_SIZE = 116


def ping_log(root: str, sizes: Sizes) -> list[int]:
    path = fresh_dir(root, "ping-log")
    count = sizes.ping_warmup + sizes.ping_samples
    out: list[int] = []
    with EmbeddedLog(path, fsync="interval", background_cleaner=False) as log:
        log.create_topic(TOPIC, 1)
        proc = subprocess.Popen(
            [sys.executable, "-c", _LOG_WRITER, path, TOPIC, str(count), str(sizes.ping_period_s)]
        )
        try:
            offset = 0
            while offset < count:
                if not log.wait(TOPIC, 0, offset, timeout=1):
                    if proc.poll() is not None and log.end_offset(TOPIC, 0) <= offset:
                        raise RuntimeError(f"log writer exited with {proc.returncode}")
                    continue
                got = log.read(TOPIC, 0, offset, max_records=100)
                now = time.monotonic_ns()
                for r in got:
                    assert r.value is not None
                    out.append(now - int.from_bytes(r.value[:8], "little"))
                offset = got[-1].offset + 1
        finally:
            if proc.wait(timeout=60) != 0:
                raise RuntimeError(f"log writer exited with {proc.returncode}")
    shutil.rmtree(path)
    return out[sizes.ping_warmup :]


def ping_pipe(sizes: Sizes) -> list[int]:
    count = sizes.ping_warmup + sizes.ping_samples
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", _PIPE_WRITER, str(w), str(count), str(sizes.ping_period_s)],
        pass_fds=(w,),
    )
    os.close(w)
    out: list[int] = []
    try:
        with open(r, "rb", buffering=0) as f:
            for _ in range(count):
                msg = f.read(_PING_SIZE)
                now = time.monotonic_ns()
                if len(msg) != _PING_SIZE:
                    raise RuntimeError("pipe writer stopped early")
                out.append(now - int.from_bytes(msg[:8], "little"))
    finally:
        if proc.wait(timeout=60) != 0:
            raise RuntimeError(f"pipe writer exited with {proc.returncode}")
    return out[sizes.ping_warmup :]


def bench_visibility(root: str, sizes: Sizes) -> list[Comparison]:
    name = f"cross-process visibility, 1 record every {sizes.ping_period_s * 1e3:g} ms"
    subject = Latency(name, "kafkakv append -> wait + read in another process")
    base = Latency(name, "os.pipe write -> blocking read")
    for _ in range(sizes.ping_rounds):
        subject.samples_ns.extend(ping_log(root, sizes))
        base.samples_ns.extend(ping_pipe(sizes))
    p99 = percentile(subject.samples_ns, 99) / 1e6
    return [Comparison(subject, [base], "p99 <= 5 ms", p99 <= 5.0)]


# -- 4. compaction ----------------------------------------------------------------------------
COMPACT_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": 8 << 20,
    "min.cleanable.dirty.ratio": 0.01,
}


class UpdateWorkload:
    """Updates to ``keys`` random keys, about ``target_bytes`` once stored, in batches of 1000.

    Only the key choices (small ints) are kept; records are built batch by batch, so nothing
    large is alive in the benchmark process while the cleaner runs.
    """

    def __init__(self, target_bytes: int, keys: int, bytes_per_record: float, seed: int):
        rng = random.Random(seed)
        self.keys = [b"key-%012d" % i for i in range(keys)]
        self.pool = make_values(4096, rng)
        self.picks = rng.choices(range(keys), k=int(target_bytes / bytes_per_record))
        self.distinct = len(set(self.picks))

    def batches(self) -> Iterator[list[Record]]:
        keys, pool, picks = self.keys, self.pool, self.picks
        for start in range(0, len(picks), 1000):
            yield [
                Record(keys[picks[i]], pool[i & 4095])
                for i in range(start, min(start + 1000, len(picks)))
            ]


def compaction_run(
    root: str, batches: Iterator[list[Record]]
) -> tuple[float, float, dict[str, int]]:
    """Fill a compacted topic, copy its sealed segments, compact it.

    Returns (compaction seconds, copy seconds, sizes).
    """
    path = fresh_dir(root, "compact-log")
    copies = fresh_dir(root, "compact-copy")
    clock = time.perf_counter
    # fsync=never: the plain copy it is compared with does not fsync either
    with EmbeddedLog(path, fsync="never", background_cleaner=False) as log:
        log.create_topic(TOPIC, 1, COMPACT_CONFIG)
        for batch in batches:
            log.append(TOPIC, 0, batch)
        pdir = partition_dir(path)
        before = stored_bytes(path)
        sealed = [os.path.join(pdir, s.name + ".log") for s in Manifest.load(pdir).sealed]
        sealed_bytes = sum(os.path.getsize(f) for f in sealed)
        settle()
        start = clock()
        for src in sealed:
            shutil.copyfile(src, os.path.join(copies, os.path.basename(src)))
        copy_s = clock() - start
        shutil.rmtree(copies)
        settle()
        start = clock()
        results = log.compact(TOPIC)
        compact_s = clock() - start
        after = stored_bytes(path)
    shutil.rmtree(path)
    res = results[0]
    if res.bytes_in != sealed_bytes:
        raise AssertionError(f"compaction read {res.bytes_in} bytes, sealed {sealed_bytes}")
    info = {
        "stored_before": before,
        "stored_after": after,
        "sealed_bytes": sealed_bytes,
        "bytes_in": res.bytes_in,
        "bytes_out": res.bytes_out,
        "records_in": res.records_in,
        "records_out": res.records_out,
        "segments_in": res.segments_in,
    }
    return compact_s, copy_s, info


def bench_compaction(root: str, sizes: Sizes, bytes_per_record: float) -> list[Comparison]:
    warm = UpdateWorkload(sizes.compact_warmup_bytes, sizes.compact_keys, bytes_per_record, 3)
    compaction_run(root, warm.batches())  # warm-up, discarded
    work = UpdateWorkload(sizes.compact_bytes, sizes.compact_keys, bytes_per_record, 4)
    distinct = work.distinct
    name = (
        f"compaction, ~{sizes.compact_bytes / 1e6:.0f} MB over {sizes.compact_keys} keys, "
        "segment.bytes=8 MiB"
    )
    subject = Throughput(name, "kafkakv EmbeddedLog.compact (MB of input/s)", "MB/s")
    base = Throughput(name, "shutil.copyfile of the sealed segments", "MB/s")
    infos = []
    for _ in range(sizes.compact_runs):
        compact_s, copy_s, info = compaction_run(root, work.batches())
        infos.append(info)
        mb = info["bytes_in"] / 1e6
        subject.add_run(mb, compact_s, [compact_s])
        base.add_run(mb, copy_s, [copy_s])
    info = infos[-1]
    live_stored = distinct * bytes_per_record
    live_payload = distinct * (KEY_BYTES + VALUE_BYTES)
    extra: dict[str, object] = {
        **info,
        "distinct_keys": distinct,
        "stored_bytes_per_record": round(bytes_per_record, 2),
        "live_bytes_stored": round(live_stored),
        "live_bytes_payload": live_payload,
        "after_over_live_stored": info["stored_after"] / live_stored,
        "after_over_live_payload": info["stored_after"] / live_payload,
        "cleaned_over_live_stored": info["bytes_out"] / live_stored,
        "bytes_out_over_bytes_in": info["bytes_out"] / info["bytes_in"],
    }
    met = statistics.median(subject.rates) >= 50
    return [Comparison(subject, [base], ">= 50 MB/s of input", met, extra)]


# -- machine ----------------------------------------------------------------------------------
def machine(root: str) -> dict[str, object]:
    cpu = "?"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with open("/proc/meminfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    df = subprocess.run(["df", "-T", root], capture_output=True, text=True, check=False)
    fs = df.stdout.splitlines()[-1].split() if df.returncode == 0 else ["?", "?"]
    git = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 2**20, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "msgpack": ".".join(map(str, msgpack.version)),
        "tmp_dir": root,
        "tmp_device": fs[0],
        "tmp_fs": fs[1],
        "kafkakv_git": git.stdout.strip() or "?",
    }


# -- output -----------------------------------------------------------------------------------
def fmt(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


def met_text(met: bool | None) -> str:
    return "" if met is None else ("yes" if met else "**no**")


def tables(comparisons: list[Comparison]) -> str:
    thr = [
        "| measurement | series | runs | median run | slowest run | per call p50 / p90 / p99 / max (ms) "
        "| ratio (median) | target | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lat = [
        "| measurement | series | samples | p50 ms | p90 ms | p99 ms | max ms | ratio (p99) "
        "| target | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        s = c.subject.summary()
        rows: list[tuple[str, Throughput | Latency]] = [
            ("subject", c.subject),
            *(("baseline", b) for b in c.baselines),
            *(("diagnostic", x) for x in c.diagnostics),
        ]
        for i, (role, series) in enumerate(rows):
            d = series.summary()
            first = i == 0
            if isinstance(series, Throughput):
                ratio = s["rate_median"] / d["rate_median"]
                ratio_text = {
                    "subject": "",
                    "baseline": f"kafkakv = {ratio:.2f}x",
                    "diagnostic": f"(clean heap = {ratio:.2f}x this)",
                }[role]
                thr.append(
                    f"| {d['measurement'] if first else ''} | {d['series']} | {d['runs']} "
                    f"| {fmt(d['rate_median'])} {d['unit']} "
                    f"| {fmt(d['rate_slowest_run'])} "
                    f"| {fmt(d['call_ms_p50'])} / {fmt(d['call_ms_p90'])} / "
                    f"{fmt(d['call_ms_p99'])} / {fmt(d['call_ms_max'])} "
                    f"| {ratio_text} "
                    f"| {c.target if first else ''} | {met_text(c.met) if first else ''} |"
                )
            else:
                ratio = s["ms_p99"] / d["ms_p99"]
                lat.append(
                    f"| {d['measurement'] if first else ''} | {d['series']} | {d['samples']} "
                    f"| {fmt(d['ms_p50'])} | {fmt(d['ms_p90'])} | {fmt(d['ms_p99'])} "
                    f"| {fmt(d['ms_max'])} "
                    f"| {'' if first else f'kafkakv = {ratio:.2f}x'} "
                    f"| {c.target if first else ''} | {met_text(c.met) if first else ''} |"
                )
    parts = []
    if len(thr) > 2:
        parts.append("\n".join(thr))
    if len(lat) > 2:
        parts.append("\n".join(lat))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    parser.add_argument("--only", default="append,read,visibility,compaction")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="parent of the scratch dir")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = wanted - {"append", "read", "visibility", "compaction"}
    if unknown:
        parser.error(f"unknown measurement(s): {', '.join(sorted(unknown))}")

    root = tempfile.mkdtemp(prefix="kafkakv-bench-", dir=args.dir)
    began = time.perf_counter()
    try:
        info = machine(root)
        print("## Machine\n")
        for k, v in info.items():
            print(f"- {k}: {v}")
        print(
            f"\nmode: {'quick' if args.quick else 'full'}; scratch directory {root} "
            f"({info['tmp_fs']} on {info['tmp_device']})\n",
            flush=True,
        )
        rng = random.Random(0)
        comparisons: list[Comparison] = []
        steps: list[tuple[str, Callable[[], list[Comparison]]]] = [
            ("append", lambda: bench_append(root, sizes)),
            ("read", lambda: bench_read(root, sizes)),
            ("visibility", lambda: bench_visibility(root, sizes)),
        ]
        for name, step in steps:
            if name in wanted:
                t = time.perf_counter()
                comparisons.extend(step())
                print(f"[{name} done in {time.perf_counter() - t:.1f} s]", flush=True)
        if "compaction" in wanted:
            # stored bytes per record, measured on this workload (16 B keys, 100 B values)
            probe = fresh_dir(root, "probe")
            with EmbeddedLog(probe, fsync="never", background_cleaner=False) as log:
                log.create_topic(TOPIC, 1, COMPACT_CONFIG)
                sample = [
                    Record(b"key-%012d" % i, rng.randbytes(VALUE_BYTES)) for i in range(10000)
                ]
                for i in range(0, len(sample), 1000):
                    log.append(TOPIC, 0, sample[i : i + 1000])
                per_record = stored_bytes(probe) / len(sample)
            shutil.rmtree(probe)
            t = time.perf_counter()
            comparisons.extend(bench_compaction(root, sizes, per_record))
            print(f"[compaction done in {time.perf_counter() - t:.1f} s]", flush=True)
        total_s = time.perf_counter() - began
        print("\n## Results\n")
        print(tables(comparisons))
        for c in comparisons:
            if c.extra:
                print(f"\n{c.subject.measurement}: " + json.dumps(c.extra))
        print(f"\ntotal time {total_s:.0f} s\n")
        doc = {
            "benchmark": "bench_log",
            "mode": "quick" if args.quick else "full",
            "machine": info,
            "sizes": sizes.__dict__,
            "total_s": round(total_s, 1),
            "results": [
                {
                    "subject": c.subject.summary(),
                    "baselines": [b.summary() for b in c.baselines],
                    "diagnostics": [x.summary() for x in c.diagnostics],
                    "target": c.target,
                    "met": c.met,
                    **({"extra": c.extra} if c.extra else {}),
                }
                for c in comparisons
            ],
        }
        print(json.dumps(doc))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
