"""Benchmark of the replicated map on the embedded log, each figure next to a baseline measured
in the same run.

Command (from the project root)::

    .venv/bin/python benchmarks/bench_map.py [--quick] [--only NAMES] [--dir DIR]

NAMES is a comma-separated subset of ``sync,async,visibility,bootstrap,restart,linearizable,
sharded``.
``--quick`` shrinks every workload. The script prints the machine, one line per measurement and,
last, one JSON object with every number.

Workload: str keys of 16 characters, bytes values of 100 bytes (``value_codec="bytes"``), one
partition unless said otherwise.

1. ``sync``: ``m.put`` in a loop in one process; per-call latency. Baseline: the protocol's
   floor on the same log, ``Log.append`` of one record then ``Log.read`` of it.
2. ``async``: ``put_async`` of N updates, then waiting for all futures; updates/s. Baseline:
   ``Log.append`` of the same records in batches of 1,000, then reading them all back. Each
   run also times ``m.update()`` of the same N pairs on a second fresh map (the dict way of
   writing many keys, built on ``put_all``); reported next to it, without a target.
3. ``visibility``: a writer process puts a key every 2 ms whose value carries
   ``time.monotonic_ns()``; a listener in the parent takes the difference. Baseline: the same
   ping through ``Log.append`` / ``Log.wait`` + ``Log.read`` of a plain topic.
4. ``bootstrap``: a map of 1,000,000 keys, flushed (data topic plus flush point) with 10,000
   updates after the flush in the ops topic; time for ``db.map()`` of a fresh replica to
   return. Baseline: reading the same data topic with ``Log.read`` into a dict.
5. ``restart``: the same map in a replica with ``store="lmdb"``; close it, then time the
   reopen. Baseline: the dict-store bootstrap of step 4.
6. ``linearizable``: 32 reader threads doing ``m[k]`` on a map opened with
   ``consistency="linearizable"`` for a few seconds, while nothing else runs; reads/s with the
   default barriers (the embedded log's authoritative end offset, no record appended) and with
   shared barrier records (what a Kafka-backed map uses). Baseline: one barrier record appended
   per read (``barriers="per-read"``).
7. ``sharded``: the same map over 8 partitions against 1 (the baseline), alternated, 3 runs
   each: sync ``m.put`` latency (p50 over 5,000 new keys), ``put_all`` of 100,000 pairs, and
   32 threads of linearizable ``m[k]`` as in step 6. Each key is placed by murmur2, as
   Kafka's producer places it (``kafkakv.log.partition_for``), on every read and write.

Latencies are reported as p50/p90/p99 over every call after a warm-up; rates as the median of
several runs. No means. Results and method for one machine are in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
from _common import VALUE, key, lat, machine, put_async_rate, read_rate

import kafkakv
from kafkakv.log import EmbeddedLog, Record
from kafkakv.map import FLUSH_POINT_KEY


class Bench:
    def __init__(self, root: str, quick: bool) -> None:
        self.root = root
        self.quick = quick
        self.n = 0
        self.results: dict[str, Any] = {}

    def fresh(self) -> str:
        self.n += 1
        path = os.path.join(self.root, f"log{self.n}")
        return path

    def open(self, path: str, **options: Any) -> tuple[kafkakv.Database, Any]:
        db = kafkakv.connect(path, background_cleaner=False)
        options.setdefault("value_codec", "bytes")
        options.setdefault("flush_period", 5000)
        return db, db.map("bench", **options)

    # 1 -------------------------------------------------------------------------------
    def sync(self) -> None:
        n, warm = (3000, 300) if self.quick else (20000, 2000)
        path = self.fresh()
        db, m = self.open(path)
        samples = []
        for i in range(n):
            t = time.perf_counter_ns()
            m.put(key(i), VALUE)
            samples.append(time.perf_counter_ns() - t)
        db.close()
        log = EmbeddedLog(self.fresh(), background_cleaner=False)
        log.create_topic("raw", 1)
        base = []
        for i in range(n):
            t = time.perf_counter_ns()
            o = log.append("raw", 0, [Record(key(i).encode(), VALUE)])
            log.read("raw", 0, o, max_records=1)
            base.append(time.perf_counter_ns() - t)
        log.close()
        mine, raw = lat(samples[warm:]), lat(base[warm:])
        ratio = mine["p50_us"] / raw["p50_us"]
        self.results["sync"] = {"put": mine, "append_read": raw, "p50_ratio": ratio}
        print(
            f"sync put      p50 {mine['p50_us']:7.1f} us  p90 {mine['p90_us']:7.1f}  "
            f"p99 {mine['p99_us']:7.1f} | append+read p50 {raw['p50_us']:.1f} us "
            f"p99 {raw['p99_us']:.1f} | ratio {ratio:.2f}x"
        )

    # 2 -------------------------------------------------------------------------------
    def async_(self) -> None:
        n, runs = (20000, 3) if self.quick else (200000, 5)
        rates, base, updates = [], [], []
        keys = [key(i) for i in range(n)]  # made outside the timed part, as for the baseline
        pairs = dict.fromkeys(keys, VALUE)
        for _ in range(runs + 1):
            db, m = self.open(self.fresh(), max_in_flight=20000)
            gc.collect()
            rates.append(put_async_rate(m, keys))
            db.close()
            db, m = self.open(self.fresh(), max_in_flight=20000)
            gc.collect()
            t = time.perf_counter()
            m.update(pairs)
            updates.append(n / (time.perf_counter() - t))
            db.close()
            log = EmbeddedLog(self.fresh(), background_cleaner=False)
            log.create_topic("raw", 1)
            records = [Record(key(i).encode(), VALUE) for i in range(n)]
            gc.collect()
            t = time.perf_counter()
            for j in range(0, n, 1000):
                log.append("raw", 0, records[j : j + 1000])
            pos = 0
            while got := log.read("raw", 0, pos, max_records=5000):
                pos = (got[-1].offset or 0) + 1
            base.append(n / (time.perf_counter() - t))
            log.close()
        mine, raw = statistics.median(rates[1:]), statistics.median(base[1:])
        update = statistics.median(updates[1:])
        self.results["async"] = {
            "ops_s": mine,
            "raw_append_read_s": raw,
            "ratio": mine / raw,
            "update_ops_s": update,
        }
        print(
            f"async put     {mine:9.0f} ops/s (runs {[round(r) for r in rates[1:]]}) | "
            f"raw append+read {raw:9.0f} rec/s | ratio {mine / raw:.3f}"
        )
        print(f"  m.update()  {update:9.0f} ops/s (runs {[round(r) for r in updates[1:]]})")

    # 3 -------------------------------------------------------------------------------
    def visibility(self) -> None:
        n = 300 if self.quick else 2000
        path = self.fresh()
        db, m = self.open(path)
        seen: list[int] = []
        done = threading.Event()

        def listener(k: Any, old: Any, new: Any, mine: bool) -> None:
            if new is not None and not mine:
                seen.append(time.monotonic_ns() - int(new))
                if len(seen) >= n:
                    done.set()

        m.add_listener(listener)
        ctx = mp.get_context("spawn")
        proc = ctx.Process(target=_map_writer, args=(path, n + 50))
        proc.start()
        done.wait(120)
        proc.join(30)
        db.close()
        log = EmbeddedLog(self.fresh(), background_cleaner=False)
        log.create_topic("raw", 1)
        proc = ctx.Process(target=_log_writer, args=(log.path, n + 50))
        proc.start()
        base, pos = [], 0
        while len(base) < n:
            if log.wait("raw", 0, pos, 10):
                for r in log.read("raw", 0, pos):
                    base.append(time.monotonic_ns() - int(r.value or b"0"))
                    pos = (r.offset or 0) + 1
        proc.join(30)
        log.close()
        mine, raw = lat(seen[50:]), lat(base[50:])
        self.results["visibility"] = {"map": mine, "log": raw}
        print(
            f"visibility    p50 {mine['p50_us']:7.1f} us  p99 {mine['p99_us']:7.1f} | "
            f"log p50 {raw['p50_us']:.1f} us p99 {raw['p99_us']:.1f}"
        )

    # 4 + 5 ---------------------------------------------------------------------------
    def _build(self, keys: int, tail: int) -> str:
        """A flushed map of ``keys`` keys (written straight to the data topic, as flushes
        would) plus ``tail`` updates in the ops topic after the flush point."""
        path = self.fresh()
        db, m = self.open(path)
        m.close()
        for j in range(0, keys, 10000):
            db.log.append(
                "bench", 0, [Record(key(i).encode(), VALUE) for i in range(j, min(keys, j + 10000))]
            )
        end = db.log.end_offset("bench_ops", 0)
        db.log.append("bench", 0, [Record(FLUSH_POINT_KEY, msgpack.packb([end - 1]))])
        db.close()
        db, m = self.open(path, max_in_flight=20000)
        for f in [m.put_async(key(i), b"w" * 100) for i in range(tail)]:
            f.result()
        db.close()
        return path

    def bootstrap(self) -> None:
        keys = 100_000 if self.quick else 1_000_000
        path = self._build(keys, 10_000)
        times, base = [], []
        for _ in range(3):
            gc.collect()
            t = time.perf_counter()
            db, m = self.open(path)
            times.append(time.perf_counter() - t)
            assert len(m) == keys, len(m)
            db.close()
            # Freed now, not when the next round's open rebinds the names: a closed map still
            # holds its store's dict (ReplicaMap._lookup), ~30 ms to free for 1M keys.
            del db, m
            log = EmbeddedLog(path, background_cleaner=False)
            gc.collect()
            t = time.perf_counter()
            state: dict[bytes, bytes | None] = {}
            pos = 0
            while got := log.read("bench", 0, pos, max_records=10000):
                for r in got:
                    state[r.key or b""] = r.value
                pos = (got[-1].offset or 0) + 1
            base.append(time.perf_counter() - t)
            log.close()
        mine, raw = statistics.median(times), statistics.median(base)
        self.results["bootstrap"] = {
            "keys": keys,
            "s": mine,
            "keys_s": keys / mine,
            "raw_read_s": raw,
            "ratio": mine / raw,
        }
        print(
            f"bootstrap     {keys} keys in {mine:.3f} s ({keys / mine:,.0f} keys/s) | "
            f"raw read into dict {raw:.3f} s | ratio {mine / raw:.2f}x"
        )
        self._restart(path, keys, mine)

    def _restart(self, path: str, keys: int, dict_boot: float) -> None:
        store = os.path.join(self.root, "lmdb-store")
        t = time.perf_counter()
        db, m = self.open(path, store="lmdb", store_path=store)
        first = time.perf_counter() - t
        db.close()
        times = []
        for _ in range(5):
            gc.collect()
            t = time.perf_counter()
            db, m = self.open(path, store="lmdb", store_path=store)
            times.append(time.perf_counter() - t)
            assert len(m) == keys
            db.close()
        mine = statistics.median(times[1:])
        self.results["restart"] = {
            "keys": keys,
            "s": mine,
            "first_load_s": first,
            "dict_bootstrap_s": dict_boot,
        }
        print(
            f"restart lmdb  {keys} keys ready in {mine:.3f} s (first load {first:.1f} s) | "
            f"dict bootstrap {dict_boot:.3f} s | ratio {mine / dict_boot:.3f}"
        )

    # 6 -------------------------------------------------------------------------------
    def linearizable(self) -> None:
        seconds = 1.0 if self.quick else 3.0
        path = self.fresh()
        db, m = self.open(path)
        m.update({key(i): VALUE for i in range(1000)})
        db.close()
        out = {}
        for mode in ("offset", "shared", "per-read"):
            rates = []
            for _ in range(3):
                db, m = self.open(path, consistency="linearizable", barriers=mode)
                rates.append(read_rate(lambda i, get=m.__getitem__: get, 32, seconds))
                db.close()
            out[mode] = statistics.median(rates)
        ratio = out["offset"] / out["per-read"]
        self.results["linearizable"] = {**out, "ratio": ratio}
        print(
            f"linearizable  {out['offset']:9.0f} reads/s (32 threads, end-offset barriers) | "
            f"shared barrier records {out['shared']:9.0f} | one barrier record per read "
            f"{out['per-read']:9.0f} | ratio {ratio:.1f}x"
        )

    # 7 -------------------------------------------------------------------------------
    def sharded(self) -> None:
        puts, pairs, seconds = (1000, 20_000, 1.0) if self.quick else (5000, 100_000, 3.0)
        batch = [(key(i), VALUE) for i in range(pairs)]
        figures: dict[int, dict[str, list[float]]] = {
            n: {"put_p50_us": [], "put_all": [], "linearizable": []} for n in (8, 1)
        }
        for _ in range(3):
            for n, out in figures.items():
                db, m = self.open(self.fresh(), partitions=n)
                samples = []
                for i in range(puts):
                    t = time.perf_counter_ns()
                    m.put(key(i), VALUE)
                    samples.append(time.perf_counter_ns() - t)
                out["put_p50_us"].append(lat(samples[puts // 10 :])["p50_us"])
                db.close()
                db, m = self.open(self.fresh(), partitions=n)
                gc.collect()
                t = time.perf_counter()
                m.put_all(batch)
                out["put_all"].append(pairs / (time.perf_counter() - t))
                db.close()
                path = self.fresh()
                db, m = self.open(path, partitions=n)
                m.put_all(batch[:1000])
                db.close()
                db, m = self.open(path, consistency="linearizable")
                out["linearizable"].append(read_rate(lambda i, get=m.__getitem__: get, 32, seconds))
                db.close()
        medians = {
            n: {name: statistics.median(values) for name, values in out.items()}
            for n, out in figures.items()
        }
        sharded, single = medians[8], medians[1]
        ratios = {name: sharded[name] / single[name] for name in sharded}
        self.results["sharded"] = {"8": sharded, "1": single, "ratio": ratios}
        print(
            f"sharded       8 partitions: put p50 {sharded['put_p50_us']:.1f} us, put_all "
            f"{sharded['put_all']:9.0f}/s, linearizable {sharded['linearizable']:9.0f} reads/s "
            f"| 1 partition: {single['put_p50_us']:.1f} us, {single['put_all']:9.0f}/s, "
            f"{single['linearizable']:9.0f} reads/s | ratios {ratios['put_p50_us']:.2f}, "
            f"{ratios['put_all']:.2f}, {ratios['linearizable']:.2f}"
        )


def _map_writer(path: str, n: int) -> None:
    db = kafkakv.connect(path, background_cleaner=False)
    m = db.map("bench", value_codec="bytes", flush_period=5000)
    for _ in range(n):
        m.put("ping", str(time.monotonic_ns()).encode())
        time.sleep(0.002)
    db.close()


def _log_writer(path: str, n: int) -> None:
    log = EmbeddedLog(path, background_cleaner=False)
    for _ in range(n):
        log.append("raw", 0, [Record(b"ping", str(time.monotonic_ns()).encode())])
        time.sleep(0.002)
    log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="sync,async,visibility,bootstrap,linearizable,sharded")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="kafkakv-bench-map-", dir=args.dir)
    bench = Bench(root, args.quick)
    steps: dict[str, Callable[[], None]] = {
        "sync": bench.sync,
        "async": bench.async_,
        "visibility": bench.visibility,
        "bootstrap": bench.bootstrap,  # includes restart
        "restart": bench.bootstrap,
        "linearizable": bench.linearizable,
        "sharded": bench.sharded,
    }
    print(machine())
    try:
        done = set()
        for name in args.only.split(","):
            step = steps[name.strip()]
            if step not in done:
                done.add(step)
                step()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"machine": machine(), **bench.results}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
