"""Faults on the 3-broker cluster (replication factor 3, min.insync.replicas 2): a leader
killed under load, two brokers down, a replica killed inside a flush transaction, and how long
a writer killed inside a transaction holds back readers."""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import re
import signal
import threading
import time
import uuid
from typing import Any

import pytest

import kafkakv
from kafkakv.dev import Cluster, DevCluster
from kafkakv.errors import KafkaKVError, OperationTimeoutError
from kafkakv.log import Record
from kafkakv.log.kafka import KafkaLog
from kafkakv.map import FLUSH_POINT_KEY
from tests.kafka import _fault_workers
from tests.kafka_cluster import create_topic, unique_topic

ctx = mp.get_context("spawn")

pytestmark = pytest.mark.slow


def _name() -> str:
    return f"fault-{uuid.uuid4().hex[:10]}"


def _restore(cluster: Cluster, down: list[int], topic: str) -> None:
    for node in down:
        if not cluster.is_running(node):
            cluster.start_node(node)
    cluster.wait_in_sync(topic, timeout=90)


def _report(reports: Any) -> tuple[Any, ...]:
    try:
        message: tuple[Any, ...] = reports.get(timeout=120)
    except queue.Empty:
        pytest.fail("a writer did not report within 120 s")
    if message[0] == "crash":
        pytest.fail(f"writer {message[1]} crashed:\n{message[2]}")
    return message


def test_kill_9_of_the_leader_under_load_loses_no_acknowledged_update(
    kafka_faults: Cluster,
) -> None:
    url = "kafka://" + kafka_faults.bootstrap
    name = _name()
    with kafkakv.connect(url, timeout=15) as db:
        db.map(name, value_codec="json")  # creates the topics
    ops = f"{name}_ops"
    reports = ctx.Queue()
    sync_now = ctx.Event()
    writers = [
        ctx.Process(target=_fault_workers.writer, args=(url, name, i, 12.0, reports, sync_now))
        for i in range(4)
    ]
    for w in writers:
        w.start()
    killed: list[int] = []
    acked: dict[int, list[str]] = {}
    states: dict[int, dict[str, Any]] = {}
    try:
        # Every writer has its map open (spawning and connecting take seconds on a loaded
        # machine: a fixed sleep killed the leader under a writer still opening), then busy.
        for _ in writers:
            message = _report(reports)
            assert message[0] == "open", message
        time.sleep(3)
        leader = kafka_faults.leader(ops, 0)
        kafka_faults.kill(leader)
        killed.append(leader)
        new_leader = kafka_faults.wait_leader(ops, 0, exclude=[leader], timeout=30)
        assert new_leader != leader
        for kind, into in (("written", acked), ("state", states)):
            for _ in writers:
                message = _report(reports)
                assert message[0] == kind, message
                into[message[1]] = message[2]
            sync_now.set()
    finally:
        sync_now.set()
        for w in writers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
        _restore(kafka_faults, killed, ops)
    # Every writer was busy around the kill (most acknowledgements come in the 4 s before it;
    # on a loaded 2-core machine that is a few dozen sync puts per writer).
    assert all(len(keys) > 20 for keys in acked.values()), {w: len(k) for w, k in acked.items()}
    with kafkakv.connect(url, timeout=15) as db:
        fresh = dict(db.map(name, value_codec="json").items())
    everything = [k for keys in acked.values() for k in keys]
    for wid, state in states.items():
        missing = [k for k in everything if k not in state]
        assert not missing, f"replica {wid} lacks {len(missing)} acknowledged keys"
        assert state == fresh, f"replica {wid} differs from a fresh replica"
    assert all(k in fresh for k in everything)


