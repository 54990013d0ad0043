"""Benchmark of the replicated map on a real 3-broker Kafka cluster, each figure next to a raw
confluent-kafka baseline measured in the same run.

Command (from the project root)::

    .venv/bin/python benchmarks/bench_kafka.py [--quick] [--only NAMES]
                                               [--bootstrap HOST:PORT,...] [--dir DIR]

NAMES is a comma-separated subset of ``sync,async,bootstrap``. ``--quick`` shrinks every
workload. The script prints the machine and its load, one line per measurement and, last, one
JSON object with every number.

Cluster: by default the script starts its own three brokers (``DevCluster``, KRaft, ports
12092/22092/32092 and the controller port above each, state in a temporary directory under
``--dir``) and stops them at the end, also after an error, Ctrl-C or SIGTERM; the brokers die
with the script even when it is killed with SIGKILL. They run with the dev cluster's heap
settings but NOT its start-up flags: ``-XX:TieredStopAtLevel=1`` (no C2 compiler) and the
serial collector are replaced by the full JIT and G1, so the brokers run at full speed once
warm. ``--bootstrap`` measures an existing cluster instead (it must have at least 3 brokers;
the topics made here are deleted at the end). Every topic, the map's and the baselines', has
one partition, replication factor 3 and ``min.insync.replicas=2`` (what ``db.map()`` creates
on a 3-broker cluster); the script checks this.

Workload: str keys of 16 characters, bytes values of 100 bytes (``value_codec="bytes"``),
``flush_period=5000`` as in ``bench_map.py``. Baseline clients are plain confluent-kafka
``Producer`` / ``Consumer`` objects configured with the very settings kafkakv gives its own
(``ClientSettings.producer()``: ``acks=all``, ``enable.idempotence=true``, ``linger.ms=1``...;
``ClientSettings.consumer()``: ``isolation.level=read_committed``...), so each ratio measures
what kafkakv adds, not a difference in configuration.

1. ``sync``: ``m.put(k, v)`` in a loop; per-call latency. Baseline: one raw round trip of the
   same record: produce it, poll the producer until its delivery report, then poll a consumer
   assigned to the partition until the record arrives. Rounds of the map and of the baseline
   alternate; the first round of each is a warm-up. Reports the ratio of the p50s.
2. ``async``: ``m.put_async`` of N updates (``max_in_flight=20000``), then waiting for every
   future; updates/s. Baseline: ``Producer.produce`` of the same N records in a loop with a
   delivery callback counting them, then ``flush()``; messages/s. Each round also times
   ``m.put_all`` of the same N pairs on a second map (the batch API: a few ``WRITE_MANY``
   records instead of one record per update); the target is put_all at 50% of raw produce or
   better. Runs alternate; the first of each is a warm-up. After each map run, untimed, ``m.flush()`` writes what that run's
   flushes have not written yet, and the script pauses half a second before the baseline's
   run and after it: otherwise the map's flushes still running slow down the baseline run
   that follows.
   A third run in each round, "the map's Kafka work" (:class:`KafkaWork`), has raw clients do
   the Kafka traffic of the same N updates with next to no Python: produce the ops records,
   consume them back, write the data records in flush transactions. It shows how much of the
   gap to raw produce is the traffic itself (a replica reads every update back, and every
   flushed key is written twice) and how much is kafkakv's own work. CPU per update or
   message is measured for the three, this process and the brokers, flushes included.
3. ``bootstrap``: a map of 1,000,000 keys (``--quick``: 100,000) flushed to its data topic:
   ``db.map()`` creates the three topics once, then a raw producer writes every key (as the
   str codec encodes it) and a flush point (``FLUSH_POINT_KEY``, msgpack ``[covered ops
   offset]``) straight into the data topic, as flushes would. Then the time for
   ``db.map(name)`` in a fresh ``Database`` to return (connecting is not timed); keys/s. The
   issue's target: 300,000 keys/s. Baseline: a plain loop that reads the same data topic with
   a ``Consumer`` (``consume`` of up to 10,000 messages at a time) into a dict.

Latencies are reported as p50/p90/p99 over every call after the warm-up; rates and times as
the median of several runs. No means. The machine is shared with the brokers (and with
whatever else runs): the load average before and after is printed with the results.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
from _common import VALUE, key, lat, machine, put_async_rate
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

import kafkakv
from kafkakv.dev import DEFAULT_KAFKA_VERSION, DevCluster
from kafkakv.dev.layout import DEFAULT_JVM_OPTIONS
from kafkakv.errors import UnknownTopicError
from kafkakv.log.kafka.log import _produce
from kafkakv.log.kafka.settings import ClientSettings
from kafkakv.map import FLUSH_POINT_KEY
from kafkakv.map.ops import OpCode, encode_op

BASE_PORT = 12092  # 12092/22092/32092: below Linux's ephemeral ports
TIMEOUT = 60.0  # for every client call: the machine may be busy
FLUSH_PERIOD = 5000
REPLICAS, MIN_INSYNC = 3, 2
SETTLE = 0.5  # seconds of pause between the runs of the async measurement


def benchmark_jvm_options() -> tuple[str, ...]:
    """The dev cluster's JVM flags without the two that trade speed for a fast start."""
    slow = ("-XX:TieredStopAtLevel=", "-XX:+UseSerialGC")
    kept = [flag for flag in DEFAULT_JVM_OPTIONS if not flag.startswith(slow)]
    return (*kept, "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class CpuMeter:
    """CPU seconds (user + system) used so far by this process, all its threads (librdkafka's
    included), and by the broker processes: what each run of the async measurement costs."""

    def __init__(self, broker_pids: list[int]) -> None:
        self.broker_pids = broker_pids
        self.tick = os.sysconf("SC_CLK_TCK")

    def _of(self, pid: int) -> float:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone: it used nothing more
            return 0.0
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime

    def read(self) -> tuple[float, float]:
        """``(this process, the brokers)``, in CPU seconds."""
        own = os.times()
        return own.user + own.system, sum(self._of(pid) for pid in self.broker_pids)


def local_broker_pids() -> list[int]:
    """The pids of the Kafka brokers running on this machine (``kafka.Kafka`` processes)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"kafka.Kafka\x00" in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


# -- raw confluent-kafka -------------------------------------------------------------------


def produce_all(producer: Producer, topic: str, records: Iterable[tuple[bytes, bytes]]) -> float:
    """Produce every ``(key, value)`` to partition 0 of ``topic``, then ``flush()``; return the
    seconds taken. Raises when a record was not delivered."""
    delivered = 0
    failures: list[KafkaError] = []

    def report(err: KafkaError | None, _msg: Message) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1
        else:
            failures.append(err)

    produced = 0
    t = time.perf_counter()
    for k, v in records:
        while True:
            try:
                producer.produce(topic, v, k, 0, on_delivery=report)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.01)
        produced += 1
    left = producer.flush(TIMEOUT)
    elapsed = time.perf_counter() - t
    if failures or left or delivered != produced:
        raise RuntimeError(
            f"raw produce to {topic}: {delivered} of {produced} delivered, {left} still queued, "
            f"first error {failures[:1]}"
        )
    return elapsed


class RoundTrip:
    """The raw floor of a synchronous put: produce one record, wait for its delivery report,
    then poll a read_committed consumer until that very record arrives."""

    def __init__(self, producer: Producer, consumer: Consumer, topic: str) -> None:
        self.producer = producer
        self.consumer = consumer
        self.topic = topic
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)
        consumer.assign([TopicPartition(topic, 0, high)])

    def once(self, k: bytes) -> int:
        """Nanoseconds of one round trip of ``k``."""
        reports: list[tuple[KafkaError | None, Message]] = []
        t = time.perf_counter_ns()
        self.producer.produce(
            self.topic, VALUE, k, 0, on_delivery=lambda err, msg: reports.append((err, msg))
        )
        deadline = time.monotonic() + TIMEOUT
        while not reports:
            self.producer.poll(1.0)
            _check_deadline(deadline, "delivery report")
        err, delivered = reports[0]
        if err is not None:
            raise KafkaException(err)
        wanted = delivered.offset() or 0
        while True:
            msg = self.consumer.poll(1.0)
            if msg is not None:
                problem = msg.error()
                if problem is None and (msg.offset() or 0) >= wanted:
                    return time.perf_counter_ns() - t
                if problem is not None and problem.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(problem)
            _check_deadline(deadline, "the record coming back")


class KafkaWork:
    """The Kafka traffic of ``n`` async map updates, made by raw clients with next to no Python:
    what a map's put_async costs the clients and the brokers before any of kafkakv's own work.

    Per update: one ops record (the very bytes ``put_async`` appends) produced to an ops topic;
    the same record consumed back by a read_committed consumer (a replica applies its own
    updates from the log); and, every ``FLUSH_PERIOD`` ops, a transaction that writes a data
    record per key consumed, a flush point and then a ``FLUSHED`` mark on the ops topic, after
    a flush request on the flush topic, as the map's flush does. Ops are queued with kafkakv's
    own ``produce_batch`` loop by a producer that reports failures only; a thread consumes,
    another flushes. The topics are a map's own (created by ``db.map``, so configured identically),
    written here by nobody else. :meth:`run` times from the first produce to the last record
    consumed (when the map's futures would be resolved); the flushes it asked for finish
    untimed, as ``m.flush()`` does after the map's runs."""

    def __init__(self, bench: Bench, topics: tuple[str, str, str]) -> None:
        self.ops, self.data, self.flush = topics
        self.producer = bench.producer(**{"delivery.report.only.error": True})
        self.requests = bench.producer()
        self.consumer = bench.consumer()
        self.writer = Producer(bench.clients.transactional(f"{self.ops}-work", 60_000))
        self.writer.init_transactions(TIMEOUT)
        self.origin = os.urandom(8)
        self.failures: list[KafkaError] = []
        self._stop = False
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop:
            self.producer.poll(0.1)

    def _failed(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:  # delivery.report.only.error: nothing else comes here
            self.failures.append(err)

    def close(self) -> None:
        self._stop = True
        self._poller.join()
        self.consumer.close()
        for producer in (self.producer, self.requests):
            producer.flush(TIMEOUT)

    def run(self, keys: list[bytes], first_seq: int) -> float:
        """Seconds for ``len(keys)`` updates: from the first produce to the last consumed."""
        n = len(keys)
        ops = [
            (k, encode_op(OpCode.PUT, self.origin, first_seq + i, [VALUE]))
            for i, k in enumerate(keys)
        ]
        tp = TopicPartition(self.ops, 0)
        start = self.consumer.get_watermark_offsets(tp, timeout=TIMEOUT)[1]
        self.consumer.assign([TopicPartition(self.ops, 0, start)])
        chunks: queue.SimpleQueue[tuple[list[bytes], int] | None] = queue.SimpleQueue()
        consumed = threading.Event()
        errors: list[BaseException] = []

        def read() -> None:
            got, deadline = 0, time.monotonic() + TIMEOUT
            pending: list[bytes] = []
            try:
                while got < n:
                    for msg in self.consumer.consume(10_000, 0.1):
                        problem = msg.error()
                        if problem is None:
                            k = msg.key()
                            if k is not None:  # (the FLUSHED marks have none)
                                pending.append(k)
                                got += 1
                                if len(pending) == FLUSH_PERIOD:
                                    chunks.put((pending, msg.offset() or 0))
                                    pending = []
                        elif problem.code() != KafkaError._PARTITION_EOF:
                            raise KafkaException(problem)
                    _check_deadline(deadline, f"consuming {self.ops}")
            except BaseException as exc:
                errors.append(exc)
            finally:
                consumed.set()
                chunks.put(None)

        def flush() -> None:
            try:
                while (chunk := chunks.get()) is not None:
                    self._flush(*chunk)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=read), threading.Thread(target=flush)]
        for thread in threads:
            thread.start()
        t = time.perf_counter()
        for i in range(0, n, _SEND_CHUNK):
            _queue(self.producer, self.ops, ops[i : i + _SEND_CHUNK], self._failed)
        consumed.wait()
        elapsed = time.perf_counter() - t
        for thread in threads:
            thread.join()
        if errors or self.failures:
            raise RuntimeError(f"the raw Kafka work failed: {(errors + self.failures)[:1]}")
        return elapsed

    def _flush(self, keys: list[bytes], covered: int) -> None:
        request = msgpack.packb([self.origin, covered + 1])
        self.requests.produce(self.flush, request, None, 0)
        if self.requests.flush(TIMEOUT):
            raise RuntimeError("a flush request was not delivered")
        writer = self.writer
        writer.begin_transaction()
        rows = [(k, VALUE) for k in keys]
        rows.append((FLUSH_POINT_KEY, msgpack.packb([covered])))
        _queue(writer, self.data, rows, self._failed)
        writer.flush(TIMEOUT)  # the mark once the data is stored, as KafkaLogWriter does
        mark = encode_op(OpCode.FLUSHED, self.origin, -1, [covered])
        writer.produce(self.ops, mark, None, 0, on_delivery=self._failed)
        writer.commit_transaction(TIMEOUT)


_SEND_CHUNK = 5000  # ops queued per call: the map's sender batch at most


def _queue(
    producer: Producer,
    topic: str,
    rows: list[tuple[bytes, bytes]],
    cb: Callable[[KafkaError | None, Message], None],
) -> None:
    """Queue ``rows`` for partition 0 of ``topic`` in order with kafkakv's own produce loop
    (``produce_batch``, waiting while the local queue is full), as the map does."""
    refused = _produce(producer, topic, 0, [(k, v, None, None) for k, v in rows], cb)
    if refused:
        raise KafkaException(refused[0][1])


def read_into_dict(
    consumer: Consumer, topic: str, entry: Callable[[Message], tuple[Any, Any]] | None = None
) -> dict[Any, Any]:
    """Every record of partition 0 of ``topic`` up to its end now, latest value per key:
    the raw key and value, or what ``entry(message)`` makes of them."""
    tp = TopicPartition(topic, 0)
    low, high = consumer.get_watermark_offsets(tp, timeout=TIMEOUT)
    consumer.assign([TopicPartition(topic, 0, low)])
    state: dict[Any, Any] = {}
    position = low
    deadline = time.monotonic() + TIMEOUT
    while position < high:
        # Asking for no more than is left lets the last call return as soon as it has them.
        for msg in consumer.consume(min(10_000, high - position), 1.0):
            problem = msg.error()
            if problem is None:
                if entry is None:
                    state[msg.key()] = msg.value()
                else:
                    k, v = entry(msg)
                    state[k] = v
                position = (msg.offset() or 0) + 1
            elif problem.code() == KafkaError._PARTITION_EOF:
                position = max(position, msg.offset() or 0)
            else:
                raise KafkaException(problem)
        _check_deadline(deadline, f"reading {topic}")
    return state


def _check_deadline(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"waited {TIMEOUT} s for {what}")


# -- the measurements ----------------------------------------------------------------------


class Bench:
    def __init__(self, bootstrap: str, quick: bool, cpu: CpuMeter) -> None:
        self.bootstrap = bootstrap
        self.quick = quick
        self.cpu = cpu
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}"  # this run's topics, none reused
        self.clients = ClientSettings(bootstrap, None, TIMEOUT)
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.made: list[str] = []
        self.results: dict[str, Any] = {}

    # helpers ---------------------------------------------------------------------------
    def connect(self) -> kafkakv.Database:
        return kafkakv.connect(
            f"kafka://{self.bootstrap}", timeout=TIMEOUT, replication_factor=REPLICAS
        )

    def open_map(self, db: kafkakv.Database, name: str, **options: Any) -> Any:
        options.setdefault("value_codec", "bytes")
        options.setdefault("flush_period", FLUSH_PERIOD)
        try:
            m = db.map(name, **options)
        except UnknownTopicError as exc:
            # KafkaLog._load retries while a new topic's metadata propagates; should a broker
            # still not know it, the run says so (in its results) and opens it again.
            self.results.setdefault("unknown_topic_retries", []).append(str(exc))
            print(f"kafkakv: {exc} right after creating it; opening again", file=sys.stderr)
            time.sleep(1.0)
            m = db.map(name, **options)
        for topic in (name, f"{name}_ops", f"{name}_flush"):
            if topic not in self.made:
                self.made.append(topic)
                self.check_topic(topic)
        return m

    def raw_topic(self, what: str) -> str:
        """A new topic for a baseline, made like the map's: 1 partition, 3 replicas."""
        name = f"{self.prefix}-{what}"
        new = NewTopic(name, 1, REPLICAS, config={"min.insync.replicas": str(MIN_INSYNC)})
        self.admin.create_topics([new], operation_timeout=TIMEOUT)[name].result()
        self.made.append(name)
        deadline = time.monotonic() + TIMEOUT
        while True:  # usable once the partition has a leader and its whole ISR
            part = self.admin.list_topics(name, timeout=TIMEOUT).topics[name].partitions.get(0)
            if part is not None and part.leader >= 0 and len(part.isrs) == REPLICAS:
                break
            _check_deadline(deadline, f"a leader for {name}")
            time.sleep(0.05)
        self.check_topic(name)
        return name

    def check_topic(self, name: str) -> None:
        """Refuse to measure a topic that is not replicated the way the figures claim."""
        deadline = time.monotonic() + 5.0
        while True:  # a broker may learn of a topic created a moment ago a little later
            meta = self.admin.list_topics(name, timeout=TIMEOUT).topics[name]
            if (meta.error is None and meta.partitions) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        replicas = {len(p.replicas) for p in meta.partitions.values()}
        resource = ConfigResource(ResourceType.TOPIC, name)
        config = self.admin.describe_configs([resource], request_timeout=TIMEOUT)[resource]
        isr = config.result()["min.insync.replicas"].value
        if len(meta.partitions) != 1 or replicas != {REPLICAS} or isr != str(MIN_INSYNC):
            raise RuntimeError(
                f"topic {name}: {len(meta.partitions)} partitions, replicas {replicas}, "
                f"min.insync.replicas {isr}; the benchmark wants 1, {REPLICAS}, {MIN_INSYNC}"
            )

    def producer(self, **extra: str | bool) -> Producer:
        return Producer({**self.clients.producer(), **extra})

    def consumer(self) -> Consumer:
        return Consumer(self.clients.consumer(f"{self.prefix}-{uuid.uuid4().hex[:8]}"))

    def close(self) -> None:
        """Drop the admin client before the brokers go (it would log their absence)."""
        del self.admin
        gc.collect()

    def delete_topics(self) -> None:
        if self.made:
            futures = self.admin.delete_topics(self.made, operation_timeout=TIMEOUT)
            for future in futures.values():
                try:
                    future.result()
                except KafkaException as exc:
                    print(f"could not delete a topic: {exc}", file=sys.stderr)

    # 1 ---------------------------------------------------------------------------------
    def sync(self) -> None:
        rounds, per = (4, 150) if self.quick else (6, 1000)
        raw = self.raw_topic("sync-raw")
        producer, consumer = self.producer(), self.consumer()
        mine: list[int] = []
        base: list[int] = []
        try:
            trip = RoundTrip(producer, consumer, raw)
            with self.connect() as db:
                m = self.open_map(db, f"{self.prefix}-sync")
                for r in range(rounds):  # round 0 of each is the warm-up
                    first = r * per
                    chunk = []
                    for i in range(first, first + per):
                        k = key(i)
                        t = time.perf_counter_ns()
                        m.put(k, VALUE)
                        chunk.append(time.perf_counter_ns() - t)
                    if r:
                        mine += chunk
                    chunk = [trip.once(key(i).encode()) for i in range(first, first + per)]
                    if r:
                        base += chunk
        finally:
            consumer.close()
            producer.flush(TIMEOUT)
        put, trip_lat = lat(mine), lat(base)
        ratio = put["p50_us"] / trip_lat["p50_us"]
        self.results["sync"] = {
            "calls": len(mine),
            "put": put,
            "raw_round_trip": trip_lat,
            "p50_ratio": ratio,
        }
        print(
            f"sync put      p50 {put['p50_us']:8.0f} us  p90 {put['p90_us']:8.0f}  "
            f"p99 {put['p99_us']:8.0f} | raw produce+consume p50 {trip_lat['p50_us']:.0f} us "
            f"p90 {trip_lat['p90_us']:.0f} p99 {trip_lat['p99_us']:.0f} | ratio {ratio:.2f}x"
        )

    # 2 ---------------------------------------------------------------------------------
    def async_(self) -> None:
        n, runs = (20_000, 3) if self.quick else (100_000, 7)
        keys = [key(i) for i in range(n)]  # made outside the timed part, as for the baseline
        records = [(k.encode(), VALUE) for k in keys]
        raw_keys = [k for k, _ in records]
        raw = self.raw_topic("async-raw")
        producer = self.producer()
        rates: list[float] = []
        base: list[float] = []
        floor: list[float] = []
        # CPU microseconds per update or message, (this process, brokers), per run
        cpu_runs: dict[str, list[tuple[float, float]]] = {
            "map": [],
            "batch": [],
            "raw": [],
            "work": [],
        }
        batches: list[float] = []
        pairs = dict.fromkeys(keys, VALUE)
        with self.connect() as db:
            m = self.open_map(db, f"{self.prefix}-async", max_in_flight=20_000)
            mb = self.open_map(db, f"{self.prefix}-batch")
            work_map = f"{self.prefix}-work"
            self.open_map(db, work_map)  # its topics, configured as a map's; the map idles
            work = KafkaWork(self, (f"{work_map}_ops", work_map, f"{work_map}_flush"))
            try:

                def measure(who: str, run: Callable[[], float], into: list[float]) -> None:
                    """One run: its rate, and its CPU per item until the end of ``run``."""
                    gc.collect()
                    c0 = self.cpu.read()
                    into.append(run())
                    cpu_runs[who].append(per_item(c0, self.cpu.read(), n))
                    time.sleep(SETTLE)

                def map_run() -> float:
                    rate = put_async_rate(m, keys)
                    # Untimed: the flushes this run asked for, so that they do not run during
                    # (and slow down) the next measurement; CPU counts them.
                    m.flush()
                    return rate

                def batch_run() -> float:
                    t = time.perf_counter()
                    mb.put_all(pairs)
                    rate = n / (time.perf_counter() - t)
                    mb.flush()  # untimed, as in map_run
                    return rate

                for r in range(runs + 1):  # the first run of each is the warm-up
                    measure("map", map_run, rates)
                    measure("batch", batch_run, batches)
                    measure("raw", lambda: n / produce_all(producer, raw, records), base)
                    measure("work", lambda seq=r * n: n / work.run(raw_keys, seq), floor)
            finally:
                work.close()
        mine, theirs = statistics.median(rates[1:]), statistics.median(base[1:])
        least = statistics.median(floor[1:])
        batch = statistics.median(batches[1:])
        cpu = {
            f"{who}_{part}_cpu_us": statistics.median(r[i] for r in runs_cpu[1:])
            for who, runs_cpu in cpu_runs.items()
            for i, part in enumerate(("process", "brokers"))
        }
        self.results["async"] = {
            "updates": n,
            "ops_s": mine,
            "runs_ops_s": rates[1:],
            "raw_produce_s": theirs,
            "runs_raw_produce_s": base[1:],
            "ratio": mine / theirs,
            "put_all_s": batch,
            "runs_put_all_s": batches[1:],
            "put_all_ratio": batch / theirs,
            "kafka_work_s": least,
            "runs_kafka_work_s": floor[1:],
            "kafka_work_ratio": least / theirs,
            "map_to_kafka_work": mine / least,
            **cpu,
        }
        print(
            f"async put     {mine:9.0f} ops/s (runs {[round(r) for r in rates[1:]]}) | "
            f"raw produce {theirs:9.0f} msg/s (runs {[round(r) for r in base[1:]]}) | "
            f"ratio {mine / theirs:.3f}"
        )
        print(
            f"  put_all     {batch:9.0f} ops/s (runs {[round(r) for r in batches[1:]]}) | "
            f"ratio to raw produce {batch / theirs:.3f} (target >= 0.5)"
        )
        print(
            f"  the map's Kafka work by raw clients {least:9.0f} updates/s (runs "
            f"{[round(r) for r in floor[1:]]}) = {least / theirs:.3f} of raw produce; "
            f"the map reaches {mine / least:.3f} of it"
        )
        print(
            "  CPU per update or message (process + brokers, us): "
            + " | ".join(
                f"{who} {cpu[f'{who}_process_cpu_us']:.1f} + {cpu[f'{who}_brokers_cpu_us']:.1f}"
                for who in ("map", "batch", "raw", "work")
            )
        )

    # 3 ---------------------------------------------------------------------------------
    def bootstrap_(self) -> None:
        keys, runs = (100_000, 3) if self.quick else (1_000_000, 3)
        name = f"{self.prefix}-boot"
        with self.connect() as db:
            self.open_map(db, name)  # creates the three topics; the map stays empty
            covered = db.log.end_offset(f"{name}_ops", 0) - 1
        writer = self.producer(**{"linger.ms": "20"})  # setup, not measured: batch freely
        records = ((key(i).encode(), VALUE) for i in range(keys))
        point = [(FLUSH_POINT_KEY, msgpack.packb([covered]))]
        wrote = produce_all(writer, name, records) + produce_all(writer, name, point)
        print(f"              (wrote {keys:,} keys to {name} in {wrote:.1f} s)")
        times: list[float] = []
        base: list[float] = []
        for _ in range(runs + 1):  # the first run of each is the warm-up
            gc.collect()
            with self.connect() as db:
                t = time.perf_counter()
                m = db.map(name, value_codec="bytes", flush_period=FLUSH_PERIOD)
                times.append(time.perf_counter() - t)
                if len(m) != keys:
                    raise RuntimeError(f"the map loaded {len(m)} keys, not {keys}")
                del m
            gc.collect()
            t = time.perf_counter()
            consumer = self.consumer()
            state = read_into_dict(consumer, name)
            base.append(time.perf_counter() - t)
            consumer.close()
            if len(state) != keys + 1:  # the flush point is one more key
                raise RuntimeError(f"the raw read found {len(state)} keys, not {keys + 1}")
            del state
        mine, theirs = statistics.median(times[1:]), statistics.median(base[1:])
        self.results["bootstrap"] = {
            "keys": keys,
            "s": mine,
            "runs_s": times[1:],
            "keys_s": keys / mine,
            "raw_read_s": theirs,
            "runs_raw_read_s": base[1:],
            "raw_keys_s": keys / theirs,
            "ratio": mine / theirs,
        }
        print(
            f"bootstrap     {keys} keys in {mine:.3f} s ({keys / mine:,.0f} keys/s, target "
            f">= 300,000) | raw read into dict {theirs:.3f} s ({keys / theirs:,.0f} keys/s) | "
            f"ratio {mine / theirs:.2f}x"
        )


