"""A guided, self-checking tour of kafkakv's replicated maps, shared by several processes.

Every process below opens the same map on the same embedded log directory; the log is the only
thing they share. The tour shows:

1. a map ``accounts`` (3 partitions) opened by this process, then 4 worker processes moving
   money between accounts with ``compare_and_set`` retry loops and counting what they did with
   ``compute("incr", n)``, while a watcher process follows every change with a listener;
2. afterwards every replica (this one, a fresh one, each worker's, the watcher's) ``sync()``s
   and holds exactly the same contents: the total balance unchanged to the unit, the counters
   equal to the exact number of increments, the watcher's count of changes exact;
3. a replica with an on-disk store (``store="lmdb"``) killed with SIGKILL in the middle of its
   updates, then restarted: it resumes from the positions saved in its store, catches up with
   what it missed, equals the others after ``sync()``, and no acknowledged update is lost;
4. ``flush()`` and compaction of the data topic, then the bootstrap of a brand-new replica,
   timed, from the compacted snapshot plus the few ops after it;
5. a sorted map ``prices`` with range queries and floor/ceiling, answered identically in
   another process;
6. the command-line equivalents, one of which (``kafkakv map get``) runs for real.

Each claim is checked as it is shown. The demo prints "demo ok: ..." and exits 0 when all of
them hold, and exits 1 (keeping its directory for inspection) when any does not.

Run it from the project root::

    .venv/bin/python examples/map_demo.py              # in a fresh temporary directory
    .venv/bin/python examples/map_demo.py --keep       # ... and keep that directory
    .venv/bin/python examples/map_demo.py --dir /tmp/map-demo   # in an empty or new directory

The directory holds the log in ``log/`` (give it to the CLI as ``KAFKAKV_LOG``) and the on-disk
store of step 3 in ``stores/``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event
from typing import Any

import msgpack
from _tour import (
    DemoFailure,
    Inbox,
    Verdicts,
    console,
    kill_mid_stream,
    plural,
    report_child_error,
    run_tour,
    tour_main,
)
from rich.table import Table

import kafkakv
from kafkakv import LmdbStore, ReplicaMap, SortedReplicaMap, functions
from kafkakv.map import MapTopics
from kafkakv.map.keyspace import FLUSH_POINT_KEY

MAP = "accounts"
PARTITIONS = 3
FLUSH_PERIOD = 200  # ops of one partition between two automatic flushes
DATA_SEGMENT_BYTES = 1024  # small data-topic segments, so that compaction has sealed ones
MAP_TIMEOUT_S = 15.0  # the longest one map call may wait
CHILD_TIMEOUT_S = 25.0  # the longest the demo waits for a child process

ACCOUNTS = [f"acct-{i:02d}" for i in range(8)]  # few accounts: the workers do collide
OPENING_BALANCE = 1_000
TOTAL = OPENING_BALANCE * len(ACCOUNTS)
TRANSFERS = "transfers"  # counter key: one increment per transfer
CONFLICTS = "conflicts"  # counter key: incremented by the failed compare_and_set calls

WORKERS = 4
TRANSFERS_PER_WORKER = 400
KILL_AFTER_ACKS = 300  # acknowledged put_if_absent calls to wait for before the SIGKILL
MISSED_WHILE_DEAD = 40  # updates made by this process while the killed replica is down

PRICES = "prices"
PRICE_LIST = {
    "apple": 120,
    "apricot": 340,
    "banana": 90,
    "blackberry": 450,
    "blueberry": 400,
    "cherry": 600,
    "date": 800,
    "fig": 300,
    "grape": 250,
    "kiwi": 150,
    "lemon": 80,
    "mango": 220,
}


@functions.register("incr")
def incr(key: Any, old: Any, n: int) -> int:
    """``old + n``: registered when this module is imported, so in every process (the spawned
    children import it again). Only the name "incr" and ``n`` travel through the log."""
    return (old or 0) + n


# -- small helpers ------------------------------------------------------------------------


def open_db(log_path: str) -> kafkakv.Database:
    """The embedded log without its background cleaner: compaction happens when step 4 says."""
    return kafkakv.connect(log_path, background_cleaner=False)


def open_accounts(db: kafkakv.Database, **options: Any) -> ReplicaMap[str, Any]:
    return db.map(
        MAP, partitions=PARTITIONS, flush_period=FLUSH_PERIOD, timeout=MAP_TIMEOUT_S, **options
    )


def balance_total(state: dict[str, Any]) -> int:
    return sum(state.get(a, 0) for a in ACCOUNTS)


def differences(a: dict[str, Any], b: dict[str, Any], limit: int = 5) -> str:
    """A short description of how two map contents differ."""
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    shown = ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys[:limit])
    return f"{len(keys)} keys differ ({shown}{', …' if len(keys) > limit else ''})"


def wait_event(event: Event, what: str) -> None:
    if not event.wait(CHILD_TIMEOUT_S):
        raise DemoFailure(f"never told to {what}")


# -- child processes (module level so that the 'spawn' start method can find them) ----------


def transfer_one(m: ReplicaMap[str, Any], rng: random.Random) -> tuple[int, int]:
    """Move a random amount from one account to another with two compare_and_set retry loops;
    return (amount moved, failed compare_and_set calls). Moves nothing from an empty account."""
    source, target = rng.sample(ACCOUNTS, 2)
    wanted = rng.randint(1, 50)
    conflicts = 0
    for key, sign in ((source, -1), (target, +1)):
        for _ in range(1000):
            balance = m[key]  # a local read: this replica as it is now
            if sign < 0:
                wanted = min(wanted, balance)
                if wanted == 0:
                    return 0, conflicts
            # Decided in log order on every replica: True only if nobody changed it meanwhile.
            if m.compare_and_set(key, balance, balance + sign * wanted):
                break
            # Another process got there first. The failed call applied the log up to its own
            # record, so the next local read already sees the value that beat us.
            conflicts += 1
        else:
            raise DemoFailure(f"1000 compare_and_set calls on {key} failed in a row")
    return wanted, conflicts


def worker_main(
    log_path: str, worker_id: int, count: int, events: Any, go: Event, finish: Event
) -> None:
    """Do ``count`` transfers, count them with compute("incr"), then report the final state."""
    who = f"worker {worker_id}"
    try:
        rng = random.Random(worker_id)
        with open_db(log_path) as db:
            m = open_accounts(db)
            events.put(("ready", who))
            wait_event(go, "start")
            started = time.monotonic()
            moved = conflicts = computes = 0
            pending = []
            done = 0
            while done < count:
                amount, failed = transfer_one(m, rng)
                if amount == 0:
                    continue
                done += 1
                moved += amount
                conflicts += failed
                m.compute(TRANSFERS, "incr", 1)  # waits until applied here
                computes += 1
                if failed:  # sent without waiting; awaited below
                    pending.append(m.compute_async(CONFLICTS, "incr", failed))
                    computes += 1
            for future in pending:
                future.result(timeout=MAP_TIMEOUT_S)
            events.put(
                ("done", worker_id, done, moved, conflicts, computes, time.monotonic() - started)
            )
            wait_event(finish, "finish")
            m.sync()
            events.put(("final", who, dict(m.items()), m.check(), len(m.errors())))
    except BaseException:
        report_child_error(events, who)


def watcher_main(log_path: str, events: Any, go: Event, finish: Event) -> None:
    """Follow every change with a listener; keep a mirror of the map built only from them."""
    who = "watcher"
    try:
        with open_db(log_path) as db:
            m = open_accounts(db)
            changes = 0
            mismatches: list[str] = []
            mirror: dict[str, Any] = {}

            def listener(key: str, old: Any, new: Any, mine: bool) -> None:
                nonlocal changes
                changes += 1
                if mirror.get(key) != old:
                    mismatches.append(f"{key}: {old!r} -> {new!r}, mirror had {mirror.get(key)!r}")
                if new is None:
                    mirror.pop(key, None)
                else:
                    mirror[key] = new

            m.add_listener(listener)
            mirror.update(m.items())  # nothing changes before "go"
            events.put(("ready", who))
            wait_event(go, "start")
            wait_event(finish, "finish")
            m.sync()
            state = dict(m.items())
            # sync() returns once the store holds every update before its barrier; listeners
            # run just after each store write, so the last ones may still be finishing.
            settle = time.monotonic() + 5.0
            while mirror != state and time.monotonic() < settle:
                time.sleep(0.01)
            events.put(("watched", changes, mismatches[:5], mirror == state))
            events.put(("final", who, state, m.check(), len(m.errors())))
    except BaseException:
        report_child_error(events, who)


def ledger_key(i: int) -> str:
    return f"ledger-{i:05d}"


def victim_main(log_path: str, store_path: str, acks: Connection) -> None:
    """Open ``accounts`` with an LMDB store and add unique keys with put_if_absent as fast as
    it can, acknowledging each through ``acks``. Runs until it is killed."""
    with open_db(log_path) as db:
        m = open_accounts(db, store="lmdb", store_path=store_path)
        acks.send(("ready", len(m)))
        i = 0
        while True:
            key = ledger_key(i)
            # Returns once the update is in the log and applied to the store on disk.
            previous = m.put_if_absent(key, {"by": "victim", "n": i})
            acks.send(("ack" if previous is None else "clash", key))
            i += 1


def restart_main(
    log_path: str, store_path: str, acked: list[str], missed: list[str], events: Any
) -> None:
    """Reopen the killed replica's store and report what it holds before and after sync():
    which of the keys it acknowledged, and of those added while it was down, it lacks."""
    who = "restarted replica"
    try:
        with open_db(log_path) as db:
            started = time.monotonic()
            m = open_accounts(db, store="lmdb", store_path=store_path)
            opened_s = time.monotonic() - started
            lacks = ([k for k in acked if k not in m], [k for k in missed if k not in m])
            events.put(("opened", opened_s, len(m), *lacks))
            m.sync()
            events.put(("final", who, dict(m.items()), m.check(), len(m.errors())))
    except BaseException:
        report_child_error(events, who)


def price_queries(prices: SortedReplicaMap[str, int]) -> dict[str, Any]:
    """The questions step 5 asks of a sorted map, in any process."""
    return {
        "range('b', 'c')": list(prices.range("b", "c")),
        "range('kiwi', None)": list(prices.range("kiwi")),
        "3 largest keys": [k for k, _ in prices.range(reverse=True)][:3],
        "floor_key('coconut')": prices.floor_key("coconut"),
        "ceiling_key('coconut')": prices.ceiling_key("coconut"),
        "first_key() / last_key()": (prices.first_key(), prices.last_key()),
        "higher_key('mango')": prices.higher_key("mango"),
    }


def price_viewer_main(log_path: str, events: Any) -> None:
    who = "price viewer"
    try:
        with open_db(log_path) as db:
            prices = db.sorted_map(PRICES, timeout=MAP_TIMEOUT_S)
            prices.sync()
            events.put(("answers", price_queries(prices), dict(prices.items())))
    except BaseException:
        report_child_error(events, who)


# -- the parent's side of the child processes -------------------------------------------------


def join_all(processes: Iterable[SpawnProcess]) -> None:
    for p in processes:
        p.join(timeout=CHILD_TIMEOUT_S)


# -- step 1 -----------------------------------------------------------------------------------


def create_topics(db: kafkakv.Database) -> None:
    """Create the map's three topics as db.map() would, but with small data-topic segments.

    db.map() checks only the settings a map relies on (cleanup policies, retention) on topics
    that exist already, so the others may be tuned like this. Small segments let step 4's
    compaction work on sealed segments (the cleaner leaves the active one alone, as in Kafka).
    """
    topics = MapTopics.for_name(MAP)
    settings: dict[str, dict[str, object]] = {
        name: dict(config) for name, config in topics.settings().items()
    }
    settings[topics.data] = {**settings[topics.data], "segment.bytes": DATA_SEGMENT_BYTES}
    for name in (topics.data, topics.ops, topics.flush):
        db.log.create_topic(name, PARTITIONS, settings[name])


def step_concurrent(
    v: Verdicts, db: kafkakv.Database, log_path: str, children: list[SpawnProcess]
) -> tuple[ReplicaMap[str, Any], Inbox, Event, dict[str, int]]:
    console.rule("[bold]Step 1 · 4 worker processes and a watcher on one map")
    create_topics(db)
    m = open_accounts(db)
    m.update(dict.fromkeys(ACCOUNTS, OPENING_BALANCE))  # sent async, all awaited
    console.print(
        f"Opened map [bold]{MAP}[/] here ({PARTITIONS} partitions, flush every {FLUSH_PERIOD} "
        f"ops per partition) and put {len(ACCOUNTS)} accounts {ACCOUNTS[0]} … {ACCOUNTS[-1]} "
        f"with {OPENING_BALANCE:,} each: {TOTAL:,} in total. Every update is a record in the "
        f"ops topic {MAP}_ops that every replica applies in log order."
    )
    v.expect(
        len(m) == len(ACCOUNTS) and balance_total(dict(m.items())) == TOTAL,
        f"this replica holds the {len(ACCOUNTS)} accounts, {TOTAL:,} in total",
    )

    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    go, finish = ctx.Event(), ctx.Event()
    watcher = ctx.Process(target=watcher_main, args=(log_path, events, go, finish), name="watcher")
    workers = [
        ctx.Process(
            target=worker_main,
            args=(log_path, w, TRANSFERS_PER_WORKER, events, go, finish),
            name=f"worker-{w}",
        )
        for w in range(WORKERS)
    ]
    procs = [watcher, *workers]
    children.extend(procs)
    for proc in procs:
        proc.start()
    inbox = Inbox(events, procs, CHILD_TIMEOUT_S)
    inbox.take("ready", len(procs))
    console.print(
        f"{WORKERS} worker processes and a watcher process have each opened their own replica "
        f"of {MAP!r}. Each worker now makes {TRANSFERS_PER_WORKER} transfers between random "
        "accounts: read a balance, compare_and_set(account, balance, balance ∓ amount), retry "
        f"on conflict; then compute({TRANSFERS!r}, 'incr', 1), and "
        f"compute_async({CONFLICTS!r}, 'incr', n) for its n failed compare_and_sets. The "
        "watcher counts every change its listener sees. Progress, read from this process's "
        "replica (a local read, no I/O; money between a debit and its credit is in flight):"
    )
    started = time.monotonic()
    go.set()
    deadline = started + CHILD_TIMEOUT_S
    while inbox.count("done") < WORKERS:
        if time.monotonic() > deadline:
            raise DemoFailure("the workers did not finish in time")
        inbox.pump(0.5)
        state = dict(m.items())
        in_flight = TOTAL - balance_total(state)
        console.print(
            f"  {time.monotonic() - started:4.1f} s  {state.get(TRANSFERS, 0):5,} transfers  "
            f"{state.get(CONFLICTS, 0):4,} conflicts  total {balance_total(state):,}"
            + (f" ({in_flight:,} in flight)" if in_flight else "")
        )
    done = sorted(inbox.take("done", WORKERS), key=lambda d: d[1])
    table = Table(title="what each worker reported")
    for column in ("worker", "transfers", "amount moved", "failed CAS", "compute calls", "time"):
        table.add_column(column, justify="right")
    totals = {"transfers": 0, "conflicts": 0, "computes": 0}
    for _, worker_id, count, moved, conflicts, computes, seconds in done:
        table.add_row(
            str(worker_id),
            f"{count:,}",
            f"{moved:,}",
            f"{conflicts:,}",
            f"{computes:,}",
            f"{seconds:.2f} s",
        )
        totals["transfers"] += count
        totals["conflicts"] += conflicts
        totals["computes"] += computes
    console.print(table)
    v.expect(
        totals["transfers"] == WORKERS * TRANSFERS_PER_WORKER,
        f"the workers made {totals['transfers']:,} transfers, with "
        f"{plural(totals['conflicts'], 'failed compare_and_set')} retried",
    )
    return m, inbox, finish, totals


# -- step 2 -----------------------------------------------------------------------------------


def step_converge(
    v: Verdicts,
    db: kafkakv.Database,
    m: ReplicaMap[str, Any],
    inbox: Inbox,
    finish: Event,
    totals: dict[str, int],
) -> tuple[ReplicaMap[str, Any], dict[str, Any]]:
    console.rule("[bold]Step 2 · every replica, after sync()")
    finish.set()
    finals = sorted(inbox.take("final", WORKERS + 1), key=lambda f: f[1])
    _, changes, mismatches, mirror_ok = inbox.take("watched", 1)[0]
    join_all(inbox.processes)
    m.sync()
    fresh = open_accounts(db)
    fresh.sync()
    here = dict(m.items())
    console.print(
        "Each worker and the watcher called sync() (one barrier record per partition: "
        "afterwards a replica reflects every update completed anywhere before the call) and "
        "reported its contents; so did this process's replica, and a fresh replica opened "
        "here now."
    )
    rows: list[tuple[str, dict[str, Any], list[str], int]] = [
        ("this process", here, m.check(), len(m.errors())),
        ("fresh replica", dict(fresh.items()), fresh.check(), len(fresh.errors())),
    ]
    rows += [(who, state, problems, errors) for _, who, state, problems, errors in finals]
    table = Table(title=f"the replicas of {MAP!r}")
    for column in ("replica", "keys", "total balance", TRANSFERS, CONFLICTS, "same as here"):
        table.add_column(column, justify="right")
    for who, state, _, _ in rows:
        table.add_row(
            who,
            str(len(state)),
            f"{balance_total(state):,}",
            f"{state.get(TRANSFERS, 0):,}",
            f"{state.get(CONFLICTS, 0):,}",
            "yes" if state == here else "NO",
        )
    console.print(table)
    v.expect(
        all(proc.exitcode == 0 for proc in inbox.processes),
        f"all {len(inbox.processes)} child processes exited cleanly",
    )
    v.expect(
        all(balance_total(state) == TOTAL for _, state, _, _ in rows),
        f"in every replica the balances add up to exactly {TOTAL:,}: money was only moved",
    )
    v.expect(
        here.get(TRANSFERS) == totals["transfers"],
        f"the {TRANSFERS!r} counter is {here.get(TRANSFERS, 0):,}: exactly the number of "
        "compute('incr', 1) calls the workers made",
    )
    v.expect(
        here.get(CONFLICTS, 0) == totals["conflicts"],
        f"the {CONFLICTS!r} counter is {here.get(CONFLICTS, 0):,}: exactly the failed "
        "compare_and_sets the workers counted",
    )
    bad = [who for who, state, _, _ in rows if state != here]
    v.expect(
        not bad,
        f"all {len(rows)} replicas hold the same {len(here)} keys with the same values",
        f"replicas differ from this one: {bad}",
    )
    problems = [f"{who}: {p}" for who, _, ps, _ in rows for p in ps]
    errors = sum(e for _, _, _, e in rows)
    v.expect(
        not problems and not errors,
        "every replica's store passes its self-check, and no op failed to apply",
        f"store problems {problems[:5]}, {errors} ops failed to apply",
    )
    expected_changes = 2 * totals["transfers"] + totals["computes"]
    v.expect(
        changes == expected_changes and not mismatches and mirror_ok,
        f"the watcher's listener saw {changes:,} changes, exactly one per successful "
        f"compare_and_set and compute ({expected_changes:,}); each change's 'old' value "
        "matched what it had seen before, and the mirror it built from them equals its replica",
        f"the watcher saw {changes:,} changes (expected {expected_changes:,}), mirror equal: "
        f"{mirror_ok}, mismatches: {mismatches}",
    )
    return fresh, here


# -- step 3 -----------------------------------------------------------------------------------


def read_store(store_path: str) -> tuple[dict[int, Any], set[str], list[str]]:
    """The positions, keys and self-check problems of the LMDB store at ``store_path``."""
    with LmdbStore(store_path, sync=False) as store:
        return store.positions(), {k.decode() for k in store}, store.check()


def ops_ends(db: kafkakv.Database) -> dict[int, int]:
    ops = MapTopics.for_name(MAP).ops
    return {p: db.log.end_offset(ops, p) for p in range(PARTITIONS)}


def step_crash(
    v: Verdicts,
    db: kafkakv.Database,
    m: ReplicaMap[str, Any],
    fresh: ReplicaMap[str, Any],
    log_path: str,
    store_path: str,
    children: list[SpawnProcess],
) -> tuple[int, int]:
    console.rule("[bold]Step 3 · kill -9 a replica with an on-disk store, then restart it")
    ctx = mp.get_context("spawn")
    # A pipe of its own, not a shared queue: a process killed while holding a queue's lock
    # would block every other user of that queue.
    receiver, sender = ctx.Pipe(duplex=False)
    victim = ctx.Process(target=victim_main, args=(log_path, store_path, sender), name="victim")
    children.append(victim)
    victim.start()
    sender.close()  # the child holds the only write end: EOF once it is dead
    acked: list[str] = []
    clashes: list[str] = []

    def receive(timeout: float) -> bool:
        try:
            if not receiver.poll(timeout):
                return False
            message = receiver.recv()
        except (EOFError, OSError):
            return False
        if message[0] == "ack":
            acked.append(message[1])
        elif message[0] == "clash":
            clashes.append(message[1])
        return True

    if not receive(CHILD_TIMEOUT_S):
        raise DemoFailure("the replica with the LMDB store never opened")
    console.print(
        f"Started a replica process with store='lmdb' (its state and, in the same transaction, "
        f"the ops offset it reached, on disk in {store_path}). It adds unique keys "
        f"{ledger_key(0)}, {ledger_key(1)}, … with put_if_absent as fast as it can and "
        "acknowledges each through a pipe once the call returned."
    )
    kill_mid_stream(
        victim, receiver, receive, acked, KILL_AFTER_ACKS, CHILD_TIMEOUT_S, "the replica"
    )
    v.expect(victim.exitcode == -signal.SIGKILL, "the replica process really died of SIGKILL")
    console.print(
        f"Sent SIGKILL after {len(acked):,} acknowledged put_if_absent calls (the last "
        f"acknowledged: {acked[-1] if acked else '-'})."
    )

    positions, stored, problems = read_store(store_path)
    ends = ops_ends(db)
    table = Table(title="the killed replica's store, read from disk")
    for column in ("partition", "next op to apply", "last op flushed", f"end of {MAP}_ops"):
        table.add_column(column, justify="right")
    for p in range(PARTITIONS):
        pos = positions.get(p)
        table.add_row(
            str(p),
            f"{pos.applied:,}" if pos else "-",
            f"{pos.flushed:,}" if pos else "-",
            f"{ends[p]:,}",
        )
    console.print(table)
    v.expect(not problems, "its store passes its self-check", f"store check: {problems}")
    lost_in_store = [k for k in acked if k not in stored]
    v.expect(
        not lost_in_store and not clashes,
        f"its store on disk already holds all {len(acked):,} keys it acknowledged: a call "
        "returns only after the store wrote the change and its offset together",
        f"acknowledged keys not in the store: {lost_in_store[:5]}; clashes: {clashes[:5]}",
    )
    v.expect(
        len(positions) == PARTITIONS
        and all(0 < positions[p].applied <= ends[p] for p in positions),
        "it saved a position in every partition, none beyond the log's end",
    )

    m.sync()
    missed = {ledger_key(100_000 + i): {"by": "parent", "n": i} for i in range(MISSED_WHILE_DEAD)}
    m.update(missed)
    behind = {p: ops_ends(db)[p] - positions[p].applied for p in range(PARTITIONS)}
    console.print(
        f"While it was down, this process added {MISSED_WHILE_DEAD} keys with update(). The "
        f"killed replica is now {plural(sum(behind.values()), 'op')} behind "
        f"({', '.join(f'partition {p}: {n:,}' for p, n in behind.items())}). Restarting it "
        "on the same store:"
    )

    events = ctx.Queue()
    restart = ctx.Process(
        target=restart_main,
        args=(log_path, store_path, acked, list(missed), events),
        name="restart",
    )
    children.append(restart)
    restart.start()
    inbox = Inbox(events, [restart], CHILD_TIMEOUT_S)
    _, opened_s, size, missing, missing_missed = inbox.take("opened", 1)[0]
    _, _, state, store_problems, errors = inbox.take("final", 1)[0]
    restart.join(timeout=CHILD_TIMEOUT_S)
    m.sync()
    fresh.sync()
    here = dict(m.items())
    after, _, _ = read_store(store_path)
    ours = {k for k in here if k.startswith("ledger-") and here[k].get("by") == "victim"}
    extra = ours - set(acked)
    console.print(
        f"The restarted replica opened in {opened_s * 1000:.0f} ms holding {size:,} keys. "
        "A replica with a persistent store does not reload the data topic: it resumes at the "
        "positions saved with its data and applies only the ops after them (docs/maps-protocol.md, "
        "Bootstrap). After its sync() and close, its store's positions are "
        + ", ".join(f"{after[p].applied:,}" for p in range(PARTITIONS))
        + " (partitions 0, 1, 2)."
    )
    v.expect(
        not missing and not missing_missed,
        f"right after opening, before any sync(), it holds all {len(acked):,} keys it "
        f"acknowledged before the kill and the {MISSED_WHILE_DEAD} keys added while it was down",
        f"missing right after the restart: {len(missing)} acknowledged keys {missing[:5]}, "
        f"{len(missing_missed)} keys added meanwhile {missing_missed[:5]}",
    )
    v.expect(
        all(after[p].applied > positions[p].applied for p in range(PARTITIONS)),
        "its positions on disk moved on from where the kill left them",
    )
    v.expect(
        state == here and dict(fresh.items()) == here,
        f"after sync() it equals this process's replica and the fresh one ({len(here):,} keys)",
        f"after sync(): {differences(state, here)}",
    )
    v.expect(
        all(k in here for k in acked),
        f"no acknowledged update was lost: all {len(acked):,} keys are in every replica",
    )
    v.expect(
        extra == set() or (len(extra) == 1 and extra == {ledger_key(len(acked))}),
        f"beyond them the log holds {plural(len(extra), 'key')} ({', '.join(sorted(extra))}): "
        "its update was in the log when the kill came, before its acknowledgement left"
        if extra
        else "and nothing the replica did not acknowledge",
        f"unexpected keys from the killed replica: {sorted(extra)[:5]}",
    )
    v.expect(
        restart.exitcode == 0 and not store_problems and not errors,
        "the restarted replica's store passes its self-check and it closed cleanly",
    )
    v.expect(balance_total(here) == TOTAL, f"the balances still add up to {TOTAL:,}")
    return len(acked), len(extra)


# -- step 4 -----------------------------------------------------------------------------------


def read_topic(db: kafkakv.Database, topic: str, p: int) -> list[Any]:
    """Every record of one partition, from its start offset to its end."""
    records: list[Any] = []
    offset, end = db.log.start_offset(topic, p), db.log.end_offset(topic, p)
    while offset < end:
        batch = db.log.read(topic, p, offset, max_records=2000)
        if not batch:
            break
        records.extend(batch)
        offset = (batch[-1].offset or 0) + 1
    return records


def snapshot(records: list[Any]) -> tuple[dict[str, Any], int]:
    """The map a data-topic partition describes (latest value per key) and its flush point."""
    latest: dict[str, Any] = {}
    flushed = -1
    for r in records:
        if r.key == FLUSH_POINT_KEY:
            flushed = max(flushed, msgpack.unpackb(r.value)[0])
        elif r.value is None:
            latest.pop(r.key.decode(), None)
        else:
            latest[r.key.decode()] = json.loads(r.value)
    return latest, flushed


def step_compaction(
    v: Verdicts, db: kafkakv.Database, m: ReplicaMap[str, Any], fresh: ReplicaMap[str, Any]
) -> float:
    console.rule("[bold]Step 4 · flush, compaction, and a brand-new replica")
    topics = MapTopics.for_name(MAP)
    m.sync()
    m.flush()
    before = {p: read_topic(db, topics.data, p) for p in range(PARTITIONS)}
    started = time.monotonic()
    results = db.log.compact(topics.data)
    compact_s = time.monotonic() - started
    after = {p: read_topic(db, topics.data, p) for p in range(PARTITIONS)}
    here = dict(m.items())
    console.print(
        f"m.flush() wrote the latest value of every key changed since the last flush to the "
        f"data topic {topics.data!r}, with a flush point: the last ops offset it covers. "
        f"Automatic flushes (every {FLUSH_PERIOD} ops of a partition) had written earlier "
        f"values of the same keys, which compaction removes (in {compact_s * 1000:.0f} ms):"
    )
    table = Table(title=f"data topic {topics.data!r}")
    for column in ("partition", "records before → after", "keys", "flush point", "ops after it"):
        table.add_column(column, justify="right")
    ends = ops_ends(db)
    replay = updates = 0
    merged: dict[str, Any] = {}
    for p in range(PARTITIONS):
        latest, flushed = snapshot(after[p])
        merged.update(latest)
        replay += ends[p] - flushed - 1
        # Ops records without a key are barriers and flush marks; the others are updates.
        tail = [r for r in read_topic(db, topics.ops, p) if (r.offset or 0) > flushed]
        updates += sum(1 for r in tail if r.key is not None)
        table.add_row(
            str(p),
            f"{len(before[p]):,} → {len(after[p]):,}",
            f"{len(latest):,}",
            f"{flushed:,}",
            f"{ends[p] - flushed - 1:,} of {ends[p]:,}",
        )
    console.print(table)
    removed = sum(r.records_in - r.records_out for r in results)
    v.expect(
        removed > 0 and removed == sum(len(before[p]) - len(after[p]) for p in before),
        f"compaction removed {removed:,} superseded records",
    )
    v.expect(
        all(snapshot(before[p]) == snapshot(after[p]) for p in range(PARTITIONS)),
        "each partition describes the same map before and after compaction",
    )
    v.expect(
        merged == here,
        f"the compacted data topic alone holds the whole map: {len(here):,} keys, each with "
        "its current value",
        f"data topic vs replica: {differences(merged, here)}",
    )
    problems = db.log.check()
    v.expect(not problems, "the log's check() finds no problem", f"check(): {problems}")

    started = time.monotonic()
    newcomer = open_accounts(db)
    bootstrap_s = time.monotonic() - started
    total_ops = sum(ends.values())
    console.print(
        f"A brand-new replica opened in [bold]{bootstrap_s * 1000:.0f} ms[/]: it read "
        f"{sum(len(a) for a in after.values()):,} data records and then only the {replay:,} "
        f"ops after the flush points, not the {total_ops:,} ops in {topics.ops!r}."
    )
    v.expect(
        updates == 0,
        "none of those ops is an update (they are flush marks and barriers): the map came "
        "from the compacted data topic alone",
        f"{updates} updates follow the flush points",
    )
    v.expect(
        dict(newcomer.items()) == here,
        "before any sync() it already equals this process's replica",
        f"brand-new replica: {differences(dict(newcomer.items()), here)}",
    )
    newcomer.sync()
    fresh.sync()
    v.expect(
        dict(newcomer.items()) == here == dict(fresh.items()),
        "after sync() it equals the other replicas",
    )
    newcomer.close()
    return bootstrap_s


# -- step 5 -----------------------------------------------------------------------------------


def step_sorted(
    v: Verdicts, db: kafkakv.Database, log_path: str, children: list[SpawnProcess]
) -> None:
    console.rule("[bold]Step 5 · a sorted map, queried from two processes")
    prices = db.sorted_map(PRICES, partitions=2, timeout=MAP_TIMEOUT_S)
    prices.update(PRICE_LIST)
    console.print(
        f"db.sorted_map({PRICES!r}) keeps its replica in key order (str keys: by their UTF-8 "
        f"bytes) and answers range queries. It holds {len(PRICE_LIST)} prices in cents, put "
        "here; a second process opens it and asks the same questions."
    )
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    viewer = ctx.Process(target=price_viewer_main, args=(log_path, events), name="price-viewer")
    children.append(viewer)
    viewer.start()
    mine = price_queries(prices)
    _, theirs, their_items = Inbox(events, [viewer], CHILD_TIMEOUT_S).take("answers", 1)[0]
    viewer.join(timeout=CHILD_TIMEOUT_S)

    table = Table(title=f"{PRICES!r}: the same questions in two processes")
    table.add_column("query")
    table.add_column("this process")
    table.add_column("other process")
    for question, answer in mine.items():
        table.add_row(question, repr(answer), repr(theirs.get(question)))
    console.print(table)
    ordered = sorted(PRICE_LIST.items())
    expected = {
        "range('b', 'c')": [(k, p) for k, p in ordered if "b" <= k < "c"],
        "range('kiwi', None)": [(k, p) for k, p in ordered if k >= "kiwi"],
        "3 largest keys": [k for k, _ in reversed(ordered)][:3],
        "floor_key('coconut')": "cherry",
        "ceiling_key('coconut')": "date",
        "first_key() / last_key()": ("apple", "mango"),
        "higher_key('mango')": None,
    }
    # Tuples come back from the other process as lists (pickled as they were: compare as
    # JSON-like values to be independent of that detail).
    normal = json.loads(json.dumps(expected))
    v.expect(
        json.loads(json.dumps(mine)) == normal,
        "the answers here are what a sorted list of the prices gives",
        f"answers here differ: {mine}",
    )
    v.expect(
        json.loads(json.dumps(theirs)) == normal and their_items == PRICE_LIST,
        "the other process gives the same answers and holds the same prices",
        f"the other process answered {theirs}",
    )
    v.expect(viewer.exitcode == 0, "the other process exited cleanly")


# -- step 6 -----------------------------------------------------------------------------------


def kafkakv_command() -> list[str]:
    """How to run the CLI with this interpreter: the venv's script, else ``python -m``."""
    script = os.path.join(os.path.dirname(sys.executable), "kafkakv")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "kafkakv"]