def test_two_brokers_down_writes_fail_in_time_reads_answer_then_writes_resume(
    kafka_faults: Cluster,
) -> None:
    url = "kafka://" + kafka_faults.bootstrap
    name = _name()
    with kafkakv.connect(url, timeout=6) as db:
        m = db.map(name, value_codec="json", timeout=6)
        m["before"] = 1
        ops = f"{name}_ops"
        leader = kafka_faults.leader(ops, 0)
        down = [n for n in kafka_faults.partitions(ops)[0].replicas if n != leader][:2]
        # Keep the leader, stop two others: the leader is alive but alone in the ISR, and
        # min.insync.replicas=2 refuses writes.
        try:
            for node in down:
                kafka_faults.kill(node)
            start = time.monotonic()
            with pytest.raises(KafkaKVError) as info:
                m["during"] = 2
            elapsed = time.monotonic() - start
            assert elapsed < 6 + 10, f"the write took {elapsed:.1f} s to fail"
            assert isinstance(info.value, OperationTimeoutError | KafkaKVError)
            assert "min.insync.replicas" in str(info.value) or "in time" in str(info.value)
            assert m["before"] == 1  # local reads still answer
            assert "during" not in m or m["during"] == 2
        finally:
            _restore(kafka_faults, down, ops)
        deadline = time.monotonic() + 60
        while True:  # the producer recovers by itself; no restart of anything
            try:
                m["after"] = 3
                break
            except KafkaKVError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        assert m["after"] == 3
    with kafkakv.connect(url, timeout=15) as db:
        again = db.map(name, value_codec="json")
        assert again["before"] == 1 and again["after"] == 3


def test_kill_9_inside_a_flush_transaction_shows_no_half_flush(
    kafka_faults: Cluster,
) -> None:
    url = "kafka://" + kafka_faults.bootstrap
    name = _name()
    with kafkakv.connect(url, timeout=15) as db:
        db.map(name, value_codec="json")
    ready = ctx.Event()
    child = ctx.Process(target=_fault_workers.flusher, args=(url, name, ready))
    child.start()
    try:
        assert ready.wait(60), "the flusher never flushed"
        time.sleep(1.3)  # somewhere in a later round: a put, or inside a flush
        assert child.pid is not None
        _fault_workers.kill_now(child.pid)
        child.join(10)
    finally:
        if child.is_alive():
            child.kill()
    # Every flush writes the 500 keys of one round and then its flush point, in one
    # transaction. Read as committed, the data topic must be whole flushes only: groups of
    # 500 records of one round, each closed by a flush point, and nothing after the last.
    with kafkakv.connect(url, timeout=15) as db:
        log = db.log
        group: list[dict[str, int]] = []
        flushes = 0
        position = log.start_offset(name, 0)
        while True:
            batch = log.read_batch(name, 0, position, max_records=5000)
            if not batch.records:
                break
            for record in batch.records:
                if record.key == FLUSH_POINT_KEY:
                    rounds = {v["round"] for v in group}
                    assert len(group) == 500 and len(rounds) == 1, (len(group), rounds)
                    flushes += 1
                    group = []
                else:
                    group.append(json.loads(record.value or b"null"))
            position = batch.next_offset
        assert flushes >= 1
        assert group == [], f"{len(group)} records of a flush without its flush point"
        # (The map itself may mix rounds: the kill can cut a round of puts short.)
        assert len(db.map(name, value_codec="json")) == 500


ABORTED_HOLD_S = 10.0
"""docs/kafka.md: a writer killed inside a transaction holds back read_committed readers of its
partitions for at most 10 s (its transaction.timeout.ms, the brokers' cleanup interval and the
abort markers' write)."""


def test_a_writer_killed_inside_a_transaction_holds_readers_within_the_documented_bound(
    kafka_faults: Cluster,
) -> None:
    url = "kafka://" + kafka_faults.bootstrap
    topic = _name()
    with kafkakv.connect(url, timeout=15) as db:
        log = db.log
        log.create_topic(topic)
        log.append(topic, 0, [Record(b"before", b"1")])
        started = ctx.Queue()
        child = ctx.Process(target=_fault_workers.open_transaction, args=(url, topic, started))
        child.start()
        try:
            began = started.get(timeout=60)  # wall clock: the transaction starts after this
            assert started.get(timeout=30) == "stored"
            end = log.end_offset(topic, 0)  # the last stable offset: held at the open record
            assert child.pid is not None
            _fault_workers.kill_now(child.pid)
            child.join(10)
        finally:
            if child.is_alive():
                child.kill()
        log.append(topic, 0, [Record(b"after", b"2")])  # behind the open transaction
        while log.end_offset(topic, 0) <= end:  # readers see nothing past the open record
            assert time.time() - began < 30, "the open transaction was never aborted"
            time.sleep(0.02)
        held = time.time() - began
        assert [r.key for r in log.read(topic, 0, 0)] == [b"before", b"after"]
    print(f"readers held for {held:.2f} s after the writer began its transaction")
    assert held <= ABORTED_HOLD_S, f"readers held for {held:.1f} s"


