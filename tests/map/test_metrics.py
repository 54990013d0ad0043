"""What map replicas report to Prometheus (kafkakv.map.metrics), scraped as Prometheus would.

- updates applied are counted per partition, by every replica, barriers and flush marks aside;
- the apply lag is the log's end offset minus the applied position, and a scrape stays
  bounded when the log does not answer, or while an applier holds the replica;
- updates in flight, flush durations, errors;
- a replica stopped on a function not registered here says so, naming the function;
- a child made by fork does not report the replicas it inherited.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import kafkakv
from kafkakv import functions
from kafkakv.codecs import codec_for
from kafkakv.errors import FunctionError
from kafkakv.log.base import Log, Record
from kafkakv.map.machine import MapState, MapTable, PartitionMachine
from kafkakv.map.metrics import FLUSH_BUCKETS, SCRAPE_WAIT
from kafkakv.map.ops import OpCode, encode_op
from kafkakv.store.memory import DictStore
from tests.doubles import ForwardingLog
from tests.map.conftest import OpenMap
from tests.waiting import wait_for

dict_store = pytest.mark.parametrize("store_kind", ["dict"], indirect=True)
"""What these tests check is the replica's, whatever its store."""


# -- scraping -------------------------------------------------------------------------------
def scrape() -> list[Sample]:
    """Every sample of the default registry, through the text format Prometheus reads. Fails
    (rather than hangs) when the scrape takes much longer than it may."""
    texts: list[str] = []
    thread = threading.Thread(
        target=lambda: texts.append(generate_latest(REGISTRY).decode()), daemon=True
    )
    thread.start()
    thread.join(SCRAPE_WAIT + 10)
    assert texts, "the scrape did not return"
    return [s for family in text_string_to_metric_families(texts[0]) for s in family.samples]


def value(samples: list[Sample], name: str, m: Any, **labels: str) -> float | None:
    """The value of sample ``name`` of replica ``m`` with ``labels`` (None: absent)."""
    want = {"map": m.name, "replica": m._engine.origin.hex(), **labels}
    found = [s.value for s in samples if s.name == name and want.items() <= s.labels.items()]
    assert len(found) <= 1, f"{name} {want} matches {len(found)} samples"
    return found[0] if found else None


def per_partition(samples: list[Sample], name: str, m: Any) -> dict[int, float]:
    replica = m._engine.origin.hex()
    return {
        int(s.labels["partition"]): s.value
        for s in samples
        if s.name == name and s.labels["map"] == m.name and s.labels["replica"] == replica
    }


