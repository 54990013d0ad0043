"""Histories of a linearizable map whose clients live on two hosts stay linearizable while one
network fault strikes the Kafka cluster on three other hosts, and nothing acknowledged is lost.

The clients are the processes of tests/map/test_linearizability.py (``workload.client``),
started in hosts c1 and c2 of ``hosts_cluster`` (``_run``'s ``within``). Beside them, one
*witness* per client host puts keys of its own (``w-<host>-<n>``) and notes which futures
resolved as applied. Once the clients are under way one fault strikes for :data:`FAULT_S`
seconds (parametrized: the ops leader isolated, a split of {that broker, c1} against the rest,
a one-way cut c1 -> leader, kill -9 of the leader and its restart), then heals. After the
clients are done:

- porcupine finds the history linearizable;
- every witness key whose put was acknowledged is in every witness's replica and in a fresh
  replica opened after the heal (in host ``ctl``);
- the clients called through the fault, and witnesses' puts succeed again after the heal;
- every witness's replica reaches the fresh replica's state, by following the log alone (no
  barrier), within :data:`CONVERGE_S` of the last write.

Short histories (:data:`OPS` calls per client thread): the module takes about two minutes,
most of it the cluster's start. Hosts that cannot be made FAIL it (``host_network``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkakv.dev import DevCluster
from kafkakv.dev.hosts import Fault, Hosts
from tests.kafka_cluster import broker_host
from tests.lincheck import Op
from tests.lincheck.witness import Witness, fresh_state
from tests.map.test_linearizability import (  # noqa: F401  (lincheck: a fixture)
    PROCESSES,
    THREADS,
    _checked,
    _lines,
    _run,
    lincheck,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

CLIENT_HOSTS = ("c1", "c2")
"""Where the client processes run: client ``n`` in ``CLIENT_HOSTS[n % 2]``."""
OPS = 120
"""Calls per client thread."""
TIMEOUT_S = 5.0
"""The timeout of every replica's map (the clients' and the witnesses')."""
FAULT_S = 8.0
"""How long the fault lasts: longer than the brokers' session timeout (the controller
fences an isolated broker and elects a new leader meanwhile)."""
CONVERGE_S = 10.0
"""Bound: once the last write is done, every replica that lived through the fault holds the
fresh replica's state within this many seconds, by following the log (measured: under 1 s)."""
MAX_UNKNOWN = PROCESSES * THREADS * 4
"""Bound: calls whose outcome stays unknown (they raised, as a timeout does) per run."""
FAULTS = ("isolate-leader", "split-leader-c1", "cut-c1-leader", "kill-leader")


def _strike(fault: str, cluster: DevCluster, hosts: Hosts, leader: int) -> Callable[[], None]:
    """Begin ``fault`` against broker ``leader``; return what ends it."""
    if fault == "kill-leader":
        cluster.kill(leader, signal.SIGKILL)
        return lambda: cluster.start_node(leader)
    made: Fault
    if fault == "isolate-leader":
        made = hosts.isolate(broker_host(leader))
    elif fault == "split-leader-c1":
        side = {broker_host(leader), "c1"}
        rest = {broker_host(n) for n in cluster.node_ids if n != leader} | {"c2", "ctl"}
        made = hosts.split(side, rest)
    elif fault == "cut-c1-leader":
        made = hosts.cut("c1", broker_host(leader))
    else:
        raise ValueError(fault)
    return made.heal


@pytest.fixture
def procs() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for proc in started:
        if proc.is_alive():
            proc.kill()
        proc.join(10)


@pytest.mark.parametrize("fault", FAULTS)
def test_clients_on_two_hosts_stay_linearizable_and_lose_nothing_through_a_fault(
    lincheck: Path,  # noqa: F811
    hosts_cluster: DevCluster,
    host_network: Hosts,
    procs: list[Any],
    fault: str,
    tmp_path: Path,
) -> None:
    url = "kafka://" + hosts_cluster.bootstrap
    witnesses: list[Witness] = []
    struck: dict[str, float] = {}
    name = ""

    def within(n: int | None, fn: Callable[[], Any]) -> Any:
        return host_network.call("ctl" if n is None else CLIENT_HOSTS[n % 2], fn, timeout=120)

    def during(map_name: str) -> None:
        nonlocal name
        name = map_name
        for host in CLIENT_HOSTS:
            witnesses.append(Witness(host_network, host, url, name, TIMEOUT_S))
        wait_for(lambda: _lines(tmp_path) >= 160, 120, "the clients' first 80 calls")
        leader = hosts_cluster.leader(f"{name}_ops", 0)
        end = _strike(fault, hosts_cluster, host_network, leader)
        struck["at"] = time.monotonic_ns()
        try:
            time.sleep(FAULT_S)
        finally:
            end()
            struck["healed"] = time.monotonic_ns()
        hosts_cluster.wait_in_sync(f"{name}_ops", timeout=90)
        struck["acked"] = sum(len(w.acked) for w in witnesses)

    try:
        history = _run(
            url, tmp_path, procs, OPS, {"timeout": TIMEOUT_S}, False, during=during, within=within
        )
        # Progress after the heal, waited for: the clients' workload may end first.
        healed = struck["acked"]
        wait_for(
            lambda: sum(len(w.acked) for w in witnesses) > healed,
            TIMEOUT_S + 20,
            "a witness put acknowledged after the heal",
        )
        for w in witnesses:
            w.finish()
        written = time.monotonic()
        fresh = fresh_state(host_network, url, name, TIMEOUT_S)
        lagging = {w.host: w for w in witnesses}
        while lagging and time.monotonic() - written <= CONVERGE_S:
            for host, w in list(lagging.items()):
                if w.state() == fresh:
                    del lagging[host]
            time.sleep(0.1)
        converged = time.monotonic() - written
        states = {w.host: w.state() for w in witnesses}
    finally:
        host_network.heal()
        for w in witnesses:
            w.stop.set()
        for w in witnesses:
            w.close()
    at = struck["at"]
    unknown = [op for op in history if not op.known]
    acked = [k for w in witnesses for k in w.acked]
    print(
        f"{fault}: {len(history)} calls, {len(unknown)} unknown; witnesses: {len(acked)} acked, "
        f"{sum(w.unknown for w in witnesses)} unknown; replicas converged "
        f"{converged:.2f} s after the last write"
    )
    before = [op for op in history if op.call < at]
    during_or_after = [op for op in history if op.known and op.call > at]
    assert len(before) > 50 and during_or_after, "the clients did not run through the fault"
    assert len(unknown) <= MAX_UNKNOWN, _errors(unknown)
    _checked(lincheck, history, tmp_path)
    assert not lagging, f"replicas not converged within {CONVERGE_S} s: {sorted(lagging)}"
    for where, state in [*states.items(), ("fresh", fresh)]:
        lost = [k for k in acked if k not in state]
        assert not lost, f"acknowledged puts missing in the replica of {where}: {lost[:10]}"


def _errors(ops: list[Op]) -> list[str]:
    return [f"{op.kind} {op.key}: {op.error}" for op in ops]
