"""kafkakv next to the stores a Python user would weigh it against, on the same workloads, in
the same run.

Command (from the project root)::

    .venv/bin/python benchmarks/bench_peers.py [--quick] [--rounds N] [--only NAMES] [--dir DIR]
                                               [--in-process]

NAMES is a comma-separated subset of ``sync_put,sync_put_fsync,bulk_write,local_read,
linearizable_read,visibility,bootstrap``. ``--quick`` shrinks every workload; ``--rounds``
(default 3) sets how many times each system is measured. The script prints the machine, the
systems it skips and why, one line per measurement, a markdown table of the results and, last,
one JSON object with every number.

Systems. kafkakv on the embedded log in a scratch directory (``fsync="interval"``, the
default, unless said otherwise). SQLite from the standard library: WAL journal, one table
``kv (k TEXT PRIMARY KEY, v BLOB)`` written with ``INSERT OR REPLACE``, ``synchronous=NORMAL``
unless said otherwise. diskcache, if installed. Redis through redis-py, if ``redis-server`` is
on PATH: the script starts its own server on a free 127.0.0.1 port in a scratch directory,
without snapshots (``--save ''``) except to build the bootstrap dump. etcd, if ``etcd`` is on
PATH: a single-member cluster of its own on free 127.0.0.1 ports, reached through its v3 JSON
gateway with ``http.client`` on a kept-alive connection per thread (no new dependency); every
etcd write is committed to its fsynced write-ahead log, so its puts pay a disk flush. Every
server the script starts is stopped when it ends, on Ctrl-C too.

Workload: str keys of 16 characters, bytes values of 100 bytes (``_common.key``,
``_common.VALUE``). kafkakv's target for each is in brackets.

1. ``sync_put``: one client writes new keys in a loop; per-call latency after a warm-up.
   ``m.put``; SQLite autocommit; ``cache[k] = v``; Redis SET; etcd put (fewer calls, it
   flushes its disk each time). [p50 <= 20 us]
2. ``sync_put_fsync``: the same, durable on return: kafkakv on a log opened with
   ``fsync="always"``. Baseline: ``os.write`` of a 130-byte record appended to a file, then
   ``os.fdatasync``. Also SQLite ``synchronous=FULL``. [p50 <= 1.15 x the baseline's]
3. ``bulk_write``: N pairs into a fresh store; updates/s. kafkakv ``m.put_all(pairs)`` (the
   batch API) and, as a second row, ``put_async`` of every pair then ``result()`` of every
   future; SQLite ``executemany`` of 1,000 rows per transaction; diskcache 1,000 sets per
   ``transact()``; Redis pipelines of 1,000 SETs. [put_all >= 600k/s, put_async >= 250k/s]
4. ``local_read``: one thread reads every key of a store of 100,000 in a shuffled order,
   passes repeated for at least 0.2 s; reads/s. ``m[k]``; baseline a plain dict, ``d[k]``
   (both with the ``[]`` operator in the loop); SQLite SELECT; ``cache[k]``; Redis GET.
   The floor column is what any store keyed by bytes pays, kafkakv's included: a dict of the
   keys as bytes with a value object per key (as a store holds them), read as
   ``d[k.encode()]`` in the loop. [>= 3M/s]
5. ``linearizable_read``: 32 threads read random keys out of 1,000 for 2 s after a warm-up;
   reads/s. kafkakv ``m[k]`` on a map opened with ``consistency="linearizable"``; baseline the
   same map with local reads; etcd range requests, linearizable by default. [>= 500k/s]
6. ``visibility``: a writer process (spawned) puts one key every 2 ms (``--gap-ms``), its
   value carrying ``time.monotonic_ns()``; the parent reports how long each value took to
   reach it. kafkakv: a listener (``m.add_listener``); SQLite: a reader polling with a 0.1 ms
   sleep; Redis: keyspace notifications (``notify-keyspace-events KA``, ``psubscribe``), then
   a GET. The floor column is the wake-up alone, in Python at both ends as kafkakv is: the
   writer ``pwrite``s the stamp into a file, the reader sleeps in ``poll`` on an inotify watch
   of it and ``pread``s the stamp when woken; no log, no map. Before the writer starts, the
   reader's CPU over 2 s with nothing written (``time.process_time`` of the whole process, as
   % of one core), for kafkakv's open map and for SQLite's poller. [p50 <= 100 us, p99 <= 300
   us, idle CPU ~ 0 (<= 1 %); the targets are for the default 2 ms]
7. ``bootstrap``: a new replica ready with 1,000,000 keys. The kafkakv map is flushed and
   compacted: its records are written straight to the data topic (each key once, as flushes
   then compaction would leave them), with the flush point; timed: ``connect()`` plus
   ``db.map()`` in this process. Baseline: reading a file of 1M length-prefixed pairs and
   building a dict. Redis: from starting ``redis-server`` on a ``dump.rdb`` of the same keys
   until PING answers and DBSIZE counts them all. [<= 0.6 s]

Each workload runs in a fresh process of its own (the script runs itself with ``--only`` and
one name), with servers of its own: no workload's figures depend on which ran before it. In one
process, the reads walked a heap that the workloads before them had scattered: after the sync
puts (tens of thousands of small objects each) kafkakv's local reads and their floor both came
out at about half what they are alone (1.8 and 1.5 M/s against 4.5 and 3.4, 29 November; after
the bulk writes alone, 3.6 and 2.5). ``--in-process`` runs them all in this process as before.

Systems are interleaved round by round (round 1 measures every system, then round 2...), the
order rotating by one each round; each system reports the median of its rounds (latencies: the
median over rounds of each round's percentile over every call after the warm-up). No means.
Each workload also prints kafkakv / the best peer (SQLite, diskcache, Redis, etcd) and, where
there is one, kafkakv / the baseline, and the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import dataclasses
import gc
import http.client
import importlib
import json
import multiprocessing as mp
import os
import random
import select
import shutil
import socket
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
from _common import (
    VALUE,
    die_with_parent,
    free_port,
    key,
    lat,
    machine,
    read_rate,
    terminate_as_interrupt,
)

import kafkakv
from kafkakv.log import Record
from kafkakv.map import FLUSH_POINT_KEY

WORKLOADS = (
    "sync_put",
    "sync_put_fsync",
    "bulk_write",
    "local_read",
    "linearizable_read",
    "visibility",
    "bootstrap",
)
COLUMNS = ("kafkakv", "baseline", "floor", "sqlite", "diskcache", "redis", "etcd")
PEERS = ("sqlite", "diskcache", "redis", "etcd")
UNITS = {"us": "us", "ops": "/s", "s": "s", "pct": "% of a core"}
SQL_PUT = "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)"
SQL_GET = "SELECT v FROM kv WHERE k = ?"
HEADER = struct.Struct(">HI")
"""A pair in the bootstrap baseline's file: key length, value length, then both."""