@contextmanager
def held_elsewhere(m: Any) -> Iterator[None]:
    """Hold replica ``m`` (its lock, as an applier does) in another thread meanwhile: nothing
    is applied, and no update of it resolves."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with m._engine.paused():
            held.set()
            release.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join(10)


# -- updates applied --------------------------------------------------------------------------
NO_ARGS = msgpack.packb([])  # a compute's arguments, as the map packs them


def _machine() -> PartitionMachine:
    state = MapState("m", b"", codec_for("str"), codec_for("json"), DictStore())
    return PartitionMachine(0, MapTable([state]), b"me------", 1000, "ops")


def _records(values: list[tuple[bytes | None, bytes]], first: int = 0) -> list[Record]:
    return [Record(k, v, (), None, 0, first + i) for i, (k, v) in enumerate(values)]


@pytest.fixture
def failing() -> Iterator[str]:
    name = "test_metrics.failing"

    def refuse(key: str, old: Any) -> Any:
        raise ValueError("refused")

    functions.register(name)(refuse)
    yield name
    functions.unregister(name)


def test_the_machine_counts_update_records_whatever_their_outcome(failing: str) -> None:
    me = b"me------"
    machine = _machine()
    step = machine.apply_batch(
        _records(
            [
                (b"a", encode_op(OpCode.PUT, me, 1, [b"1"])),
                (None, encode_op(OpCode.BARRIER, me, 2)),  # no update
                (b"a", encode_op(OpCode.PUT_IF_ABSENT, me, 3, [b"2"])),  # changes nothing
                (b"a", encode_op(OpCode.COMPUTE, me, 4, [failing, NO_ARGS])),  # fails
                (b"b", b"\xc1 not an op"),  # noted as an error, no update
                (b"c", encode_op(OpCode.WRITE_MANY, me, 5, ([b"c", b"d"], [b"1", b"2"]))),
                (None, encode_op(OpCode.FLUSHED, me, -1, [0])),  # no update
            ]
        ),
        7,
    )
    assert step.updates == 4
    machine.advance(step)
    assert machine.updates == 4
    # The bulk path (16 puts or more) counts as the record loop does.
    # (numbers 6, 8, ...: the writer's next in lane 0, after those of the batch above)
    puts = _records(
        [(b"k%d" % i, encode_op(OpCode.PUT, me, 2 * i, [b"1"])) for i in range(3, 23)], 7
    )
    bulk = machine.apply_puts(puts, 27)
    assert bulk is not None and bulk.updates == 20
    machine.advance(bulk)
    assert machine.updates == 24
    # A stall: the records before it are counted, it and those after are not.
    step = machine.apply_batch(
        _records(
            [
                (b"x", encode_op(OpCode.PUT, me, 60, [b"1"])),
                (None, encode_op(OpCode.BARRIER, me, 61)),
                (b"x", encode_op(OpCode.COMPUTE, me, 62, ["test_metrics.nowhere", NO_ARGS])),
                (b"y", encode_op(OpCode.PUT, me, 63, [b"1"])),
            ],
            27,
        ),
        31,
    )
    assert step.stall is not None and step.updates == 1
    machine.advance(step)
    assert machine.updates == 25


@dict_store
def test_every_replica_counts_the_updates_it_applies_per_partition(
    open_map: OpenMap, failing: str
) -> None:
    writer = open_map(partitions=3, barriers="shared")  # sync appends barrier records
    keys = [f"k{i}" for i in range(12)]
    for k in keys[:6]:
        writer[k] = 1
    assert not writer.compare_and_set("k0", 99, 2)  # changes nothing: applied all the same
    with pytest.raises(FunctionError):
        writer.compute("k1", failing)  # failed: applied all the same
    writer.update({k: 2 for k in keys})  # one record per partition
    writer.sync()  # barrier records: no updates
    expected = dict.fromkeys(writer.partitions, 0)
    for k in [*keys[:6], "k0", "k1"]:
        expected[writer.partition_of(k)] += 1
    for p in {writer.partition_of(k) for k in keys}:
        expected[p] += 1
    samples = scrape()
    assert per_partition(samples, "kafkakv_map_updates_applied_total", writer) == expected
    assert value(samples, "kafkakv_map_errors_total", writer) == 1
    peer = open_map()  # replays the same ops at bootstrap: counts the same
    samples = scrape()
    assert per_partition(samples, "kafkakv_map_updates_applied_total", peer) == expected
    writer.flush()  # flush marks: no updates
    writer["k0"] = 3
    peer.sync()
    expected[writer.partition_of("k0")] += 1
    samples = scrape()
    assert per_partition(samples, "kafkakv_map_updates_applied_total", peer) == expected
    assert per_partition(samples, "kafkakv_map_updates_applied_total", writer) == expected


# -- apply lag ------------------------------------------------------------------------------
@dict_store
def test_the_lag_is_what_the_log_holds_beyond_the_applied_position(open_map: OpenMap) -> None:
    writer = open_map(partitions=2)
    peer = open_map()
    p = writer.partition_of("k")
    other = 1 - p
    assert per_partition(scrape(), "kafkakv_map_apply_lag", peer) == {p: 0, other: 0}
    with held_elsewhere(peer):  # the scrape waits for no applier
        for i in range(3):
            writer["k"] = i
        wait_for(lambda: value(scrape(), "kafkakv_map_apply_lag", peer, partition=str(p)) == 3)
        samples = scrape()
        applied = value(samples, "kafkakv_map_applied_offset", peer, partition=str(p))
        assert applied == writer.applied_offsets()[p] - 3
        assert value(samples, "kafkakv_map_apply_lag", peer, partition=str(other)) == 0
    wait_for(lambda: per_partition(scrape(), "kafkakv_map_apply_lag", peer) == {p: 0, other: 0})


class _HangingLog(ForwardingLog):
    """A log whose end offsets do not come while ``answering`` is clear, as a broker that is
    unreachable does not answer, and come ``latency`` seconds late, as a slow one's do."""

    def __init__(self, inner: Log) -> None:
        super().__init__(inner)
        self.answering = threading.Event()
        self.answering.set()
        self.latency = 0.0
        self.asked = 0  # end offsets asked for

    def end_offset(self, topic: str, partition: int, *, timeout: float | None = None) -> int:
        self.asked += 1
        assert self.answering.wait(60), "the test never answered"
        time.sleep(self.latency)  # the log's latency, not a wait for anything
        return super().end_offset(topic, partition, timeout=timeout)


