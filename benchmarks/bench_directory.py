"""Benchmark of directories (issue 5): time to ready on the embedded log and on a 3-broker Kafka
cluster, and the restart of an on-disk directory, each next to a baseline measured in the same
run.

Command (from the project root)::

    .venv/bin/python benchmarks/bench_directory.py [--quick] [--only NAMES] [--runs N]
                                                   [--dir DIR]

NAMES is a comma-separated subset of ``embedded,large,restart,kafka``. ``--quick`` shrinks the
large workload and the number of runs. The script prints the machine and its load, one line
per measurement and, last, one JSON object with every number.

Workload (the seed's): a compacted topic with one partition of terminal id -> JSON rows of six
fields (``id``, ``terminalId``, ``acquirerId``, ``isActive``, ``updatedDate``, ``version``;
about 130 bytes), str keys of 8 characters; directories use the default codecs (str keys, json
values) and the default dict store.

1. ``embedded``: 50,000 rows. Time for ``db.directory(topic)`` to return ready (constructing,
   starting the thread, capturing end offsets, reading, decoding, storing). Baseline: a plain
   loop of ``Log.read`` (50,000 records per call) decoding every value with ``orjson.loads``
   into a dict. Target: 0.1 s.
2. ``large``: the same with 1,000,000 rows (``--quick``: 200,000). Target: 2 s for 1,000,000.
3. ``restart``: the 50,000 rows into a directory with ``store="lmdb"``, closed, then the time
   for ``db.directory(topic, store="lmdb", store_path=...)`` to return ready again (it reads
   nothing: every record is in the store already). Baseline: the dict-store load of step 1.
   Target: 0.3 s.
4. ``kafka``: 50,000 rows written by a raw confluent-kafka producer into a topic of one
   partition, replication factor 3, on a three-broker cluster this script starts (``DevCluster``,
   KRaft, ports 10092/20092/30092 and the controller port above each: neither the tests'
   11092.. (+ their offset) nor ``bench_kafka.py``'s 12092..), with ``bench_kafka.py``'s JVM
   flags (full JIT, G1). Time for ``db.directory(topic)`` on a connected ``Database`` to
   return ready; every run makes its own consumer, as a service starting would. Baseline: a
   fresh confluent-kafka ``Consumer`` with kafkakv's client settings (``read_committed``)
   reading the partition to its end offset, decoding values with ``orjson.loads`` into a dict.
   Target: 0.5 s. ``--bootstrap`` measures an existing cluster instead.

Each figure is the median of ``--runs`` runs (default 7; ``--quick``: 3) after one warm-up
run that is discarded; the runs of a figure and of its baseline alternate. The ratio is
directory / baseline (1.0: as fast as the plain loop), of wall-clock medians. Next to each
wall-clock median is the median CPU time of this process (all its threads; not the brokers'):
where it is far below the wall time, the run was waiting (for brokers, for a CPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from _common import machine
from bench_kafka import benchmark_jvm_options, load
from bench_kafka import read_into_dict as kafka_read_into_dict
from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import CollectorRegistry

import kafkakv
from kafkakv.dev import DEFAULT_KAFKA_VERSION, DevCluster
from kafkakv.log import EmbeddedLog, Log, Record
from kafkakv.log.kafka.settings import ClientSettings

BASE_PORT = 10092  # 10092/20092/30092: below Linux's ephemeral ports
TIMEOUT = 60.0
TARGETS_S = {"embedded": 0.1, "large": 2.0, "restart": 0.3, "kafka": 0.5}


def rows(n: int) -> list[tuple[bytes, bytes]]:
    """The seed's terminal -> acquirer table as (key, JSON value) pairs."""
    return [
        (
            f"T{i:07d}".encode(),
            orjson.dumps(
                {
                    "id": i,
                    "terminalId": f"T{i:07d}",
                    "acquirerId": f"A{i % 97:03d}",
                    "isActive": True,
                    "updatedDate": "2024-01-01 11:11:11.000",
                    "version": 1,
                }
            ),
        )
        for i in range(n)
    ]