@dataclasses.dataclass
class Metric:
    """One row of the results: per column, one figure per round."""

    name: str
    unit: str  # a key of UNITS
    higher: bool  # a bigger figure is better
    target: str
    labels: dict[str, str]  # column -> what it measures
    met: Callable[[dict[str, float]], bool] | None = None
    rounds: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def add(self, column: str, value: float) -> None:
        self.rounds.setdefault(column, []).append(value)

    def medians(self) -> dict[str, float]:
        return {c: statistics.median(v) for c, v in self.rounds.items()}

    def best_peer(self) -> str | None:
        peers = [c for c in PEERS if c in self.rounds]
        if not peers:
            return None
        med = self.medians()
        return max(peers, key=lambda c: med[c] if self.higher else -med[c])

    def verdict(self) -> str:
        if self.met is None or "kafkakv" not in self.rounds:
            return "—"
        return "yes" if self.met(self.medians()) else "NO"


def fmt(value: float, unit: str) -> str:
    if unit == "us":
        return f"{value:.1f} us"
    if unit == "ops":
        return f"{value:,.0f}/s"
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:.2f} %"


def redis_ask(port: int, command: bytes) -> bytes | None:
    """The first reply line of one inline command on a new connection; None if refused."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(command + b"\r\n")
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = s.recv(4096)
                if not chunk:
                    return None
                reply += chunk
            return reply.strip()
    except OSError:
        return None


class EtcdClient:
    """etcd's v3 JSON gateway on one kept-alive HTTP connection (one per thread)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, path: str, body: dict[str, str]) -> dict[str, Any]:
        self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"etcd {path}: HTTP {resp.status} {data[:200]!r}")
        out: dict[str, Any] = json.loads(data)
        return out

    def put(self, k: str, v: bytes) -> None:
        self.call(
            "/v3/kv/put",
            {"key": base64.b64encode(k.encode()).decode(), "value": base64.b64encode(v).decode()},
        )

    def get(self, k: str) -> bytes | None:
        out = self.call("/v3/kv/range", {"key": base64.b64encode(k.encode()).decode()})
        kvs = out.get("kvs")
        return base64.b64decode(kvs[0]["value"]) if kvs else None

    def close(self) -> None:
        self.conn.close()