def step_cli(v: Verdicts, m: ReplicaMap[str, Any], log_path: str, kept: bool) -> None:
    console.rule("[bold]Step 6 · the same from the command line")
    command = kafkakv_command()
    shown = os.path.relpath(command[0]) if len(command) == 1 else "python -m kafkakv"
    console.print("With the directory kept (--keep), try for instance:")
    prefix = f"KAFKAKV_LOG={log_path}"
    for line in (
        f"map dump {MAP}",
        f"map get {MAP} {TRANSFERS}",
        f"map dump {PRICES}",
        f"map watch {MAP} --timeout 60    # prints each change as it happens; meanwhile:",
        f"map put {MAP} {ACCOUNTS[0]} 5   # in another shell",
        f"log describe {MAP}_ops",
        "log check",
    ):
        console.print(f"  {prefix} {shown} {line}", soft_wrap=True)
    if not kept:
        console.print("(without --keep the directory is removed at the end)")

    key = ACCOUNTS[0]
    argv = [*command, "map", "get", MAP, key]
    env = {**os.environ, "KAFKAKV_LOG": log_path}
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
    seconds = time.monotonic() - started
    console.print(
        f"Ran [bold]{shown} map get {MAP} {key}[/] ({seconds:.1f} s, a new process: it opened "
        f"its own replica): exit code {result.returncode}, printed {result.stdout.strip()!r}"
    )
    m.sync()
    expected = json.dumps(m.get(key))
    v.expect(
        result.returncode == 0 and result.stdout.strip() == expected,
        f"it printed {key}'s balance as this process sees it ({expected})",
        f"kafkakv map get: exit {result.returncode}, stdout {result.stdout!r}, "
        f"stderr {result.stderr.strip()!r}; expected {expected}",
    )