def _hanging(logs: list[_HangingLog]) -> Callable[[Log], Log]:
    def wrap(inner: Log) -> Log:
        logs.append(_HangingLog(inner))
        return logs[-1]

    return wrap


@dict_store
def test_a_scrape_waits_a_moment_for_the_end_offsets(open_map: OpenMap) -> None:
    logs: list[_HangingLog] = []
    m = open_map(log=_hanging(logs))
    writer = open_map()
    (log,) = logs
    assert value(scrape(), "kafkakv_map_apply_lag", m, partition="0") == 0
    log.latency = SCRAPE_WAIT / 4  # slower than the rest of a scrape, within its bound
    with held_elsewhere(m):
        writer["k"] = 1
        writer["k"] = 2
        assert value(scrape(), "kafkakv_map_apply_lag", m, partition="0") == 2


@dict_store
def test_a_scrape_stays_bounded_while_the_log_does_not_answer(open_map: OpenMap) -> None:
    logs: list[_HangingLog] = []
    m = open_map(partitions=2, log=_hanging(logs))
    (log,) = logs
    assert per_partition(scrape(), "kafkakv_map_apply_lag", m) == {0: 0, 1: 0}
    log.answering.clear()
    asked = log.asked
    try:
        silent = time.monotonic()
        for _ in range(2):  # the second finds the first's read still under way
            started = time.monotonic()
            samples = scrape()
            assert time.monotonic() - started < SCRAPE_WAIT + 1.0
            # The last end offsets the log gave, and how old they are.
            assert per_partition(samples, "kafkakv_map_apply_lag", m) == {0: 0, 1: 0}
            ages = per_partition(samples, "kafkakv_map_end_offset_age_seconds", m)
            assert set(ages) == {0, 1}
            assert min(ages.values()) >= time.monotonic() - silent - 0.5
        assert log.asked == asked + 1  # one read under way, not one more per scrape
    finally:
        log.answering.set()
    answered = time.monotonic()

    def fresh() -> bool:
        ages = per_partition(scrape(), "kafkakv_map_end_offset_age_seconds", m)
        return max(ages.values()) <= time.monotonic() - answered

    wait_for(fresh, 10, "end offsets read after the log answered again")


# -- updates in flight, flushes --------------------------------------------------------------
@dict_store
def test_updates_in_flight_are_those_not_resolved_yet(open_map: OpenMap) -> None:
    m = open_map()
    assert value(scrape(), "kafkakv_map_updates_in_flight", m) == 0
    with held_elsewhere(m):
        futures = [m.put_async(f"k{i}", i) for i in range(5)]
        assert value(scrape(), "kafkakv_map_updates_in_flight", m) == 5
    for future in futures:
        future.result(timeout=30)
    assert value(scrape(), "kafkakv_map_updates_in_flight", m) == 0