def test_offsets_are_answered_soon_after_the_leader_is_killed_within_each_calls_timeout(
    kafka_faults: Cluster,
) -> None:
    """The end offset (a linearizable read's barrier) comes from the partition's leader.
    After a kill -9 of that leader, the log's metadata client must learn the new one in
    seconds (it once kept asking the dead broker until its periodic refresh, minutes later),
    and no call may outlast its timeout while others queue for that client (the wait for it
    once came on top of the timeout)."""
    topic = unique_topic("offsets")
    create_topic(kafka_faults, topic)
    timeout = 8.0
    log = KafkaLog(kafka_faults.bootstrap, timeout=timeout)
    calls: list[tuple[float, float, str]] = []  # (start after the kill, seconds, outcome)
    killed: list[int] = []
    try:
        assert log.end_offset(topic, 0) == 0
        leader = kafka_faults.leader(topic, 0)
        kafka_faults.kill(leader)
        killed.append(leader)
        at = time.monotonic()
        answered = threading.Event()

        def ask() -> None:
            while not answered.is_set() and time.monotonic() - at < 3 * timeout:
                started = time.monotonic()
                try:
                    outcome = str(log.end_offset(topic, 0))
                    answered.set()
                except KafkaKVError as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                calls.append((started - at, time.monotonic() - started, outcome))

        askers = [threading.Thread(target=ask) for _ in range(3)]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join()
    finally:
        log.close()
        _restore(kafka_faults, killed, topic)
    slow = [c for c in calls if c[1] > timeout + 1.5]
    assert not slow, f"calls over their {timeout} s timeout: {slow}"
    answers = [start + took for start, took, outcome in calls if outcome == "0"]
    assert answers and min(answers) < 2 * timeout, f"no answer from the new leader: {calls}"


def _process_states(cluster: Cluster, nodes: list[int]) -> dict[int, str]:
    """Each broker's pid and its state letter in /proc (T: stopped)."""
    states = {}
    for node in nodes:
        pid = cluster.pid(node) if isinstance(cluster, DevCluster) else None
        try:
            with open(f"/proc/{pid}/stat") as f:
                states[node] = f"pid {pid} {f.read().rsplit(')', 1)[1].split()[0]}"
        except (OSError, TypeError):
            states[node] = f"pid {pid}: no such process"
    return states


def test_a_sync_by_end_offset_keeps_to_the_maps_timeout_while_no_replica_answers(
    kafka_faults: Cluster,
) -> None:
    """``m.sync()`` with end-offset barriers asks the ops partition's leader for its end
    offset. With every replica of that partition stopped (SIGSTOP) none can answer, and the
    call gives up at the map's timeout, not the log's longer one (it asked with the log's:
    about 5 s here, until a new leader answered).

    Every replica, not the leader alone: the leader a test reads from a metadata answer is not
    always the broker the client asks. Under load a broker's metadata lags, and a deposed
    leader may still answer an end offset (no linearizable barrier on Kafka, docs/kafka.md).
    With the leader alone stopped, three fresh-clone runs saw ``sync()`` succeed through
    another broker, the stopped one still named the leader 30 s on; the test, which took
    that success for a failover, then failed (and a success never tested the timeout)."""
    url = "kafka://" + kafka_faults.bootstrap
    name = _name()
    ops = f"{name}_ops"
    with kafkakv.connect(url, timeout=30) as db:
        m = db.map(name, timeout=2, barriers="offset")
        m["a"] = 1
        replicas = list(kafka_faults.partitions(ops)[0].replicas)
        for node in replicas:
            kafka_faults.kill(node, signal.SIGSTOP)
        try:
            started = time.monotonic()
            try:
                m.sync()
            except OperationTimeoutError as exc:
                failed = exc
            else:  # no replica could answer: say what the processes were doing
                pytest.fail(
                    f"sync() answered in {time.monotonic() - started:.2f} s with replicas "
                    f"{replicas} of {ops}[0] stopped: {_process_states(kafka_faults, replicas)}"
                )
            took = time.monotonic() - started
        finally:
            for node in replicas:
                kafka_faults.kill(node, signal.SIGCONT)
        assert took < 2 + 1.0, f"sync() took {took:.2f} s with a map timeout of 2 s"
        assert re.search(r"no answer within (2\.0|1\.9\d*) s", str(failed)), failed
        kafka_faults.wait_in_sync(ops, timeout=90)
        m.sync()  # the cluster whole again
        assert m["a"] == 1
