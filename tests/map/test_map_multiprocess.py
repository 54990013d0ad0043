"""Many processes on one map: random updates under kill -9, exact counters, an invariant.

The children (tests/map/_workers.py) are spawned and reach the log only through ``target``,
so these tests run unchanged on every log that other processes reach (not the memory log). Random tests print their seed; set
``KAFKAKV_SEED`` to replay the same choices (process scheduling still varies).
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import queue
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

import kafkakv
from kafkakv.codecs import Codec, codec_for
from kafkakv.errors import DecodeError, OperationFailedError
from kafkakv.log import Log
from kafkakv.map import MapTopics
from kafkakv.map.ops import KEEP, Op, OpCode, decide, decode_op
from tests.conftest import bounded
from tests.map import _workers
from tests.map.conftest import compact_if_possible, shared_logs
from tests.waiting import wait_for

pytestmark = shared_logs

ctx = mp.get_context("spawn")


def _seed() -> int:
    seed = int(os.environ.get("KAFKAKV_SEED") or random.randrange(2**32))
    print(f"KAFKAKV_SEED={seed}")
    return seed


def _collect(
    reports: Any, wanted: dict[str, int], timeout: float = 90.0
) -> dict[str, list[tuple[Any, ...]]]:
    """Messages from the children until ``wanted[kind]`` of each kind arrived; a child that
    crashed fails the test with its traceback."""
    got: dict[str, list[tuple[Any, ...]]] = {kind: [] for kind in wanted}
    deadline = time.monotonic() + timeout
    while any(len(got[k]) < n for k, n in wanted.items()):
        try:
            message = reports.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"children did not report in {timeout} s: have {got}, want {wanted}")
        if message[0] == "crash":
            pytest.fail(f"child {message[1]} crashed:\n{message[2]}")
        assert message[0] in wanted, message
        got[message[0]].append(message)
    return got


def _died(reports: Any, who: str) -> None:
    """Fail for a child that exited on its own, with its traceback when it sent one."""
    try:
        message = reports.get(timeout=5)
    except queue.Empty:
        message = ("", "", "no traceback")
    pytest.fail(f"{who} exited by itself: {message[-1]}")


def _spawn(target: Callable[..., None], *args: Any) -> mp.process.BaseProcess:
    proc = ctx.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def _reap(procs: list[mp.process.BaseProcess]) -> None:
    """Join the children; kill (by pid) whichever is still running after a failure."""
    for proc in procs:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(30)


def _create(target: str, name: str, partitions: int, **options: Any) -> None:
    """Create the map's topics before the children race to do it."""
    with kafkakv.connect(target) as db:
        db.map(name, partitions=partitions, **options).close()


# -- 1. random updates, kill -9, replay -----------------------------------------------------
SLOTS = 4
HOT_KEYS = 8
KEYS = 300
PARTITIONS = 3
RUN_SECONDS = 4.0
RESULTS = 200


def _ident(op: Op, values: Codec[Any]) -> Any:
    """The unique value (or compute tag) that tells this op apart in the workers' results."""
    if op.code in (OpCode.PUT, OpCode.PUT_IF_ABSENT, OpCode.REPLACE):
        return values.decode(op.args[0])
    if op.code in (OpCode.COMPARE_AND_SET, OpCode.MERGE):
        return values.decode(op.args[1])
    if op.code is OpCode.COMPUTE:
        return msgpack.unpackb(op.args[1], raw=False)[1]
    return None


def _replay(log: Log, name: str, partitions: int) -> tuple[dict[str, Any], dict[Any, Any]]:
    """Decide every ops record from offset 0 of every partition, as a replica would.

    Returns the final contents and, per recognisable op ``(code name, unique value)``, the
    result its writer should have got ("error" for an op decided as failed).
    """
    topic = MapTopics.for_name(name).ops
    keys, values = codec_for("str"), codec_for("json")
    state: dict[bytes, bytes] = {}
    decided: dict[Any, Any] = {}
    for p in range(partitions):
        assert log.start_offset(topic, p) == 0, "this test needs every op still in the log"
        position = 0
        while records := log.read(topic, p, position, max_records=5000, max_bytes=1 << 24):
            position = (records[-1].offset or 0) + 1
            for record in records:
                try:
                    op = decode_op(record.value)
                except DecodeError:
                    continue
                if op.code.control or record.key is None:
                    continue
                if op.code is OpCode.WRITE_MANY:  # put_async calls the sender gathered
                    for key, value in zip(*op.args, strict=True):
                        old = state.pop(key, None)
                        if value is not None:
                            state[key] = value
                            found = None if old is None else values.decode(old)
                            decided[("PUT", values.decode(value))] = found
                    continue
                result: Any
                try:
                    result, new = decide(
                        op.code, op.args, state.get(record.key), record.key, keys, values
                    )
                except OperationFailedError:
                    result, new = "error", KEEP
                if isinstance(result, bytes):
                    result = values.decode(result)
                if new is None:
                    state.pop(record.key, None)
                elif new is not KEEP:
                    assert isinstance(new, bytes)
                    state[record.key] = new
                ident = _ident(op, values)
                if ident is not None:
                    decided[(op.code.name, ident)] = result
    contents = {keys.decode(k): values.decode(v) for k, v in state.items()}
    return contents, decided


