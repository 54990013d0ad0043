"""Histories of a linearizable map, written by several processes at once, are linearizable.

Client processes (``tests/lincheck/workload.py``), each with its own replica, call reads and
updates of every kind on a few shared keys from several threads, and note each call's start,
end and result. porcupine (``tests/lincheck``) then searches for an order of the calls that
respects real time and that the map's sequential model explains. A stale read, a lost or
doubled update or a result that does not match the state it claims fails the test, with the
counterexample drawn into the test's directory. The model and the checker are tested on
histories made by hand first, so a checker that accepts anything fails too.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kafkakv
from kafkakv.dev import Cluster
from tests.lincheck import Op, Verdict, build, check, read_history, workload
from tests.map.conftest import log_options, shared_logs
from tests.waiting import wait_for

ctx = mp.get_context("spawn")

PROCESSES = 3
THREADS = 2


@pytest.fixture(scope="module")
def lincheck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("lincheck"))


# -- the checker on histories made by hand ------------------------------------------------
def _op(kind: str, key: str, call: int, ret: int | None, output: str = "", **args: str) -> Op:
    return Op(0, kind, key, call, ret, output=output, known=ret is not None, **args)


def _verdict(lincheck: Path, *ops: Op) -> str:
    """The checker's verdict on ``ops``, each its own client."""
    return check(lincheck, [dataclasses.replace(op, client=n) for n, op in enumerate(ops)]).result


def test_the_checker_refuses_a_stale_read(lincheck: Path) -> None:
    put = _op("put", "k", 0, 10, "", value="a")
    assert _verdict(lincheck, put, _op("get", "k", 20, 30, "a")) == "ok"
    put = _op("put", "k", 0, 10, "", value="a")
    assert _verdict(lincheck, put, _op("get", "k", 20, 30, "")) == "illegal"


def test_the_checker_lets_concurrent_calls_take_either_order(lincheck: Path) -> None:
    for seen in ("", "a"):
        put = _op("put", "k", 0, 30, "", value="a")
        assert _verdict(lincheck, put, _op("get", "k", 10, 20, seen)) == "ok"
    put = _op("put", "k", 0, 30, "", value="a")
    assert _verdict(lincheck, put, _op("get", "k", 10, 20, "b")) == "illegal"


def test_the_checker_follows_each_kind_of_update(lincheck: Path) -> None:
    def run(*ops: Op) -> str:
        return _verdict(lincheck, *ops)

    pia = _op("put_if_absent", "k", 0, 1, "", value="a")
    assert (
        run(pia, _op("put_if_absent", "k", 2, 3, "a", value="b"), _op("get", "k", 4, 5, "a"))
        == "ok"
    )
    assert (
        run(
            _op("put", "k", 0, 1, "", value="a"),
            _op("compare_and_set", "k", 2, 3, "true", value="b", expected="a"),
            _op("compare_and_set", "k", 4, 5, "false", value="c", expected="a"),
            _op("get", "k", 6, 7, "b"),
        )
        == "ok"
    )
    assert (
        run(
            _op("put", "k", 0, 1, "", value="a"),
            _op("compare_and_set", "k", 2, 3, "true", value="b", expected=""),
        )
        == "illegal"
    )  # "" expects the key absent
    assert (
        run(
            _op("replace", "k", 0, 1, "", value="a"),
            _op("contains", "k", 2, 3, "false"),
            _op("put", "k", 4, 5, "", value="b"),
            _op("remove_if", "k", 6, 7, "false", expected="a"),
            _op("remove_if", "k", 8, 9, "true", expected="b"),
            _op("remove", "k", 10, 11, ""),
        )
        == "ok"
    )
    assert run(_op("put_blind", "k", 0, 1, value="a"), _op("get", "k", 2, 3, "a")) == "ok"
    assert run(_op("remove_blind", "k", 0, 1), _op("get", "k", 2, 3, "a")) == "illegal"
    assert (
        run(
            _op("put", "k", 0, 1, "", value="a"),
            _op("get_versioned", "k", 2, 3, "a@7"),
            _op("compare_version_and_set", "k", 4, 5, "true", value="b", expected="7"),
            _op("get_versioned", "k", 6, 7, "b@9"),
            _op("compare_version_and_set", "k", 8, 9, "false", value="c", expected="7"),
        )
        == "ok"
    )
    assert (
        run(
            _op("put", "k", 0, 1, "", value="a"),
            _op("get_versioned", "k", 2, 3, "a@7"),
            _op("put", "k", 4, 5, "a", value="b"),
            _op("compare_version_and_set", "k", 6, 7, "true", value="c", expected="7"),
        )
        == "illegal"
    )  # the put moved the version
    assert (
        run(
            _op("put", "k", 0, 1, "", value="a"),
            _op("get_versioned", "k", 2, 3, "a@7"),
            _op("get_versioned", "k", 4, 5, "a@8"),
        )
        == "illegal"
    )  # a version moved without a write
    long = "x" * 59
    assert (
        run(
            _op("compute_append", "k", 0, 1, "a", value="a"),
            _op("compute_append", "k", 2, 3, "a+b", value="b"),
            _op("put", "k", 4, 5, "a+b", value=long),
            _op("compute_append", "k", 6, 7, "x" * 58 + "+c", value="c"),  # its last 60
        )
        == "ok"
    )
    assert (
        run(
            _op("compute_append", "k", 0, 1, "a", value="a"),
            _op("compute_append", "k", 2, 3, "b", value="b"),
        )
        == "illegal"
    )


