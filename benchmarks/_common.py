"""What every benchmark script shares: the workload's keys and values, percentiles, the machine.

The scripts run as ``python benchmarks/<script>.py``, so this directory is on ``sys.path``.
"""

from __future__ import annotations

import os
import platform
import random
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kafkakv.dev.process import dies_with_parent

VALUE = b"v" * 100
"""The value of every update: 100 bytes."""


def key(i: int) -> str:
    """The ``i``-th key: 16 characters."""
    return f"{i:016d}"


def pct(samples: list[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lat(samples_ns: list[int]) -> dict[str, float]:
    """p50/p90/p99 in microseconds of latencies given in nanoseconds."""
    us = [s / 1e3 for s in samples_ns]
    return {"p50_us": pct(us, 0.5), "p90_us": pct(us, 0.9), "p99_us": pct(us, 0.99)}


def machine() -> str:
    """CPU count and model, memory and Python version, for the results."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} x {cpu}, {mem:.1f} GiB, Python {platform.python_version()}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it; another process may
    take it before the caller binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` made to get SIGTERM when the benchmark script dies, even by SIGKILL
    (:func:`kafkakv.dev.process.dies_with_parent`; no Python runs in the forked child)."""
    return dies_with_parent(argv, signal.SIGTERM)


def put_async_rate(m: Any, keys: list[str]) -> float:
    """Updates/s of ``m.put_async(k, VALUE)`` for every key, then ``result()`` of every future.
    The futures are freed before returning, as a caller would: the next run must not pay."""
    t = time.perf_counter()
    futures = [m.put_async(k, VALUE) for k in keys]
    for f in futures:
        f.result()
    rate = len(keys) / (time.perf_counter() - t)
    del futures
    return rate


def read_rate(make: Callable[[int], Callable[[str], Any]], threads: int, seconds: float) -> float:
    """Reads per second of ``threads`` threads, thread i calling ``make(i)`` on random keys
    out of 1,000, counted for ``seconds`` after a 0.3 s warm-up."""
    counts = [0] * threads
    stop = threading.Event()

    def run(i: int) -> None:
        get, rnd = make(i), random.Random(i)
        while not stop.is_set():
            get(key(rnd.randrange(1000)))
            counts[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    time.sleep(0.3)
    before, t = sum(counts), time.perf_counter()
    time.sleep(seconds)
    after, elapsed = sum(counts), time.perf_counter() - t
    stop.set()
    for w in workers:
        w.join()
    return (after - before) / elapsed


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, so the cleanup of Ctrl-C runs for it too."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