def _check_results(results_dir: Path, decided: dict[Any, Any]) -> int:
    """Every result a worker got equals what the replay decided for its record; returns how
    many were checked."""
    checked, wrong = 0, []
    for path in sorted(results_dir.glob("results-*.jsonl")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            try:
                code, ident, result = json.loads(line)
            except ValueError:
                assert i == len(lines) - 1, f"{path.name}:{i + 1} is torn: {line!r}"
                continue  # the last line of a killed worker
            checked += 1
            if (code, ident) in decided:
                if decided[(code, ident)] != result:
                    wrong.append((path.name, code, ident, result, decided[(code, ident)]))
            elif not (code == "PUT_IF_ABSENT" and result is not None):
                # Only a put-if-absent answered from the local state has no record.
                wrong.append((path.name, code, ident, result, "no record in the log"))
    assert wrong == [], f"{len(wrong)} results differ from the replay: {wrong[:10]}"
    return checked


@pytest.mark.slow
def test_random_updates_with_kill_9_converge_to_a_replay_of_the_ops_log(
    target: str, store_kind: str, map_name: str, tmp_path: Path
) -> None:
    seed = _seed()
    rng = random.Random(seed)
    _create(target, map_name, PARTITIONS)
    phase = ctx.RawValue("i", _workers.RUN)
    ready = ctx.RawArray("i", SLOTS)
    reports = ctx.Queue()
    incarnations = itertools.count(1)
    running: dict[int, tuple[mp.process.BaseProcess, int]] = {}
    everyone: list[mp.process.BaseProcess] = []

    def start(slot: int) -> None:
        incarnation = next(incarnations)
        options: dict[str, Any] = {"partitions": PARTITIONS, "flush_period": 50}
        options["store"] = store_kind
        if store_kind == "lmdb":  # the replacement resumes from the killed one's store
            options["store_path"] = str(tmp_path / f"store-slot-{slot}")
        results = str(tmp_path / f"results-{incarnation}.jsonl")
        proc = _spawn(
            _workers.random_ops,
            *(target, map_name, options, slot, incarnation, seed + incarnation, HOT_KEYS, KEYS),
            *(phase, ready, results, reports),
        )
        running[slot] = (proc, incarnation)
        everyone.append(proc)

    try:
        for slot in range(SLOTS):
            start(slot)
        kills = 0
        stop_killing = time.monotonic() + RUN_SECONDS
        while time.monotonic() < stop_killing:
            time.sleep(rng.uniform(0.2, 0.8))
            slot = rng.randrange(SLOTS)
            proc, _ = running[slot]
            if not proc.is_alive():
                _died(reports, f"worker {slot}")
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(30)
            assert proc.exitcode == -signal.SIGKILL
            kills += 1
            start(slot)

        def replacements_ready() -> bool:
            if not all(p.is_alive() for p, _ in running.values()):
                _died(reports, "a replacement worker")
            return all(ready[s] == inc for s, (_, inc) in running.items())

        wait_for(replacements_ready, 60, "the replacement workers to open the map")
        time.sleep(0.5)  # the replacements work too
        # Enough work for the checks below, however slowly a loaded machine runs it: the
        # clock above bounds the kills, not the work (at least 100 ops decided are asserted).
        wait_for(
            lambda: (
                sum(f.read_bytes().count(b"\n") for f in tmp_path.glob("results-*.jsonl"))
                >= RESULTS
            ),
            120,
            f"{RESULTS} results written by the workers",
        )
        # The check below starts from the data topic: let the workers run until a flush has
        # landed there. A flush on Kafka is a transaction, and on a busy machine none may have
        # committed in the few seconds of kills (seen once in a full test run).
        data = MapTopics.for_name(map_name).data
        with kafkakv.connect(target) as watcher:
            wait_for(
                lambda: sum(watcher.log.end_offset(data, p) for p in range(PARTITIONS)) > 0,
                60,
                "a flush to the data topic while the workers run",
            )
        phase.value = _workers.STOP
        _collect(reports, {"stopped": SLOTS})
        phase.value = _workers.REPORT
        finals = _collect(reports, {"final": SLOTS})["final"]
        _reap(everyone)
        assert [p.exitcode for p, _ in running.values()] == [0] * SLOTS
    finally:
        _reap(everyone)

    with kafkakv.connect(target) as db:
        expected, decided = _replay(db.log, map_name, PARTITIONS)
        topics = MapTopics.for_name(map_name)
        assert sum(db.log.end_offset(topics.data, p) for p in range(PARTITIONS)) > 0, "no flush"
    checked = _check_results(tmp_path, decided)
    total_ops = sum(f[6] for f in finals)
    print(f"{kills} kills, {len(decided)} ops decided, {checked} results checked")
    # Enough work over the whole run; the final incarnations (0.5 s each) did some too. (Their
    # own count is no fixed number: on a loaded 2-core machine with Kafka it can be a handful.)
    assert kills >= 3 and total_ops > 0 and len(decided) > 100 and checked > 100
    for _, slot, incarnation, contents, store_problems, errors, _ops in finals:
        assert errors == [], f"worker {slot}/{incarnation}: {errors}"
        assert store_problems == [], f"worker {slot}/{incarnation} store: {store_problems}"
        assert contents == expected, f"worker {slot}/{incarnation} differs from the replay"

    fresh_options: list[dict[str, Any]] = [
        {"store": "dict"},  # loads the data topic, then the ops after the last flush
        {"store": store_kind, "shard": [1]},
    ]
    if store_kind == "lmdb":
        fresh_options[1]["store_path"] = str(tmp_path / "store-fresh")
        fresh_options.append({"store": "lmdb", "store_path": str(tmp_path / "store-slot-0")})
    for options in fresh_options:
        with kafkakv.connect(target) as db:
            m = db.map(map_name, **options)
            m.sync()
            want = {k: v for k, v in expected.items() if m.partition_of(k) in m.partitions}
            assert dict(m.items()) == want, options
            assert m.check() == [], options


# -- 2. exact counters ----------------------------------------------------------------------
COUNTERS = 4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "n"), [("cas", bounded(150, 300)), ("compute", bounded(300, 600))]
)
def test_counters_incremented_by_many_processes_are_exact(
    target: str, map_name: str, method: str, n: int
) -> None:
    _create(target, map_name, 2)
    phase = ctx.RawValue("i", _workers.WAIT)
    reports = ctx.Queue()
    procs = [
        _spawn(_workers.count, target, map_name, w, method, n, phase, reports)
        for w in range(COUNTERS)
    ]
    try:
        _collect(reports, {"ready": COUNTERS})
        started = time.monotonic()
        phase.value = _workers.GO
        done = _collect(reports, {"done": COUNTERS})["done"]
        elapsed = time.monotonic() - started
        phase.value = _workers.FINISH
        finals = _collect(reports, {"final": COUNTERS})["final"]
    finally:
        _reap(procs)
    assert [p.exitcode for p in procs] == [0] * COUNTERS
    total = COUNTERS * n
    retries = sum(d[3] for d in done)
    print(f"{method}: {total} increments in {elapsed:.2f} s, {retries} CAS retries")
    # Each increment returned a distinct new value: together exactly 1..total.
    assert sorted(v for d in done for v in d[2]) == list(range(1, total + 1))
    assert [(f[2], f[3]) for f in finals] == [(total, [])] * COUNTERS
    with kafkakv.connect(target) as db:
        assert db.map(map_name)["counter"] == total


