"""What ``m.check(deep=True)`` costs, next to what it repeats: opening a fresh replica.

Command (from the project root)::

    .venv/bin/python benchmarks/bench_deep_check.py [--keys N] [--runs R] [--dir DIR]

Workload: a map of N keys (default 100,000) on the embedded log, str keys of 16 characters,
bytes values of 100 bytes, one partition; flushed once, then N/10 updates after the flush
point (ops the check replays). For a replica with each store (``dict``, ``lmdb``), after a
warm-up run:

1. ``check()``: the store's own check; median and p90 of R runs (default 5).
2. ``check(deep=True)``: the same figures, and the longest time applying was paused in a run.
3. baseline: ``db.map()`` of a fresh dict replica of the same map (the data topic and ops it
   reads are what the deep check reads), median of R runs.
4. memory: the peak Python allocation of one deep check (``tracemalloc``, a run of its own).
5. with a writer: the deep check while another thread of the same replica does ``m.put`` in
   a loop; the longest pause, the writer's p99 and max ``put`` latency during the checks, and
   its p99 with no check running.

Prints the machine, one line per figure and, last, one JSON object with every number.
Results are in ``docs/maps-operations.md`` ("Checking a replica against the log").
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import shutil
import statistics
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

from _common import VALUE, key, machine, pct

import kafkakv


def timed(fn: Callable[[], Any], runs: int) -> list[float]:
    fn()  # warm-up, discarded
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return samples


@contextlib.contextmanager
def pauses(m: Any) -> Iterator[list[float]]:
    """Record how long each ``paused()`` of ``m``'s engine lasted."""
    engine = m._engine
    original = engine.paused
    seen: list[float] = []

    @contextlib.contextmanager
    def measured() -> Iterator[None]:
        with original():
            t = time.perf_counter()
            try:
                yield
            finally:
                seen.append(time.perf_counter() - t)

    engine.paused = measured
    try:
        yield seen
    finally:
        engine.paused = original


def writer_latencies(m: Any, stop: threading.Event, out: list[float]) -> None:
    i = 0
    while not stop.is_set():
        t = time.perf_counter()
        m.put(key(i % 1000), VALUE)
        out.append(time.perf_counter() - t)
        i += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    n, runs = args.keys, args.runs
    root = tempfile.mkdtemp(dir=args.dir)
    results: dict[str, Any] = {"keys": n, "runs": runs, "machine": machine()}
    print(machine())
    opts: dict[str, Any] = {"value_codec": "bytes", "flush_period": 10 * n}
    try:
        with kafkakv.connect(f"{root}/log") as db:
            m = db.map("bench", **opts)
            m.update({key(i): VALUE for i in range(n)})
            m.flush()
            m.update({key(i): VALUE[:50] for i in range(0, n, 10)})
            m.close()

            def fresh() -> None:
                db.map("bench", **opts).close()

            fresh_s = timed(fresh, runs)
            results["fresh_replica_s"] = statistics.median(fresh_s)
            print(f"baseline: a fresh dict replica opens in {results['fresh_replica_s']:.3f} s")
            for store in ("dict", "lmdb"):
                extra: dict[str, Any] = {"store_path": f"{root}/store"} if store == "lmdb" else {}
                m = db.map("bench", store=store, **opts, **extra)
                assert m.check(deep=True) == []
                plain = timed(m.check, runs)
                with pauses(m) as seen:
                    deep = timed(functools.partial(m.check, deep=True), runs)
                tracemalloc.start()
                m.check(deep=True)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                alone: list[float] = []
                stop = threading.Event()
                thread = threading.Thread(target=writer_latencies, args=(m, stop, alone))
                thread.start()
                time.sleep(1)
                stop.set()
                thread.join()
                during: list[float] = []
                stop = threading.Event()
                thread = threading.Thread(target=writer_latencies, args=(m, stop, during))
                with pauses(m) as busy:
                    thread.start()
                    time.sleep(0.2)
                    for _ in range(runs):
                        assert m.check(deep=True) == []
                    stop.set()
                    thread.join()
                row = {
                    "check_s": statistics.median(plain),
                    "check_p90_s": pct(plain, 0.9),
                    "deep_s": statistics.median(deep),
                    "deep_p90_s": pct(deep, 0.9),
                    "deep_vs_fresh": statistics.median(deep) / results["fresh_replica_s"],
                    "pause_max_ms": max(seen) * 1e3,
                    "peak_mib": peak / 2**20,
                    "writing_pause_max_ms": max(busy) * 1e3,
                    "put_p99_ms_alone": pct(alone, 0.99) * 1e3,
                    "put_p99_ms_during": pct(during, 0.99) * 1e3,
                    "put_max_ms_during": max(during) * 1e3,
                    "puts_during": len(during),
                }
                results[store] = row
                print(
                    f"{store}: check {row['check_s']:.3f} s; deep {row['deep_s']:.3f} s "
                    f"(p90 {row['deep_p90_s']:.3f}, {row['deep_vs_fresh']:.2f}x a fresh "
                    f"replica), paused at most {row['pause_max_ms']:.2f} ms, peak "
                    f"{row['peak_mib']:.0f} MiB; with a writer: paused at most "
                    f"{row['writing_pause_max_ms']:.2f} ms, put p99 "
                    f"{row['put_p99_ms_during']:.2f} ms (alone {row['put_p99_ms_alone']:.2f}), "
                    f"max {row['put_max_ms_during']:.2f} ms"
                )
                m.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