# -- main -------------------------------------------------------------------------------------


def run(path: str, kept: bool) -> list[str]:
    """Run every step in ``path``; return the failures (empty when all hold)."""
    log_path = os.path.join(path, "log")
    store_path = os.path.join(path, "stores", "victim")

    def steps(v: Verdicts, children: list[SpawnProcess]) -> tuple[int, int, float]:
        with open_db(log_path) as db:
            m, inbox, finish, totals = step_concurrent(v, db, log_path, children)
            fresh, _ = step_converge(v, db, m, inbox, finish, totals)
            acked, extra = step_crash(v, db, m, fresh, log_path, store_path, children)
            bootstrap_s = step_compaction(v, db, m, fresh)
            step_sorted(v, db, log_path, children)
            step_cli(v, m, log_path, kept)
        return acked, extra, bootstrap_s

    def summary(result: tuple[int, int, float], seconds: float) -> str:
        acked, extra, bootstrap_s = result
        return (
            f"{WORKERS * TRANSFERS_PER_WORKER:,} transfers by "
            f"{WORKERS} processes kept the total at {TOTAL:,} and every counter exact in all "
            f"{WORKERS + 3} replicas; all {acked:,} acknowledged updates survived a SIGKILL "
            + (f"(plus {extra} in the log, unacknowledged) " if extra else "")
            + "and the restarted replica resumed from its store; a new replica bootstrapped "
            f"from the compacted topic in {bootstrap_s * 1000:.0f} ms; the sorted map and the CLI agreed; "
            f"{seconds:.1f} s"
        )

    return run_tour(steps, summary)


def main(argv: list[str] | None = None) -> int:
    return tour_main(
        argv,
        __doc__,
        run,
        what="directory",
        prefix="kafkakv-map-demo-",
        kept_note=lambda path: f" (the log is in {path}/log)",
    )


if __name__ == "__main__":
    sys.exit(main())