# -- 3. the Fibonacci invariant -------------------------------------------------------------
ADVANCERS = 3
OBSERVERS = 2
# The run lasts ADVANCE_SECONDS and then until there are ADVANCES advances, one or more from
# every advancer, so that the CAS of several processes interleave in the log. A clock alone
# gave 21-250 advances on Kafka depending on the machine's load, and once an advancer that
# lost every race in it (CAS promises no fairness: 0 of about 70 tries, under CI's load).
ADVANCE_SECONDS = 3.0
ADVANCES = 60
ADVANCE_TIMEOUT = 120.0


@pytest.mark.slow
def test_fibonacci_triple_advanced_by_cas_is_consecutive_in_every_replica(
    target: str, map_name: str
) -> None:
    phase = ctx.RawValue("i", _workers.WAIT)
    progress = [ctx.RawValue("i", 0) for _ in range(ADVANCERS)]
    reports = ctx.Queue()
    procs: list[mp.process.BaseProcess] = []
    with kafkakv.connect(target) as db:
        m = db.map(map_name, partitions=1, value_codec="str")
        try:
            # Observers first, so that their listeners see the triple from its first put.
            procs += [
                _spawn(_workers.observe, target, map_name, w, phase, reports)
                for w in range(OBSERVERS)
            ]
            _collect(reports, {"ready": OBSERVERS})
            for key, value in zip(_workers.FIB_KEYS, ("1", "1", "2"), strict=True):
                m[key] = value
            procs += [
                _spawn(_workers.advance, target, map_name, 100 + w, phase, progress[w], reports)
                for w in range(ADVANCERS)
            ]
            _collect(reports, {"ready": ADVANCERS})
            phase.value = _workers.GO
            time.sleep(ADVANCE_SECONDS)
            try:
                wait_for(
                    lambda: (
                        sum(p.value for p in progress) >= ADVANCES
                        and min(p.value for p in progress) > 0
                    ),
                    ADVANCE_TIMEOUT,
                    f"{ADVANCES} advances, at least one from each advancer",
                )
            except AssertionError as timed_out:
                pytest.fail(f"{timed_out}; advances so far: {[p.value for p in progress]}")
            phase.value = _workers.FINISH
            done = _collect(reports, {"done": ADVANCERS})["done"]
            phase.value = _workers.REPORT_ALL
            finals = _collect(reports, {"final": OBSERVERS})["final"]
        finally:
            _reap(procs)
        assert [p.exitcode for p in procs] == [0] * len(procs)
        m.sync()
        triple = sorted(int(m[k]) for k in _workers.FIB_KEYS)

    advances = sum(d[2] for d in done)
    failures = sum(d[3] for d in done)
    print(f"{advances} advances ({[d[2] for d in done]}), {failures} failed CAS")
    assert advances >= ADVANCES and all(d[2] > 0 for d in done)
    fib = _workers.Fibonacci()
    # Start (1, 1, 2) = F(1), F(2), F(3); each advance moves the window by one.
    assert triple == [fib[1 + advances], fib[2 + advances], fib[3 + advances]]
    for _, worker, violations, events, state, polls in finals:
        assert violations == [], f"observer {worker}"
        assert events == 3 + advances, f"observer {worker}: one event per put and advance"
        assert sorted(state.values()) == triple, f"observer {worker}"
        assert polls > 0