@dict_store
def test_each_flush_that_writes_is_timed(open_map: OpenMap) -> None:
    m = open_map(partitions=2)
    name = "kafkakv_map_flush_duration_seconds"
    assert value(scrape(), f"{name}_count", m) == 0
    m.update({f"k{i}": i for i in range(50)})
    started = time.perf_counter()
    m.flush()  # both partitions hold keys: two flushes
    took = time.perf_counter() - started
    m.flush()  # nothing dirty: nothing written, nothing timed
    samples = scrape()
    assert value(samples, f"{name}_count", m) == 2
    total = value(samples, f"{name}_sum", m)
    assert total is not None and 0 < total <= took
    found = [value(samples, f"{name}_bucket", m, le=str(b)) for b in FLUSH_BUCKETS]
    buckets = [b for b in found if b is not None]
    assert len(buckets) == len(FLUSH_BUCKETS) and buckets == sorted(buckets)  # cumulative
    assert value(samples, f"{name}_bucket", m, le="+Inf") == 2


# -- a replica stopped on a missing function ---------------------------------------------------
@pytest.fixture
def adding() -> Iterator[str]:
    name = "test_metrics.add"

    def add(key: str, old: Any, n: int) -> int:
        return int(old or 0) + n

    functions.register(name)(add)
    yield name
    functions.unregister(name)


def _stalled(m: Any, p: int, function: str = "") -> Callable[[list[Sample]], float | None]:
    return lambda samples: value(
        samples, "kafkakv_map_stalled", m, partition=str(p), function=function
    )


@dict_store
def test_a_stalled_replica_names_the_missing_function(open_map: OpenMap, adding: str) -> None:
    writer = open_map(partitions=2)
    assert writer.compute("k", adding, 42) == 42
    p = writer.partition_of("k")
    offset = writer.applied_offsets()[p] - 1
    add = functions.lookup(adding)
    functions.unregister(adding)  # a replica in a process that lacks it
    peer = open_map()
    samples = scrape()
    assert _stalled(peer, p, adding)(samples) == 1
    assert _stalled(peer, p)(samples) is None
    assert _stalled(peer, 1 - p)(samples) == 0
    assert _stalled(writer, p)(samples) == 0
    # Where it stopped: the record it cannot apply, noted among the errors.
    assert value(samples, "kafkakv_map_applied_offset", peer, partition=str(p)) == offset
    assert value(samples, "kafkakv_map_apply_lag", peer, partition=str(p)) == 1
    assert value(samples, "kafkakv_map_errors_total", peer) == 1
    functions.register(adding)(add)  # applying resumes by itself
    wait_for(lambda: not peer.stalled(), 10, "the partition to resume")
    peer.sync()
    samples = scrape()
    assert _stalled(peer, p)(samples) == 0 and _stalled(peer, p, adding)(samples) is None
    assert value(samples, "kafkakv_map_apply_lag", peer, partition=str(p)) == 0


# -- fork -------------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_child_made_by_fork_reports_its_own_replicas_only(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with kafkakv.connect(path) as db:
        m = db.map("forked")
        m["k"] = 1
        parent = m._engine.origin.hex()
        assert any(s.labels.get("replica") == parent for s in scrape())
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit code
            code = 1
            try:
                with kafkakv.connect(path) as own:
                    mine = own.map("forked")._engine.origin.hex()
                    replicas = {s.labels.get("replica") for s in scrape()}
                    code = 0 if mine in replicas and parent not in replicas else 2
            finally:
                os._exit(code)
        statuses: list[int] = []

        def exited() -> bool:
            done, status = os.waitpid(pid, os.WNOHANG)
            statuses.append(status)
            return done != 0

        try:
            wait_for(exited, 30, "the forked child to exit")
        except AssertionError:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        assert os.waitstatus_to_exitcode(statuses[-1]) == 0
