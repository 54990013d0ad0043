"""Do appends under ``fsync=interval`` stall? The slowest calls of a writer appending flat out.

Command (from the project root)::

    .venv/bin/python benchmarks/bench_interval_stall.py [--seconds 3.5] [--runs 2] [--dir DIR]

Each run appends batches of 1,000 records (16-byte keys, 100-byte values) to one partition as
fast as it can for ``--seconds``, timing every ``append`` call, under ``fsync=interval``
(``fsync_interval_ms=1000``) and then, as the baseline, under ``fsync=never``; runs alternate.
The segment never rolls (``segment.bytes`` is 2 GiB - 1), so a roll's own flush is not
measured. The first run of each policy is a warm-up and is discarded. Prints, per policy, the
call-time percentiles (p50 / p99 / max) over every measured call, the number of calls slower
than 50 ms, and the median rate; the last line is one JSON object with every number.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from kafkakv.log import EmbeddedLog, Record


def run(root: str, policy: str, seconds: float) -> tuple[list[float], float]:
    """Per-call times (s) of one run, and its rate (records/s)."""
    path = tempfile.mkdtemp(dir=root)
    batch = [Record(b"%016d" % i, b"v" * 100) for i in range(1000)]
    calls: list[float] = []
    clock = time.perf_counter
    try:
        with EmbeddedLog(path, fsync=policy, background_cleaner=False) as log:
            log.create_topic("t", 1, {"segment.bytes": 2**31 - 1})
            start = clock()
            while clock() - start < seconds:
                t = clock()
                log.append("t", 0, batch)
                calls.append(clock() - t)
            elapsed = clock() - start
    finally:
        shutil.rmtree(path, ignore_errors=True)
    os.sync()
    return calls, len(calls) * len(batch) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.5)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="kafkakv-stall-", dir=args.dir)
    results: dict[str, dict[str, float]] = {}
    try:
        calls: dict[str, list[float]] = {"interval": [], "never": []}
        rates: dict[str, list[float]] = {"interval": [], "never": []}
        for i in range(args.runs + 1):
            for policy in ("interval", "never"):
                times, rate = run(root, policy, args.seconds)
                if i:  # run 0 is the warm-up
                    calls[policy] += times
                    rates[policy].append(rate)
        for policy, times in calls.items():
            times.sort()
            n = len(times)
            results[policy] = {
                "calls": n,
                "rate_median": statistics.median(rates[policy]),
                "call_ms_p50": times[n // 2] * 1e3,
                "call_ms_p99": times[min(n - 1, int(n * 0.99))] * 1e3,
                "call_ms_max": times[-1] * 1e3,
                "calls_over_50ms": sum(t > 0.05 for t in times),
            }
            r = results[policy]
            print(
                f"fsync={policy}: {r['rate_median']:,.0f} records/s (median run), per call "
                f"p50 {r['call_ms_p50']:.2f} / p99 {r['call_ms_p99']:.2f} / max "
                f"{r['call_ms_max']:.1f} ms, {r['calls_over_50ms']} of {n} calls over 50 ms"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"benchmark": "bench_interval_stall", "results": results}))


if __name__ == "__main__":
    main()