def timed(fn: Callable[[], Any], cpu: list[float] | None = None) -> float:
    """Wall seconds of ``fn()``; appends the process's CPU seconds (all threads) to ``cpu``."""
    gc.collect()
    c = time.process_time()
    t = time.perf_counter()
    fn()
    wall = time.perf_counter() - t
    if cpu is not None:
        cpu.append(time.process_time() - c)
    return wall


def compare(
    name: str, mine: Callable[[], Any], base: Callable[[], Any], runs: int
) -> dict[str, Any]:
    """Median of ``runs`` alternated runs of each after one discarded warm-up of each."""
    mine(), base()
    ours: list[float] = []
    theirs: list[float] = []
    our_cpu: list[float] = []
    their_cpu: list[float] = []
    for _ in range(runs):
        ours.append(timed(mine, our_cpu))
        theirs.append(timed(base, their_cpu))
    m, b = statistics.median(ours), statistics.median(theirs)
    mc, bc = statistics.median(our_cpu), statistics.median(their_cpu)
    target = TARGETS_S[name]
    result = {
        "median_s": round(m, 4),
        "min_s": round(min(ours), 4),
        "max_s": round(max(ours), 4),
        "cpu_median_s": round(mc, 4),
        "baseline_median_s": round(b, 4),
        "baseline_cpu_median_s": round(bc, 4),
        "ratio": round(m / b, 2),
        "target_s": target,
        "met": m <= target,
        "runs": runs,
    }
    print(
        f"{name:9} ready {m:.3f} s (min {min(ours):.3f}, max {max(ours):.3f}; CPU {mc:.3f} s) "
        f"| baseline {b:.3f} s (CPU {bc:.3f} s) | ratio {m / b:.2f}x | target <= {target} s: "
        f"{'met' if m <= target else 'NOT met'}"
    )
    return result


# -- the embedded log ------------------------------------------------------------------------


def embedded_topic(log: Log, n: int) -> str:
    name = f"terminals-{n}"
    log.create_topic(name, 1, {"cleanup.policy": "compact"})
    data = rows(n)
    for i in range(0, n, 10_000):
        log.append(name, 0, [Record(k, v) for k, v in data[i : i + 10_000]])
    return name


def read_into_dict(log: Log, topic: str) -> dict[str, Any]:
    """The baseline: a plain read loop decoding every value into a dict."""
    out: dict[str, Any] = {}
    position = log.start_offset(topic, 0)
    while True:
        records = log.read(topic, 0, position, max_records=50_000, max_bytes=64 << 20)
        if not records:
            return out
        for r in records:
            out[r.key.decode()] = orjson.loads(r.value)  # type: ignore[union-attr,arg-type]
        position = (records[-1].offset or 0) + 1


def open_directory(db: kafkakv.Database, topic: str, expect: int, **options: Any) -> None:
    d = db.directory(topic, metrics=CollectorRegistry(), **options)
    try:
        if len(d) != expect:
            raise RuntimeError(f"directory of {topic} holds {len(d)} keys, not {expect}")
    finally:
        d.close()


def bench_embedded(root: str, name: str, n: int, runs: int) -> dict[str, Any]:
    with EmbeddedLog(os.path.join(root, name), background_cleaner=False) as lg:
        topic = embedded_topic(lg, n)
        db = kafkakv.connect(lg)
        return compare(
            name,
            lambda: open_directory(db, topic, n),
            lambda: read_into_dict(lg, topic),
            runs,
        )


def bench_restart(root: str, n: int, runs: int) -> dict[str, Any]:
    with EmbeddedLog(os.path.join(root, "restart"), background_cleaner=False) as lg:
        topic = embedded_topic(lg, n)
        db = kafkakv.connect(lg)
        store = os.path.join(root, "restart-store")
        first = timed(lambda: open_directory(db, topic, n, store="lmdb", store_path=store))
        print(f"restart   first load into lmdb: {first:.3f} s")
        result = compare(
            "restart",
            lambda: open_directory(db, topic, n, store="lmdb", store_path=store),
            lambda: open_directory(db, topic, n),
            runs,
        )
        result["first_load_s"] = round(first, 3)
        return result