# -- 4. a flusher killed in the middle of a flush -------------------------------------------
@pytest.mark.slow
def test_a_flusher_killed_at_any_moment_loses_nothing(target: str, map_name: str) -> None:
    """Processes that flush every 5 updates are killed with SIGKILL at random moments, many of
    them inside a flush. Afterwards a fresh replica (data topic, then ops) equals a replica
    that followed everything, before and after one more flush and a compaction.

    Each child is killed at a random moment counted from an event the follower sees, not from
    the spawn: a spawned child needs 0.25-0.5 s to land its first flush on an idle 2-core
    machine and 0.7-2.4 s on a loaded one, so a kill 0.15-0.4 s after the spawn often fell
    before any flush, and in every round under load ("no flush landed"). Even rounds count
    from the child's first update (the kill may land while it opens its flush writer or in its
    first flush), odd rounds from its first flush landed (later flushes; and flushes land
    however slowly the children start)."""
    seed = _seed()
    rnd = random.Random(seed)
    _create(target, map_name, 2)
    with kafkakv.connect(target) as db:
        follower = db.map(map_name)

        def seen() -> tuple[int, int]:
            """(ops applied, ops covered by flushes) of the follower, over both partitions."""
            positions = follower._engine.positions().values()
            return sum(p.applied for p in positions), sum(p.flushed for p in positions)

        for round_ in range(8):
            event = round_ % 2  # 0: an update of this child applied, 1: a flush of it landed
            before = seen()[event]
            proc = _spawn(_workers.flusher, target, map_name, seed + round_)
            wait_for(
                lambda: seen()[event] > before or not proc.is_alive(),  # noqa: B023 (this round)
                90,
                f"the flusher of round {round_} at work",
            )
            time.sleep(rnd.random() * 0.25)
            assert proc.is_alive(), "the flusher exited by itself"
            os.kill(proc.pid or 0, signal.SIGKILL)
            proc.join(30)
        follower.sync()
        data_records = sum(db.log.end_offset(map_name, p) for p in range(2))
        assert data_records > 0, "no flush landed: the test did not test anything"
        expected = dict(follower.items())
        with kafkakv.connect(target) as fresh_db:
            assert dict(fresh_db.map(map_name).items()) == expected
        follower.flush()
        compact_if_possible(db.log, map_name)
        with kafkakv.connect(target) as fresh_db:
            fresh = fresh_db.map(map_name)
            assert dict(fresh.items()) == expected
            assert fresh.check() == [] and db.log.check() == []
