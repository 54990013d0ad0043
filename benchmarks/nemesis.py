"""A long run of kafkakv on Kafka under random network faults, checked the way Jepsen checks
databases: are the histories linearizable, is an acknowledged update ever lost, do the
replicas converge once the faults stop?

Command (from the project root, as root: it makes network namespaces)::

    .venv/bin/python benchmarks/nemesis.py --minutes 10 [--seed N] [--timeout 5]

Hosts (:mod:`kafkakv.dev.hosts`): brokers b1, b2, b3 (a 3-node KRaft cluster, each node broker
and controller), clients c1, c2, c3, and ctl (the script's own admin calls and the fresh
replica at the end). All are removed when the script ends, on Ctrl-C too.

Work, until the time is up, in rounds: each round creates two new maps (two kinds out of:
whole replicas in memory; LMDB stores with a flush every 20 updates; shards, where the
replicas of every process but the first hold one of the two partitions) and runs the
linearizability workload of the tests (``tests/lincheck/workload.py``: 3 processes of 2
threads, one replica each, on four shared keys) with its processes spread over c1, c2, c3;
every round's client 2 runs with its wall clock 30 s ahead (``kafkakv.dev.clock``). Beside
them, for the whole run, a *witness* in each client host (the one in c3 on an LMDB store)
puts keys of its own into one more map and notes which puts were acknowledged.

Faults, drawn at random by a nemesis thread (seeded: ``--seed`` replays the draw, not the
timing), one at a time, each held for 4 to 10 s after a quiet 3 to 8 s: the leader of the
witness map's ops partition isolated; the active controller isolated; a client host
isolated; a split of {a broker, a client host} against the rest; a one-way cut from a client
host to the leader; the leader killed with SIGKILL and restarted; the leader paused (SIGSTOP,
then SIGCONT); a client process paused.

It prints one markdown table: faults injected, operations, how many ended unknown (raised),
the longest call against the timeout, how long the replicas took to converge after the last
write, and the verdicts: every round's history linearizable (porcupine), nothing lost (every
acknowledged witness put in every witness's replica and in a fresh one), converged (every
witness's replica equals the fresh one within 10 s).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the workload and the checker live with the tests

from _common import machine, terminate_as_interrupt  # noqa: E402
from tests.lincheck import Op, build, check  # noqa: E402
from tests.lincheck.witness import Witness, fresh_state  # noqa: E402
from tests.map.test_linearizability import _run  # noqa: E402

from kafkakv.dev import DevCluster  # noqa: E402
from kafkakv.dev.clock import skewed_env  # noqa: E402
from kafkakv.dev.hosts import Hosts  # noqa: E402

BROKERS = ("b1", "b2", "b3")
CLIENTS = ("c1", "c2", "c3")
BASE_PORT = 17092
CONVERGE_S = 10.0
SKEW_S = 30.0
KINDS: dict[str, dict[str, Any]] = {
    "memory": {},
    "lmdb": {"lmdb": True, "options": {"flush_period": 20}},
    "shards": {"shards": True},
}
FAULTS = (
    "isolate-leader",
    "isolate-controller",
    "isolate-client",
    "split-broker-client",
    "cut-client-leader",
    "kill-leader",
    "pause-leader",
    "pause-client",
)

_environ_lock = threading.Lock()  # os.environ is what a spawned child inherits


def active_controller(cluster: DevCluster) -> int:
    """The node that leads the KRaft quorum, as the nodes' ``quorum-state`` files say (the
    highest epoch wins)."""
    best = (-1, cluster.node_ids[0])
    for path in cluster.state_dir.rglob("quorum-state"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            data = json.loads(path.read_text())
            data = data.get("data", data)
            best = max(best, (int(data["leaderEpoch"]), int(data["leaderId"])))
    return best[1]


class Nemesis:
    """Draws faults and holds each for a while, one at a time, until stopped."""

    def __init__(self, hosts: Hosts, cluster: DevCluster, topic: str, rng: random.Random) -> None:
        self.hosts, self.cluster, self.topic, self.rng = hosts, cluster, topic, rng
        self.injected: collections.Counter[str] = collections.Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.paused: list[tuple[int, int]] = []  # client pauses (monotonic ns): no timeout holds
        self.windows: list[tuple[str, int, int]] = []  # each fault, struck and healed (ns)

    def _loop(self) -> None:
        while not self.stop.wait(self.rng.uniform(3, 8)):
            fault = self.rng.choice(FAULTS)
            hold = self.rng.uniform(4, 10)
            try:
                end = self._strike(fault)
            except Exception as exc:
                print(f"  {fault} could not strike: {exc}", flush=True)
                continue
            self.injected[fault] += 1
            struck = time.monotonic_ns()
            print(f"  {fault} for {hold:.1f} s", flush=True)
            self.stop.wait(hold)
            try:
                end()
            except Exception as exc:
                print(f"  healing {fault} failed: {exc}", flush=True)
            self.windows.append((fault, struck, time.monotonic_ns()))
            with contextlib.suppress(Exception):
                self.cluster.wait_in_sync(self.topic, timeout=60)

    def restart(self, node: int) -> None:
        """Start broker ``node`` again, trying up to three times; each failure is told and
        counted (``restart failed``)."""
        for _ in range(3):
            try:
                with _environ_lock:
                    self.cluster.start_node(node)
                return
            except Exception as exc:
                self.injected["restart failed"] += 1
                print(f"  restart of node {node} failed: {str(exc).splitlines()[0]}", flush=True)
        raise RuntimeError(f"node {node} did not start again in three tries")

    def _strike(self, fault: str) -> Callable[[], None]:
        cluster, hosts, rng = self.cluster, self.hosts, self.rng
        leader = cluster.leader(self.topic, 0)
        if fault == "isolate-leader":
            return hosts.isolate(f"b{leader}").heal
        if fault == "isolate-controller":
            return hosts.isolate(f"b{active_controller(cluster)}").heal
        if fault == "isolate-client":
            return hosts.isolate(rng.choice(CLIENTS)).heal
        if fault == "split-broker-client":
            side = {rng.choice(BROKERS), rng.choice(CLIENTS)}
            rest = set(BROKERS + CLIENTS + ("ctl",)) - side
            return hosts.split(side, rest).heal
        if fault == "cut-client-leader":
            return hosts.cut(rng.choice(CLIENTS), f"b{leader}").heal
        if fault == "kill-leader":
            cluster.kill(leader, signal.SIGKILL)

            return lambda: self.restart(leader)
        if fault == "pause-leader":
            cluster.kill(leader, signal.SIGSTOP)
            return lambda: cluster.kill(leader, signal.SIGCONT)
        if fault == "pause-client":
            pids = [p for c in CLIENTS for p in hosts.pids(c)]
            if not pids:
                raise RuntimeError("no client process runs")
            pause = hosts.pause(rng.choice(pids))
            began = time.monotonic_ns()

            def resume() -> None:
                pause.heal()
                self.paused.append((began, time.monotonic_ns()))

            return resume
        raise ValueError(fault)


@contextlib.contextmanager
def skewed(skew: float) -> Iterator[None]:
    """This process's environment, while the block runs, that of a child whose wall clock is
    ``skew`` seconds off."""
    env = skewed_env(skew) if skew else dict(os.environ)
    with _environ_lock:
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=5.0, help="every map's timeout (s)")
    parser.add_argument("--ops", type=int, default=100, help="calls per client thread a round")
    args = parser.parse_args()
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    rng = random.Random(seed)
    print(f"seed {seed}; {machine()}", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="kafkakv-nemesis-"))
    with terminate_as_interrupt():
        ok = run(scratch, rng, args.minutes * 60, args.timeout, args.ops)
    if ok:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"kept for a look: {scratch} (the brokers' logs, the histories)")


def run(scratch: Path, rng: random.Random, seconds: float, timeout: float, ops: int) -> bool:
    """The whole run; True when every verdict is yes and nothing failed."""
    program = build(scratch)
    skewed_env(SKEW_S)  # builds the clock shim once, before anything runs
    with Hosts([*BROKERS, *CLIENTS, "ctl"], subnet="10.214.0.0/24") as hosts:
        placement = hosts.placement(list(BROKERS), clients="ctl")
        with DevCluster(3, BASE_PORT, scratch / "cluster", placement=placement) as cluster:
            url = "kafka://" + cluster.bootstrap
            name = f"nemesis-{uuid.uuid4().hex[:8]}"
            hosts.call("ctl", lambda: _create(url, name, timeout), timeout=120)
            witnesses = [
                Witness(hosts, c, url, name, timeout)
                if c != "c3"
                else Witness(
                    hosts, c, url, name, timeout, store="lmdb", store_path=str(scratch / "w")
                )
                for c in CLIENTS
            ]
            nemesis = Nemesis(hosts, cluster, f"{name}_ops", rng)
            nemesis.thread.start()
            rounds = _rounds(scratch, hosts, url, rng, seconds, timeout, ops)
            nemesis.stop.set()
            nemesis.thread.join(60)
            hosts.heal()
            for node in cluster.node_ids:
                with contextlib.suppress(Exception):
                    cluster.kill(node, signal.SIGCONT)
                if not cluster.is_running(node):
                    nemesis.restart(node)
            cluster.wait_in_sync(f"{name}_ops", timeout=120)
            for w in witnesses:
                w.finish()
            written = time.monotonic()
            fresh = fresh_state(hosts, url, name, timeout)
            lagging = {w.host for w in witnesses}
            while lagging and time.monotonic() - written <= CONVERGE_S:
                lagging -= {w.host for w in witnesses if w.host in lagging and w.state() == fresh}
                time.sleep(0.1)
            converge = time.monotonic() - written
            states = {w.host: w.state() for w in witnesses}
            acked = [k for w in witnesses for k in w.acked]
            lost = {
                where: [k for k in acked if k not in state]
                for where, state in [*states.items(), ("fresh", fresh)]
            }
            for w in witnesses:
                w.close()
    histories = [h for h in rounds if isinstance(h, list)]
    verdicts = [check(program, h, timeout=300) for h in histories]
    operations = sum(len(h) for h in histories) + len(acked) + sum(w.unknown for w in witnesses)
    unknown = sum(1 for h in histories for op in h if not op.known)
    unknown += sum(w.unknown for w in witnesses)

    def paused(op: Op) -> bool:  # a call of a process that a pause stopped for a while
        return any(op.call < end and (op.ret or end) > began for began, end in nemesis.paused)

    def pipelined(op: Op) -> bool:  # an async call of a pipeline ("proc.thread.i.n")
        return op.value.count(".") == 3 and op.kind not in ("put_blind", "remove_blind")

    calls = [op for h in histories for op in h if op.known and op.ret]
    longest = max([(op.ret or 0) - op.call for op in calls if not paused(op)] + [0]) / 1e9
    longest_sync = (
        max([(op.ret or 0) - op.call for op in calls if not paused(op) and not pipelined(op)]) / 1e9
    )
    longest = max([longest] + [w.longest for w in witnesses])
    longest_paused = max([(op.ret or 0) - op.call for op in calls if paused(op)] + [0]) / 1e9
    failed = [r for r in rounds if isinstance(r, str)]
    for line in failed:
        print(" ", line)
    sync = [op for op in calls if not paused(op) and not pipelined(op)]
    for op in sorted(sync, key=lambda op: op.call - (op.ret or 0))[:3]:
        during = [f for f, began, end in nemesis.windows if op.call < end and (op.ret or 0) > began]
        print(
            f"  a long sync call: {op.kind} {((op.ret or 0) - op.call) / 1e9:.1f} s, "
            f"during {', '.join(during) or 'no fault'}"
        )
    for v in verdicts:
        if not v.ok:
            print("  checker:", v.detail)
    faults = ", ".join(f"{k} {n}" for k, n in sorted(nemesis.injected.items()))
    print()
    print(
        "| faults injected | operations | unknown | longest call / timeout | converged after "
        "| linearizable | nothing lost | converged |"
    )
    print("| --- | ---: | ---: | --- | --- | --- | --- | --- |")
    print(
        f"| {sum(n for k, n in nemesis.injected.items() if k != 'restart failed')} ({faults}) | {operations:,} | {unknown:,} "
        f"| sync {longest_sync:.1f} s, any {longest:.1f} s / {timeout:.0f} s "
        f"({longest_paused:.1f} s in a paused client) "
        f"| {converge:.1f} s (bound {CONVERGE_S:.0f} s) "
        f"| {_yes(all(v.ok for v in verdicts))} ({len(verdicts)} histories"
        f"{f', {len(failed)} rounds lost' if failed else ''}) "
        f"| {_yes(not any(lost.values()))} ({len(acked):,} acknowledged puts) "
        f"| {_yes(not lagging)} |"
    )
    for where, keys in lost.items():
        if keys:
            print(f"  lost in {where}: {keys[:10]}")
    good = all(v.ok for v in verdicts) and not any(lost.values()) and not lagging
    return good and not failed and not nemesis.injected["restart failed"]


def _yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def _create(url: str, name: str, timeout: float) -> None:
    import kafkakv

    with kafkakv.connect(url) as db:
        db.map(name, partitions=2, timeout=timeout).close()


def _rounds(
    scratch: Path,
    hosts: Hosts,
    url: str,
    rng: random.Random,
    seconds: float,
    timeout: float,
    ops: int,
) -> list[list[Op] | str]:
    """Rounds of the workload on two new maps at a time until ``seconds`` passed: each
    round's history, or why it was lost (a client that could not start)."""
    done: list[list[Op] | str] = []
    deadline = time.monotonic() + seconds
    n = 0
    kinds = list(KINDS)
    while time.monotonic() < deadline:
        pair = [kinds[n % 3], kinds[(n + 1) % 3]]
        threads = [
            threading.Thread(
                target=_round, args=(scratch / f"r{n}-{k}", hosts, url, k, timeout, ops, done)
            )
            for k in pair
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        n += 1
        print(
            f"round {n} done ({', '.join(pair)}), {deadline - time.monotonic():.0f} s left",
            flush=True,
        )
    return done


def _round(
    path: Path,
    hosts: Hosts,
    url: str,
    kind: str,
    timeout: float,
    ops: int,
    done: list[list[Op] | str],
) -> None:
    path.mkdir(parents=True)
    settings = dict(KINDS[kind])
    options = {"timeout": timeout, **settings.pop("options", {})}

    def within(n: int | None, fn: Callable[[], Any]) -> Any:
        if n is None:
            return hosts.call("ctl", fn, timeout=120)
        with skewed(SKEW_S if n == 2 else 0.0):  # the environment the child inherits
            return hosts.call(CLIENTS[n % 3], fn, timeout=120)

    procs: list[Any] = []
    try:
        done.append(_run(url, path, procs, ops, options, False, within=within, **settings))
    except Exception as exc:
        done.append(f"round {path.name} lost: {type(exc).__name__}: {str(exc)[:200]}")
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)


if __name__ == "__main__":
    main()