class Bench:
    def __init__(self, root: str, quick: bool, rounds: int, gap_ms: float = 2.0) -> None:
        self.root = root
        self.quick = quick
        self.rounds = rounds
        self.gap_ms = gap_ms  # between two updates of the visibility writers
        self.n = 0
        self.metrics: list[Metric] = []
        self.results: dict[str, Any] = {"skipped": {}}
        self.servers: list[subprocess.Popen[bytes]] = []
        self.children: list[Any] = []  # writer processes
        self.diskcache: Any = self._optional("diskcache", "diskcache", "diskcache>=5.6,<6")
        self.redis: Any = None
        self.redis_port = 0
        self.etcd: EtcdClient | None = None
        self.etcd_port = 0
        if shutil.which("redis-server") is None:
            self.skip("redis", "redis-server not installed: apt-get install redis-server")
        else:
            self.redis = self._optional("redis", "redis-py", "redis>=5,<7")
        if shutil.which("etcd") is None:
            self.skip("etcd", "etcd not installed: apt-get install etcd-server")

    def skip(self, system: str, why: str) -> None:
        self.results["skipped"][system] = why
        print(f"{system}: skipped ({why})")

    def _optional(self, module: str, package: str, requirement: str) -> Any:
        try:
            return importlib.import_module(module)
        except ImportError:
            self.skip(module, f"{package} not installed: pip install '{requirement}'")
            return None

    def fresh(self, name: str = "store") -> str:
        self.n += 1
        return os.path.join(self.root, f"{name}{self.n}")

    def open(self, path: str, fsync: str = "interval", **options: Any) -> tuple[Any, Any]:
        db = kafkakv.connect(path, background_cleaner=False, fsync=fsync)
        options.setdefault("value_codec", "bytes")
        options.setdefault("flush_period", 5000)
        return db, db.map("bench", **options)

    # -- servers ------------------------------------------------------------------------
    def start(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                die_with_parent(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.servers.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc in self.servers:
            self.servers.remove(proc)

    def start_redis(self, directory: str, snapshots: bool = False) -> tuple[Any, int]:
        """A redis-server of ours; returns it and its port once it answers PING."""
        os.makedirs(directory, exist_ok=True)
        port = free_port()
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", directory]
        argv += ["--appendonly", "no", "--protected-mode", "no"]
        if not snapshots:
            argv += ["--save", ""]
        proc = self.start(argv, os.path.join(directory, "redis.log"))
        deadline = time.monotonic() + 60
        while redis_ask(port, b"PING") != b"+PONG":
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: see {directory}/redis.log")
            time.sleep(0.001)
        return proc, port

    def servers_up(self, names: list[str]) -> None:
        needs_redis = {"sync_put", "bulk_write", "local_read", "visibility"}
        if self.redis is not None and needs_redis & set(names):
            _, self.redis_port = self.start_redis(os.path.join(self.root, "redis"))
            print(f"redis: redis-server {self._version(['redis-server', '--version'])}")
        if shutil.which("etcd") and {"sync_put", "linearizable_read"} & set(names):
            self.etcd_port = free_port()
            peer = free_port()
            client, peer_url = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{peer}"
            data = os.path.join(self.root, "etcd")
            os.makedirs(data)
            argv = ["etcd", "--name", "bench", "--data-dir", data]
            argv += ["--listen-client-urls", client, "--advertise-client-urls", client]
            argv += ["--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url]
            argv += ["--initial-cluster", f"bench={peer_url}", "--logger", "zap"]
            argv += ["--log-level", "error"]
            proc = self.start(argv, os.path.join(self.root, "etcd.log"))
            deadline = time.monotonic() + 60
            while True:
                try:
                    etcd = EtcdClient(self.etcd_port)
                    etcd.put("ready", b"1")
                    self.etcd = etcd
                    break
                except (OSError, RuntimeError, http.client.HTTPException):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("etcd did not start: see etcd.log") from None
                    time.sleep(0.01)
            print(f"etcd: {self._version(['etcd', '--version']).splitlines()[0]}")

    def _version(self, argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()

    def redis_client(self) -> Any:
        return self.redis.Redis(host="127.0.0.1", port=self.redis_port)

    def close(self) -> None:
        for child in self.children:
            if child.is_alive():
                child.terminate()
            child.join(10)
        self.children.clear()
        if self.etcd is not None:
            self.etcd.close()
        for proc in list(self.servers):
            self.stop(proc)

    # -- rounds -------------------------------------------------------------------------
    def run(self, name: str, systems: list[tuple[str, Callable[[int], None]]]) -> None:
        """Measure every system once per round, the order rotating by one each round."""
        load = os.getloadavg()[0]
        for r in range(self.rounds):
            shift = r % len(systems)
            for _, measure in systems[shift:] + systems[:shift]:
                gc.collect()
                measure(r)
        after = os.getloadavg()[0]
        self.report(name, load, after)

    def metric(self, *args: Any, **kwargs: Any) -> Metric:
        m = Metric(*args, **kwargs)
        self.metrics.append(m)
        return m

    def report(self, name: str, load_before: float, load_after: float) -> None:
        out: dict[str, Any] = {"load_1m_before": load_before, "load_1m_after": load_after}
        for m in [m for m in self.metrics if m.name.startswith(name)]:
            med = m.medians()
            unit = UNITS[m.unit]
            entry: dict[str, Any] = {"unit": unit, "target": m.target, "met": m.verdict()}
            for column in COLUMNS:
                if column not in med:
                    continue
                rounds = ", ".join(fmt(v, m.unit) for v in m.rounds[column])
                print(
                    f"{m.name:<28} {column:<9} {fmt(med[column], m.unit):>14}  "
                    f"({m.labels[column]}; rounds: {rounds})"
                )
                entry[column] = {"median": med[column], "rounds": m.rounds[column]}
                entry[column]["what"] = m.labels[column]
            ratios = []
            best = m.best_peer()
            if "kafkakv" in med and best is not None:
                entry["ratio_best_peer"] = med["kafkakv"] / med[best]
                entry["best_peer"] = best
                ratios.append(f"kafkakv / best peer ({best}) {entry['ratio_best_peer']:.3g}")
            for column in ("baseline", "floor"):
                if "kafkakv" in med and column in med:
                    entry[f"ratio_{column}"] = med["kafkakv"] / med[column]
                    ratios.append(f"kafkakv / {column} {entry[f'ratio_{column}']:.3g}")
            better = "higher" if m.higher else "lower"
            print(
                f"{m.name:<28} {' | '.join(ratios) or 'no ratio'} ({better} is better); "
                f"target {m.target}: {m.verdict()}"
            )
            out[m.name] = entry
        print(f"{name:<28} load average (1 min) before {load_before:.2f}, after {load_after:.2f}")
        self.results[name] = out

    # 1 -------------------------------------------------------------------------------
    def sync_put(self) -> None:
        n, warm = (3000, 300) if self.quick else (20000, 2000)
        keys = [key(i) for i in range(n)]
        labels = {
            "kafkakv": "m.put(k, v)",
            "sqlite": "autocommit INSERT OR REPLACE, synchronous=NORMAL",
            "diskcache": "cache[k] = v",
            "redis": "SET",
            "etcd": f"put via the JSON gateway, {n // 10} calls",
        }
        p50 = self.metric(
            "sync_put p50", "us", False, "<= 20 us", labels, lambda m: m["kafkakv"] <= 20
        )
        p99 = self.metric("sync_put p99", "us", False, "—", labels)

        def record(column: str, samples: list[int], skip: int = warm) -> None:
            figures = lat(samples[skip:])
            p50.add(column, figures["p50_us"])
            p99.add(column, figures["p99_us"])

        def kv(r: int) -> None:
            path = self.fresh()
            db, m = self.open(path)
            record("kafkakv", _latencies(m.put, keys))
            db.close()
            shutil.rmtree(path)

        def lite(r: int) -> None:
            path = self.fresh()
            con = _sqlite(path, "NORMAL")
            record("sqlite", _latencies(lambda k, v: con.execute(SQL_PUT, (k, v)), keys))
            con.close()
            shutil.rmtree(path)

        systems: list[tuple[str, Callable[[int], None]]] = [("kafkakv", kv), ("sqlite", lite)]
        if self.diskcache is not None:

            def dc(r: int) -> None:
                path = self.fresh()
                cache = self.diskcache.Cache(path)
                record("diskcache", _latencies(cache.__setitem__, keys))
                cache.close()
                shutil.rmtree(path)

            systems.append(("diskcache", dc))
        if self.redis_port:
            client = self.redis_client()

            def rd(r: int) -> None:
                client.flushall()
                record("redis", _latencies(client.set, keys))

            systems.append(("redis", rd))
        if self.etcd is not None:
            etcd = self.etcd

            def ec(r: int) -> None:
                few = [f"r{r}" + k[len(f"r{r}") :] for k in keys[: n // 10]]
                record("etcd", _latencies(etcd.put, few), warm // 10)

            systems.append(("etcd", ec))
        self.run("sync_put", systems)

    # 2 -------------------------------------------------------------------------------
    def sync_put_fsync(self) -> None:
        n, warm = (300, 50) if self.quick else (2000, 200)
        keys = [key(i) for i in range(n)]
        labels = {
            "kafkakv": "m.put(k, v) on a log with fsync='always'",
            "baseline": "os.write of a 130-byte record appended to a file + os.fdatasync",
            "sqlite": "autocommit INSERT OR REPLACE, synchronous=FULL",
        }
        p50 = self.metric(
            "sync_put_fsync p50",
            "us",
            False,
            "<= 1.15 x baseline",
            labels,
            lambda m: m["kafkakv"] <= 1.15 * m["baseline"],
        )
        p99 = self.metric("sync_put_fsync p99", "us", False, "—", labels)

        def record(column: str, samples: list[int]) -> None:
            figures = lat(samples[warm:])
            p50.add(column, figures["p50_us"])
            p99.add(column, figures["p99_us"])

        def kv(r: int) -> None:
            path = self.fresh()
            db, m = self.open(path, fsync="always")
            record("kafkakv", _latencies(m.put, keys))
            db.close()
            shutil.rmtree(path)

        def raw(r: int) -> None:
            path = self.fresh("raw")
            records = [k.encode() + VALUE + bytes(14) for k in keys]
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            samples = []
            for rec in records:
                t = time.perf_counter_ns()
                os.write(fd, rec)
                os.fdatasync(fd)
                samples.append(time.perf_counter_ns() - t)
            os.close(fd)
            os.unlink(path)
            record("baseline", samples)

        def lite(r: int) -> None:
            path = self.fresh()
            con = _sqlite(path, "FULL")
            record("sqlite", _latencies(lambda k, v: con.execute(SQL_PUT, (k, v)), keys))
            con.close()
            shutil.rmtree(path)

        self.run("sync_put_fsync", [("kafkakv", kv), ("baseline", raw), ("sqlite", lite)])

    # 3 -------------------------------------------------------------------------------
    def bulk_write(self) -> None:
        n = 20_000 if self.quick else 200_000
        keys = [key(i) for i in range(n)]
        pairs = [(k, VALUE) for k in keys]
        peers = {
            "sqlite": "executemany, 1,000 rows per transaction, synchronous=NORMAL",
            "diskcache": "1,000 sets per cache.transact()",
            "redis": "pipelines of 1,000 SETs",
        }
        batch = self.metric(
            "bulk_write put_all",
            "ops",
            True,
            ">= 600k/s",
            {"kafkakv": "m.put_all(pairs)", **peers},
            lambda m: m["kafkakv"] >= 6e5,
        )
        each = self.metric(
            "bulk_write put_async",
            "ops",
            True,
            ">= 250k/s",
            {"kafkakv": "put_async of every pair, then result() of each", **peers},
            lambda m: m["kafkakv"] >= 2.5e5,
        )

        def record(column: str, seconds: float) -> None:
            batch.add(column, n / seconds)
            each.add(column, n / seconds)

        def kv_batch(r: int) -> None:
            path = self.fresh()
            db, m = self.open(path, max_in_flight=20000)
            t = time.perf_counter()
            m.put_all(pairs)
            batch.add("kafkakv", n / (time.perf_counter() - t))
            db.close()
            shutil.rmtree(path)

        def kv_async(r: int) -> None:
            path = self.fresh()
            db, m = self.open(path, max_in_flight=20000)
            t = time.perf_counter()
            futures = [m.put_async(k, v) for k, v in pairs]
            for f in futures:
                f.result()
            each.add("kafkakv", n / (time.perf_counter() - t))
            del futures
            db.close()
            shutil.rmtree(path)

        def lite(r: int) -> None:
            path = self.fresh()
            con = _sqlite(path, "NORMAL")
            t = time.perf_counter()
            for j in range(0, n, 1000):
                con.execute("BEGIN")
                con.executemany(SQL_PUT, pairs[j : j + 1000])
                con.execute("COMMIT")
            record("sqlite", time.perf_counter() - t)
            con.close()
            shutil.rmtree(path)

        systems: list[tuple[str, Callable[[int], None]]] = [
            ("kafkakv", kv_batch),
            ("kafkakv", kv_async),
            ("sqlite", lite),
        ]
        if self.diskcache is not None:

            def dc(r: int) -> None:
                path = self.fresh()
                cache = self.diskcache.Cache(path)
                t = time.perf_counter()
                for j in range(0, n, 1000):
                    with cache.transact():
                        for k, v in pairs[j : j + 1000]:
                            cache[k] = v
                record("diskcache", time.perf_counter() - t)
                cache.close()
                shutil.rmtree(path)

            systems.append(("diskcache", dc))
        if self.redis_port:
            client = self.redis_client()

            def rd(r: int) -> None:
                client.flushall()
                t = time.perf_counter()
                for j in range(0, n, 1000):
                    pipe = client.pipeline(transaction=False)
                    for k, v in pairs[j : j + 1000]:
                        pipe.set(k, v)
                    pipe.execute()
                record("redis", time.perf_counter() - t)
                client.flushall()

            systems.append(("redis", rd))
        self.run("bulk_write", systems)

    # 4 -------------------------------------------------------------------------------
    def local_read(self) -> None:
        n = 20_000 if self.quick else 100_000
        keys = [key(i) for i in range(n)]
        pairs = [(k, VALUE) for k in keys]
        order = keys[:]
        random.Random(4).shuffle(order)
        labels = {
            "kafkakv": "m[k]",
            "baseline": "a plain dict, d[k]",
            "floor": "a dict keyed by bytes, a value object per key, d[k.encode()]",
            "sqlite": "SELECT v FROM kv WHERE k = ?",
            "diskcache": "cache[k]",
            "redis": "GET",
        }
        rate = self.metric(
            "local_read", "ops", True, ">= 3M/s", labels, lambda m: m["kafkakv"] >= 3e6
        )
        path = self.fresh()
        db, m = self.open(path, max_in_flight=20000)
        # A value object per key, as the floor has: the writer's store keeps the objects it
        # was given (other replicas decode their own), and one shared value stays in cache.
        m.update([(k, bytes(bytearray(VALUE))) for k in keys])
        plain = dict(pairs)
        # Keyed and valued as a store is: bytes keys decoded apart from the probes, and each
        # value its own object (the plain dict shares one value object, always in cache).
        floor = {k.encode(): bytes(bytearray(VALUE)) for k in keys}
        con = _sqlite(self.fresh(), "NORMAL")
        con.execute("BEGIN")
        con.executemany(SQL_PUT, pairs)
        con.execute("COMMIT")
        cur = con.cursor()

        def lite_get(k: str) -> Any:
            return cur.execute(SQL_GET, (k,)).fetchone()[0]

        readers: dict[str, Callable[[str], Any]] = {
            "kafkakv": m.__getitem__,
            "baseline": plain.__getitem__,
            "floor": lambda k: floor[k.encode()],
            "sqlite": lite_get,
        }
        cache = None
        if self.diskcache is not None:
            cache = self.diskcache.Cache(self.fresh())
            with cache.transact():
                for k, v in pairs:
                    cache[k] = v
            readers["diskcache"] = cache.__getitem__
        if self.redis_port:
            client = self.redis_client()
            client.flushall()
            for j in range(0, n, 1000):
                pipe = client.pipeline(transaction=False)
                for k, v in pairs[j : j + 1000]:
                    pipe.set(k, v)
                pipe.execute()
            readers["redis"] = client.get
        for column, get in readers.items():
            assert get(keys[-1]) == VALUE, column

        # kafkakv and the dict are read as the labels say, with the [] operator (a call of
        # m.__getitem__ would add a method-wrapper call to each read); the others by a call.
        subscripted = {"kafkakv": m, "baseline": plain}

        def measure(column: str) -> Callable[[int], None]:
            get = readers[column]
            store = subscripted.get(column)

            def go(r: int) -> None:
                reads, t = 0, time.perf_counter()
                while True:
                    if store is not None:
                        for k in order:
                            store[k]
                    elif column == "floor":  # inline, as the label says: no call per read
                        for k in order:
                            floor[k.encode()]
                    else:
                        for k in order:
                            get(k)
                    reads += n
                    elapsed = time.perf_counter() - t
                    if elapsed >= 0.2:
                        break
                rate.add(column, reads / elapsed)

            return go

        try:
            self.run("local_read", [(c, measure(c)) for c in readers])
        finally:
            db.close()
            con.close()
            if cache is not None:
                cache.close()

    # 5 -------------------------------------------------------------------------------
    def linearizable_read(self) -> None:
        seconds = 1.0 if self.quick else 2.0
        labels = {
            "kafkakv": "m[k], consistency='linearizable', 32 threads",
            "baseline": "m[k], consistency='local', 32 threads",
            "etcd": "range (linearizable) via the JSON gateway, 32 threads",
        }
        rate = self.metric(
            "linearizable_read", "ops", True, ">= 500k/s", labels, lambda m: m["kafkakv"] >= 5e5
        )
        path = self.fresh()
        db, m = self.open(path)
        m.update({key(i): VALUE for i in range(1000)})
        db.close()

        def kv(consistency: str, column: str) -> Callable[[int], None]:
            def go(r: int) -> None:
                db, m = self.open(path, consistency=consistency)
                rate.add(column, read_rate(lambda i: m.__getitem__, 32, seconds))
                db.close()

            return go

        systems = [
            ("kafkakv", kv("linearizable", "kafkakv")),
            ("baseline", kv("local", "baseline")),
        ]
        if self.etcd is not None:
            for i in range(1000):
                self.etcd.put(key(i), VALUE)
            port = self.etcd_port

            def ec(r: int) -> None:
                clients = [EtcdClient(port) for _ in range(32)]
                rate.add("etcd", read_rate(lambda i: clients[i].get, 32, seconds))
                for c in clients:
                    c.close()

            systems.append(("etcd", ec))
        self.run("linearizable_read", systems)

    # 6 -------------------------------------------------------------------------------
    def visibility(self) -> None:
        n = 200 if self.quick else 1000
        idle = 1.0 if self.quick else 2.0
        labels = {
            "kafkakv": "listener of the map, writer m.put in another process",
            "sqlite": "reader polling SELECT with a 0.1 ms sleep, writer autocommit",
            "redis": "keyspace notification (psubscribe) then GET, writer SET",
            "floor": "pwrite of the stamp to a file, woken by inotify (poll), then pread",
        }
        p50 = self.metric(
            "visibility p50", "us", False, "<= 100 us", labels, lambda m: m["kafkakv"] <= 100
        )
        p99 = self.metric(
            "visibility p99", "us", False, "<= 300 us", labels, lambda m: m["kafkakv"] <= 300
        )
        cpu = self.metric(
            "visibility idle CPU",
            "pct",
            False,
            "~ 0 (<= 1 %)",
            {
                "kafkakv": f"the process with the map open, nothing written, {idle:g} s",
                "sqlite": f"the process polling, nothing written, {idle:g} s",
            },
            lambda m: m["kafkakv"] <= 1.0,
        )
        ctx = mp.get_context("spawn")

        def record(column: str, seen: list[int]) -> None:
            figures = lat(seen[50:])
            p50.add(column, figures["p50_us"])
            p99.add(column, figures["p99_us"])

        def writer(target: Callable[..., None], *args: Any) -> Any:
            proc = ctx.Process(target=target, args=(*args, n + 50, self.gap_ms / 1000))
            self.children.append(proc)
            proc.start()
            return proc

        def finish(proc: Any) -> None:
            proc.join(60)
            self.children.remove(proc)

        def kv(r: int) -> None:
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
            time.sleep(0.2)
            c, t = time.process_time(), time.perf_counter()
            time.sleep(idle)
            cpu.add("kafkakv", 100 * (time.process_time() - c) / (time.perf_counter() - t))
            proc = writer(_kafkakv_writer, path)
            done.wait(120)
            finish(proc)
            db.close()
            record("kafkakv", seen)

        def lite(r: int) -> None:
            path = self.fresh()
            _sqlite(path, "NORMAL").close()
            con = sqlite3.connect(os.path.join(path, "db.sqlite"), isolation_level=None)
            cur = con.cursor()
            seen: list[int] = []
            last = None
            c, t = time.process_time(), time.perf_counter()
            while time.perf_counter() - t < idle:
                cur.execute(SQL_GET, ("ping",)).fetchone()
                time.sleep(0.0001)
            cpu.add("sqlite", 100 * (time.process_time() - c) / (time.perf_counter() - t))
            proc = writer(_sqlite_writer, path)
            deadline = time.monotonic() + 120
            while len(seen) < n and time.monotonic() < deadline:
                row = cur.execute(SQL_GET, ("ping",)).fetchone()
                if row is not None and row[0] != last:
                    seen.append(time.monotonic_ns() - int(row[0]))
                    last = row[0]
                time.sleep(0.0001)
            finish(proc)
            con.close()
            record("sqlite", seen)

        def wake(r: int) -> None:
            folder = self.fresh()
            os.makedirs(folder, exist_ok=True)
            stamp = os.path.join(folder, "stamp")
            with open(stamp, "wb") as f:
                f.write(b"0" * 20)
            watch = _InotifyWatch(stamp)
            fd = os.open(stamp, os.O_RDONLY)
            seen: list[int] = []
            last = b"0" * 20
            proc = writer(_floor_writer, stamp)
            deadline = time.monotonic() + 120
            while len(seen) < n and time.monotonic() < deadline:
                if watch.wait(1.0):
                    value = os.pread(fd, 20, 0)
                    if value != last and len(value) == 20:
                        seen.append(time.monotonic_ns() - int(value))
                        last = value
            finish(proc)
            os.close(fd)
            watch.close()
            record("floor", seen)

        systems: list[tuple[str, Callable[[int], None]]] = [
            ("kafkakv", kv),
            ("sqlite", lite),
            ("floor", wake),
        ]
        if self.redis_port:
            client = self.redis_client()
            client.config_set("notify-keyspace-events", "KA")

            def rd(r: int) -> None:
                client.delete("ping")
                pubsub = client.pubsub()
                pubsub.psubscribe("__keyspace@0__:ping")
                seen: list[int] = []
                proc = writer(_redis_writer, self.redis_port)
                deadline = time.monotonic() + 120
                while len(seen) < n and time.monotonic() < deadline:
                    msg = pubsub.get_message(timeout=1.0)
                    if msg is not None and msg["type"] == "pmessage" and msg["data"] == b"set":
                        value = client.get("ping")
                        seen.append(time.monotonic_ns() - int(value))
                finish(proc)
                pubsub.close()
                record("redis", seen)

            systems.append(("redis", rd))
        self.run("visibility", systems)

    # 7 -------------------------------------------------------------------------------
    def bootstrap(self) -> None:
        keys = 100_000 if self.quick else 1_000_000
        labels = {
            "kafkakv": f"connect() + db.map() of a fresh replica, {keys:,} keys flushed",
            "baseline": f"read a file of {keys:,} length-prefixed pairs, build a dict",
            "redis": f"start redis-server on a dump.rdb of {keys:,} keys until DBSIZE answers",
        }
        ready = self.metric(
            "bootstrap", "s", False, "<= 0.6 s", labels, lambda m: m["kafkakv"] <= 0.6
        )
        path = self.fresh()
        db, m = self.open(path)
        m.close()
        for j in range(0, keys, 10000):
            batch = [Record(key(i).encode(), VALUE) for i in range(j, min(keys, j + 10000))]
            db.log.append("bench", 0, batch)
        end = db.log.end_offset("bench_ops", 0)
        db.log.append("bench", 0, [Record(FLUSH_POINT_KEY, msgpack.packb([end - 1]))])
        db.close()
        flat = self.fresh("pairs")
        with open(flat, "wb") as f:
            for i in range(keys):
                k = key(i).encode()
                f.write(HEADER.pack(len(k), len(VALUE)) + k + VALUE)

        def kv(r: int) -> None:
            t = time.perf_counter()
            db, m = self.open(path)
            ready.add("kafkakv", time.perf_counter() - t)
            assert len(m) == keys, len(m)
            db.close()

        def base(r: int) -> None:
            t = time.perf_counter()
            with open(flat, "rb") as f:
                data = f.read()
            state, pos, end, size = {}, 0, len(data), HEADER.size
            while pos < end:
                kl, vl = HEADER.unpack_from(data, pos)
                pos += size + kl
                state[data[pos - kl : pos]] = data[pos : pos + vl]
                pos += vl
            ready.add("baseline", time.perf_counter() - t)
            assert len(state) == keys, len(state)

        systems: list[tuple[str, Callable[[int], None]]] = [("kafkakv", kv), ("baseline", base)]
        if self.redis is not None:
            directory = os.path.join(self.root, "redis-boot")
            proc, port = self.start_redis(directory, snapshots=True)
            client = self.redis.Redis(host="127.0.0.1", port=port)
            for j in range(0, keys, 10000):
                pipe = client.pipeline(transaction=False)
                for i in range(j, min(keys, j + 10000)):
                    pipe.set(key(i), VALUE)
                pipe.execute()
            client.save()
            client.close()
            self.stop(proc)
            expected = f":{keys}".encode()

            def rd(r: int) -> None:
                t = time.perf_counter()
                proc, port = self.start_redis(directory)
                while redis_ask(port, b"DBSIZE") != expected:
                    time.sleep(0.001)
                ready.add("redis", time.perf_counter() - t)
                self.stop(proc)

            systems.append(("redis", rd))
        self.run("bootstrap", systems)

    # -- results ------------------------------------------------------------------------


def table(metrics: list[Metric]) -> str:
    """The results as a markdown table: a row per metric, the median of each column."""
    columns = [c for c in COLUMNS if any(c in m.rounds for m in metrics)]
    head = ["workload", *columns, "target", "met?"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in metrics:
        med = m.medians()
        cells = [fmt(med[c], m.unit) if c in med else "—" for c in columns]
        lines.append("| " + " | ".join([m.name, *cells, m.target, m.verdict()]) + " |")
    return "\n".join(lines)


def _sqlite(directory: str, synchronous: str) -> sqlite3.Connection:
    """A new SQLite database in ``directory``: WAL, the given ``synchronous``, table kv;
    autocommit unless BEGIN is sent."""
    os.makedirs(directory)
    con = sqlite3.connect(os.path.join(directory, "db.sqlite"), isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(f"PRAGMA synchronous={synchronous}")
    con.execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB)")
    return con


def _latencies(put: Callable[[str, bytes], Any], keys: list[str]) -> list[int]:
    """Nanoseconds of each ``put(k, VALUE)``, one per key."""
    samples = []
    for k in keys:
        t = time.perf_counter_ns()
        put(k, VALUE)
        samples.append(time.perf_counter_ns() - t)
    return samples


def _kafkakv_writer(path: str, n: int, gap: float) -> None:
    db = kafkakv.connect(path, background_cleaner=False)
    m = db.map("bench", value_codec="bytes", flush_period=5000)
    for _ in range(n):
        m.put("ping", str(time.monotonic_ns()).encode())
        time.sleep(gap)
    db.close()


def _floor_writer(path: str, n: int, gap: float) -> None:
    fd = os.open(path, os.O_WRONLY)
    for _ in range(n):
        os.pwrite(fd, b"%020d" % time.monotonic_ns(), 0)
        time.sleep(gap)
    os.close(fd)


class _InotifyWatch:
    """An inotify watch of one file's writes, for the visibility floor (Linux)."""

    def __init__(self, path: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, os.fsencode(path), 0x2) < 0:
            raise OSError(ctypes.get_errno(), "inotify is not available here")
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)

    def wait(self, timeout: float) -> bool:
        """True when writes came (their events read), False after ``timeout`` seconds."""
        if not self.poller.poll(int(timeout * 1000)):
            return False
        os.read(self.fd, 4096)
        return True

    def close(self) -> None:
        os.close(self.fd)


def _sqlite_writer(path: str, n: int, gap: float) -> None:
    con = sqlite3.connect(os.path.join(path, "db.sqlite"), isolation_level=None)
    con.execute("PRAGMA synchronous=NORMAL")
    for _ in range(n):
        con.execute(SQL_PUT, ("ping", str(time.monotonic_ns()).encode()))
        time.sleep(gap)
    con.close()


def _redis_writer(port: int, n: int, gap: float) -> None:
    client = importlib.import_module("redis").Redis(host="127.0.0.1", port=port)
    for _ in range(n):
        client.set("ping", str(time.monotonic_ns()))
        time.sleep(gap)
    client.close()


def _in_children(args: argparse.Namespace, names: list[str]) -> tuple[list[Metric], dict[str, Any]]:
    """Run each workload in a process of its own (this script, ``--only`` that one, its
    results handed back through a file); return their metrics and results, merged."""
    metrics: list[Metric] = []
    results: dict[str, Any] = {"skipped": {}}
    with tempfile.TemporaryDirectory(prefix="kafkakv-bench-peers-", dir=args.dir) as scratch:
        for name in [n for n in WORKLOADS if n in names]:
            out = os.path.join(scratch, f"{name}.json")
            argv = [sys.executable, os.path.abspath(__file__), "--only", name, "--emit", out]
            argv += ["--rounds", str(args.rounds), "--dir", scratch, "--gap-ms", str(args.gap_ms)]
            argv += ["--quick"] if args.quick else []
            sys.stdout.flush()
            done = subprocess.run(argv, check=False)
            if done.returncode:
                raise SystemExit(f"workload {name} failed (exit code {done.returncode})")
            with open(out) as f:
                got = json.load(f)
            results["skipped"].update(got["results"].pop("skipped"))
            results.update(got["results"])
            for row in got["metrics"]:
                verdict = row.pop("verdict")  # "—" where there is no target
                met = None if verdict == "—" else (lambda _m, v=verdict: v == "yes")
                metrics.append(Metric(**row, met=met))
    return metrics, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--dir", default=None)
    parser.add_argument(
        "--in-process", action="store_true", help="every workload in this one process"
    )
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=2.0,
        help="visibility: milliseconds between two updates of the writer (default 2)",
    )
    parser.add_argument("--emit", default=None, help=argparse.SUPPRESS)  # a child's results
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(names) - set(WORKLOADS)
    if unknown or args.rounds < 1 or not args.gap_ms > 0:
        parser.error(f"--only takes {','.join(WORKLOADS)}; --rounds >= 1; --gap-ms > 0")
    load = os.getloadavg()[0]
    if args.emit is None:
        print(machine())
        print(f"load average (1 min) at start {load:.2f}; {args.rounds} rounds")
    if args.emit is None and not args.in_process and len(names) > 1:
        metrics, results = _in_children(args, names)
    else:
        metrics, results = _here(args, names)
    if args.emit is not None:
        rows = [
            {
                "name": m.name,
                "unit": m.unit,
                "higher": m.higher,
                "target": m.target,
                "labels": m.labels,
                "rounds": m.rounds,
                "verdict": m.verdict(),
            }
            for m in metrics
        ]
        with open(args.emit, "w") as f:
            json.dump({"metrics": rows, "results": results}, f)
        return
    after = os.getloadavg()[0]
    print(f"load average (1 min) at end {after:.2f}")
    print()
    print(table(metrics))
    print()
    results.update(
        machine=machine(),
        rounds=args.rounds,
        gap_ms=args.gap_ms,
        quick=args.quick,
        load_1m_start=load,
        load_1m_end=after,
    )
    print(json.dumps(results))
    sys.stdout.flush()


def _here(args: argparse.Namespace, names: list[str]) -> tuple[list[Metric], dict[str, Any]]:
    """Run the workloads ``names`` in this process; return their metrics and results."""
    root = tempfile.mkdtemp(prefix="kafkakv-bench-peers-", dir=args.dir)
    bench = Bench(root, args.quick, args.rounds, args.gap_ms)
    with terminate_as_interrupt():
        try:
            bench.servers_up(names)
            for name in WORKLOADS:
                if name in names:
                    getattr(bench, name)()
        finally:
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    return bench.metrics, bench.results


if __name__ == "__main__":
    main()