def test_a_call_of_unknown_outcome_may_land_late_or_never(lincheck: Path) -> None:
    lost = _op("put", "k", 0, None, value="a")  # its process died during the call
    assert _verdict(lincheck, lost, _op("get", "k", 20, 30, "")) == "ok"
    lost = _op("put", "k", 0, None, value="a")
    assert (
        _verdict(lincheck, lost, _op("get", "k", 20, 30, "a"), _op("get", "k", 40, 50, "a")) == "ok"
    )
    lost = _op("put", "k", 0, None, value="a")
    got = _op("get", "k", 20, 30, "a")
    assert _verdict(lincheck, lost, got, _op("get", "k", 40, 50, "")) == "illegal"  # it landed


# -- histories of the real map --------------------------------------------------------------
@pytest.fixture
def clients(target: str, tmp_path: Path) -> Iterator[Any]:
    """``clients(ops, map_options, victim, **more)`` runs the client processes to the
    end and returns the history they wrote (see :func:`_run`)."""
    procs: list[mp.process.BaseProcess] = []

    def run(ops: int, options: dict[str, Any], victim: bool = False, **more: Any) -> list[Op]:
        return _run(target, tmp_path, procs, ops, options, victim, **more)

    yield run
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(10)


def _run(
    target: str,
    tmp_path: Path,
    procs: list[mp.process.BaseProcess],
    ops: int,
    options: dict[str, Any],
    victim: bool,
    *,
    lmdb: bool = False,
    reopen: int = 0,
    shards: bool = False,
    create: dict[str, Any] | None = None,
    during: Callable[[str], None] | None = None,
    within: Callable[[int | None, Callable[[], Any]], Any] | None = None,
) -> list[Op]:
    """Create the map, start ``PROCESSES`` clients (and with ``victim`` one more that only
    writes, killed with SIGKILL part way), let them go at once and wait for them. ``options``
    go to every ``db.map``; ``lmdb``, ``reopen`` and ``shards`` as in :func:`workload.client`.
    Four keys, two in each of the map's two partitions: few, so that the clients meet on each
    of them all the time.
    ``create``: options the map is created with. ``during(map_name)`` runs once the clients are under way (a fault to inject).
    ``within(n, fn)`` runs ``fn`` where client ``n`` lives (``None``: where the map is
    created), e.g. in a simulated host (benchmarks/nemesis.py); by
    default here."""
    name = f"lin-{uuid.uuid4().hex[:8]}"
    connect = log_options(target)
    place = within or _here

    def setup() -> list[str]:
        with kafkakv.connect(target, **connect) as db:
            m = db.map(name, partitions=2, **(create or {}))
            # Two keys in each partition: a shard's calls meet on keys too, and put_all has two.
            by_partition: dict[int, list[str]] = {0: [], 1: []}
            for k in (f"k{n}" for n in range(100)):
                if len(by_partition[m.partition_of(k)]) < 2:
                    by_partition[m.partition_of(k)].append(k)
            m.close()
            return by_partition[0] + by_partition[1]

    keys: list[str] = place(None, setup)
    count = PROCESSES + int(victim)
    ready = ctx.RawArray("b", count)
    go = ctx.RawValue("b", 0)
    seed = random.randrange(1 << 30)
    outs = [tmp_path / f"history-{n}.jsonl" for n in range(count)]
    for n in range(count):
        proc = ctx.Process(
            target=workload.client,
            args=(target, connect, name, n, THREADS, ops, keys, str(outs[n]), seed),
            kwargs={
                "options": options,
                "store_dir": str(tmp_path / "stores") if lmdb else None,
                "reopen": reopen,
                "shards": shards,
                "writes_only": n == PROCESSES,
                "ready": ready,
                "go": go,
            },
            daemon=True,
        )
        place(n, proc.start)  # a spawned child lives where the thread that starts it is
        procs.append(proc)
    wait_for(lambda: all(ready) or any(p.exitcode is not None for p in procs), 120, "clients")
    assert all(ready), f"a client exited before it was ready (seed {seed})"
    go.value = 1
    if victim:
        victim_out = outs[PROCESSES]

        def lines() -> int:
            return len(victim_out.read_text().splitlines())

        wait_for(lambda: lines() >= ops // 2, 120, "the victim's first calls")
        os.kill(procs[PROCESSES].pid or 0, signal.SIGKILL)
    if during is not None:
        during(name)
    for survivor in procs[:PROCESSES]:
        survivor.join(300)
        assert survivor.exitcode == 0, f"client exited with {survivor.exitcode} (seed {seed})"
    return read_history(outs)


def _here(n: int | None, fn: Callable[[], Any]) -> Any:
    """``_run``'s default ``within``: every client in this process's own network."""
    return fn()


def _lines(tmp_path: Path) -> int:
    """How many lines the clients wrote to their histories so far (two per call)."""
    return sum(len(f.read_bytes().splitlines()) for f in tmp_path.glob("history-*.jsonl"))


def _checked(lincheck: Path, history: list[Op], tmp_path: Path) -> Verdict:
    drawn = tmp_path / "counterexample.html"
    verdict = check(lincheck, history, visualize=drawn)
    assert verdict.ok, f"{verdict.detail} (see {drawn})"
    return verdict


def _overlapping(history: list[Op]) -> int:
    """How many known calls overlap another call on their key: the check means little when
    the clients took turns."""
    by_key: dict[str, list[Op]] = {}
    for op in history:
        if op.known:
            by_key.setdefault(op.key, []).append(op)
    count = 0
    for ops in by_key.values():
        ops.sort(key=lambda o: o.call)
        reach = -1
        for n, op in enumerate(ops):
            assert op.ret is not None
            if op.call <= reach or (n + 1 < len(ops) and ops[n + 1].call <= op.ret):
                count += 1
            reach = max(reach, op.ret)
    return count


@shared_logs
@pytest.mark.parametrize("barriers", ["auto", "shared"])
def test_concurrent_clients_of_every_kind_write_a_linearizable_history(
    lincheck: Path, clients: Any, target: str, barriers: str, tmp_path: Path
) -> None:
    ops = 150 if target.startswith("kafka://") else 1000
    history = clients(ops, {"barriers": barriers})
    errors = [f"{op.kind} {op.key}: {op.error}" for op in history if not op.known]
    assert not errors, errors  # nothing failed: every call's outcome is known
    assert len(history) >= PROCESSES * THREADS * ops
    assert _overlapping(history) > len(history) // 4
    reads = [op for op in history if op.kind in ("get", "contains")]
    assert {op.output for op in reads} - {"", "true", "false"}, "no read ever saw a value"
    _checked(lincheck, history, tmp_path)


@shared_logs
def test_a_client_killed_mid_run_leaves_a_linearizable_history(
    lincheck: Path, clients: Any, target: str, tmp_path: Path
) -> None:
    """The victim's calls that were under way when it died may have landed or not; everyone
    else's must still agree with one order, and the survivors must not fail."""
    ops = 150 if target.startswith("kafka://") else 1000
    history = clients(ops, {}, victim=True)
    survivors = [op for op in history if op.client < PROCESSES * THREADS]
    assert all(op.known for op in survivors), [op.error for op in survivors if not op.known]
    victims = [op for op in history if op.client >= PROCESSES * THREADS]
    assert victims and len(victims) < THREADS * ops, "the victim was not killed part way"
    _checked(lincheck, history, tmp_path)


@shared_logs
def test_replicas_restarted_mid_run_on_persistent_stores_stay_linearizable(
    lincheck: Path, clients: Any, target: str, tmp_path: Path
) -> None:
    """Every replica keeps an LMDB store and is closed and opened again every 100 calls,
    while the others write: each restart resumes from what its store holds and what was
    flushed (every 20 updates of a partition), and its first reads must already be current."""
    ops = 200 if target.startswith("kafka://") else 600
    history = clients(ops, {"flush_period": 20}, lmdb=True, reopen=100)
    assert all(op.known for op in history), [op.error for op in history if not op.known]
    _checked(lincheck, history, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["kafka"], indirect=True)
@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_a_leader_killed_or_paused_mid_run_leaves_a_linearizable_history(
    lincheck: Path, clients: Any, kafka_faults: Cluster, fault: str, tmp_path: Path
) -> None:
    """The broker leading the ops topic's partition 0 is killed (kill -9), or paused
    (SIGSTOP) for longer than the brokers' session timeout and then let go on: a deposed
    leader that wakes up still believing it leads, as after a long GC pause. Calls wait for
    the new leader (or time out, an unknown outcome), and the history stays linearizable: no
    acknowledged update is lost, no read goes back in time."""
    hit: list[int] = []
    at: list[int] = []  # when the fault began
    ops_topic = ""

    def strike(name: str) -> None:
        nonlocal ops_topic
        ops_topic = f"{name}_ops"
        wait_for(lambda: _lines(tmp_path) >= 400, 120, "the clients' first 200 calls")
        leader = kafka_faults.leader(ops_topic, 0)
        kafka_faults.kill(leader, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        hit.append(leader)
        at.append(time.monotonic_ns())
        if fault == "pause":
            time.sleep(8.0)  # twice broker.session.timeout.ms: it is fenced meanwhile
            kafka_faults.kill(leader, signal.SIGCONT)

    try:
        history = clients(300, {}, during=strike)
    finally:
        for node in hit:
            if fault == "pause":
                kafka_faults.kill(node, signal.SIGCONT)
            elif not kafka_faults.is_running(node):
                kafka_faults.start_node(node)
        if ops_topic:
            kafka_faults.wait_in_sync(ops_topic, timeout=90)
    assert hit
    before = [op for op in history if op.call < at[0]]
    after = [op for op in history if op.known and op.call > at[0]]
    assert len(before) > 50 and len(after) > 50, "the clients did not run through the fault"
    unknown = [op for op in history if not op.known]
    assert len(unknown) <= PROCESSES * THREADS * 2, [op.error for op in unknown]
    _checked(lincheck, history, tmp_path)


@shared_logs
@pytest.mark.parametrize("store", ["sorted", "dict"])
def test_shards_and_whole_replicas_together_stay_linearizable(
    lincheck: Path, clients: Any, target: str, store: str, tmp_path: Path
) -> None:
    """The first process's replicas hold the whole map, the others' one of its two partitions
    each (a shard's reads take the end offset every time, where a whole replica may skip it);
    on the sorted store and the dict."""
    ops = 150 if target.startswith("kafka://") else 600
    history = clients(ops, {"store": store}, shards=True)
    assert all(op.known for op in history), [op.error for op in history if not op.known]
    _checked(lincheck, history, tmp_path)


@shared_logs
def test_versions_and_compares_by_version_stay_linearizable(
    lincheck: Path, clients: Any, target: str, tmp_path: Path
) -> None:
    """A map with versions: ``get_versioned`` shows the version of the value it returns, and
    ``compare_version_and_set`` (sync and in pipelines) sets exactly when the key still has
    the version the caller read."""
    ops = 150 if target.startswith("kafka://") else 600
    history = clients(ops, {}, create={"versions": True})
    assert all(op.known for op in history), [op.error for op in history if not op.known]
    by_kind = {op.kind: op for op in history}
    assert {"get_versioned", "compare_version_and_set"} <= by_kind.keys()
    assert any(
        op.kind == "compare_version_and_set" and op.output == "true" and op.expected
        for op in history
    ), "no compare by version ever matched a version"
    _checked(lincheck, history, tmp_path)