# -- Kafka -------------------------------------------------------------------------------------


def _decoded(msg: Message) -> tuple[str, Any]:
    return msg.key().decode(), orjson.loads(msg.value())  # type: ignore[union-attr,arg-type]


def kafka_baseline(bootstrap: str, topic: str, expect: int) -> None:
    settings = ClientSettings(bootstrap, None, TIMEOUT)
    consumer = Consumer(settings.consumer(f"bench-dir-{uuid.uuid4().hex[:8]}"))
    try:
        out = kafka_read_into_dict(consumer, topic, _decoded)
        if len(out) != expect:
            raise RuntimeError(f"baseline read {len(out)} keys, not {expect}")
    finally:
        consumer.close()


def bench_kafka(bootstrap: str, n: int, runs: int) -> dict[str, Any]:
    topic = f"bench-dir-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, 1, 3, config={"cleanup.policy": "compact", "min.insync.replicas": "2"})
    admin.create_topics([new], operation_timeout=TIMEOUT)[topic].result()
    producer = Producer({**ClientSettings(bootstrap, None, TIMEOUT).producer(), "linger.ms": 5})
    for k, v in rows(n):
        while True:
            try:
                producer.produce(topic, v, k, 0)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(TIMEOUT) != 0:
        raise RuntimeError("records still undelivered")
    with kafkakv.connect(f"kafka://{bootstrap}", timeout=TIMEOUT) as db:
        return compare(
            "kafka",
            lambda: open_directory(db, topic, n),
            lambda: kafka_baseline(bootstrap, topic, n),
            runs,
        )


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally that stops the cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="embedded,large,restart,kafka")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument(
        "--bootstrap", default=None, help="an existing cluster (default: start one)"
    )
    parser.add_argument("--dir", default=None, help="where logs and the cluster keep their data")
    args = parser.parse_args()
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    if not names or set(names) - set(TARGETS_S):
        parser.error(f"--only takes names from {','.join(TARGETS_S)}")
    runs = args.runs or (3 if args.quick else 7)
    large = 200_000 if args.quick else 1_000_000
    signal.signal(signal.SIGTERM, _exit_on_signal)
    print(machine())
    before = load()
    print(f"load average before: {before}")
    root = tempfile.mkdtemp(prefix="kafkakv-bench-directory-", dir=args.dir)
    results: dict[str, Any] = {}
    cluster: DevCluster | None = None
    began = time.monotonic()
    try:
        if "embedded" in names:
            results["embedded"] = bench_embedded(root, "embedded", 50_000, runs)
        if "large" in names:
            results["large"] = bench_embedded(root, "large", large, runs)
            results["large"]["rows"] = large
        if "restart" in names:
            results["restart"] = bench_restart(root, 50_000, runs)
        if "kafka" in names:
            bootstrap = args.bootstrap
            if bootstrap is None:
                cluster = DevCluster(
                    brokers=3,
                    base_port=BASE_PORT,
                    state_dir=os.path.join(root, "cluster"),
                    die_with_parent=True,
                    jvm_options=benchmark_jvm_options(),
                )
                t = time.monotonic()
                cluster.start()
                bootstrap = cluster.bootstrap
                print(
                    f"cluster: 3 brokers at {bootstrap} (Kafka {DEFAULT_KAFKA_VERSION}, "
                    f"started in {time.monotonic() - t:.1f} s)"
                )
            results["kafka"] = bench_kafka(bootstrap, 50_000, runs)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    after = load()
    print(f"load average after: {after}; {time.monotonic() - began:.1f} s in all")
    print(
        json.dumps(
            {
                "machine": machine(),
                "load_before": before,
                "load_after": after,
                "quick": args.quick,
                "runs": runs,
                **results,
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