def per_item(
    before: tuple[float, float], after: tuple[float, float], n: int
) -> tuple[float, float]:
    """CPU microseconds per item between two :meth:`CpuMeter.read` results."""
    return ((after[0] - before[0]) * 1e6 / n, (after[1] - before[1]) * 1e6 / n)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally that stops the cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="sync,async,bootstrap")
    parser.add_argument(
        "--bootstrap", default=None, help="an existing cluster's host:port,... (default: start one)"
    )
    parser.add_argument("--dir", default=None, help="where the started cluster keeps its data")
    args = parser.parse_args()
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    known = {"sync", "async", "bootstrap"}
    if not names or set(names) - known:
        parser.error(f"--only takes names from {','.join(sorted(known))}")
    signal.signal(signal.SIGTERM, _exit_on_signal)
    began = time.monotonic()
    print(machine())
    before = load()
    print(f"load average before: {before}")
    cluster: DevCluster | None = None
    root: str | None = None
    bench: Bench | None = None
    info: dict[str, Any] = {}
    steps_s: dict[str, float] = {}
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
            info = {"bootstrap": bootstrap, "started_here": False}
            print(f"cluster: existing, {bootstrap}")
        else:
            root = tempfile.mkdtemp(prefix="kafkakv-bench-kafka-", dir=args.dir)
            jvm = benchmark_jvm_options()
            cluster = DevCluster(
                brokers=3,
                base_port=BASE_PORT,
                state_dir=root,
                die_with_parent=True,
                jvm_options=jvm,
            )
            t = time.monotonic()
            cluster.start()
            bootstrap = cluster.bootstrap
            info = {
                "bootstrap": bootstrap,
                "started_here": True,
                "kafka": DEFAULT_KAFKA_VERSION,
                "jvm_options": list(jvm),
                "start_s": round(time.monotonic() - t, 1),
            }
            print(
                f"cluster: 3 brokers at {bootstrap} (Kafka {DEFAULT_KAFKA_VERSION}, started in "
                f"{info['start_s']} s; JVM {' '.join(jvm)})"
            )
        if cluster is not None:
            pids = [pid for i in cluster.node_ids if (pid := cluster.pid(i)) is not None]
        else:
            pids = local_broker_pids()
        bench = Bench(bootstrap, args.quick, CpuMeter(pids))
        steps: dict[str, Callable[[], None]] = {
            "sync": bench.sync,
            "async": bench.async_,
            "bootstrap": bench.bootstrap_,
        }
        for name in dict.fromkeys(names):
            t = time.monotonic()
            steps[name]()
            steps_s[name] = round(time.monotonic() - t, 1)
    finally:
        # A second Ctrl-C must not leave brokers behind; stopping takes a few seconds.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if bench is not None:
            if cluster is None:
                bench.delete_topics()
            bench.close()
        if cluster is not None:
            cluster.stop()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    after = load()
    wall = round(time.monotonic() - began, 1)
    print(f"load average after: {after}; {wall} s in all (steps: {steps_s})")
    results = bench.results if bench is not None else {}
    print(
        json.dumps(
            {
                "machine": machine(),
                "load_before": before,
                "load_after": after,
                "cluster": info,
                "quick": args.quick,
                "wall_s": wall,
                "steps_s": steps_s,
                **results,
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
