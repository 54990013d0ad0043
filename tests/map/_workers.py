"""Child-process bodies for test_map_multiprocess.py (spawned, so they live at module level).

Importing this module registers the compute/merge functions the children use, in the parent
too, so that the parent can replay the ops topic with the same functions.

Coordination with the parent goes through lock-free shared memory (``RawValue``/``RawArray``)
while children may be killed with SIGKILL: a process killed while holding the lock of a
``Queue`` or an ``Event`` would hang everybody else. The report queue is used only once no
more kills can happen.
"""

from __future__ import annotations

import json
import random
import time
import traceback
from collections.abc import Callable
from typing import Any

import kafkakv
from kafkakv import functions
from kafkakv.errors import FunctionError
from tests.waiting import wait_for

#: Phases of the random-ops test (a shared int the parent moves forward).
RUN, STOP, REPORT = 0, 1, 2
#: Phases of the counter and Fibonacci tests: wait for the start, go, writers stop (and
#: counters report), observers report.
WAIT, GO, FINISH, REPORT_ALL = 0, 1, 2, 3


# -- registered functions (the same code in every process) ----------------------------------
@functions.register("mp-add")
def add(key: Any, old: Any, n: int, tag: int) -> int | None:
    """``old + n``; raises for ``n == 0`` (a deterministic failure); removes the key when the
    sum is a multiple of 5. ``tag`` only makes the op recognisable in the log."""
    if n == 0:
        raise ValueError("n == 0")
    new = (old or 0) + n
    return None if new % 5 == 0 else new


@functions.register("mp-merge")
def merge(old: int, value: int) -> int | None:
    """``old + value``, or removes the key when the sum is a multiple of 3."""
    new = old + value
    return None if new % 3 == 0 else new


@functions.register("mp-incr")
def incr(key: Any, old: Any) -> int:
    return (old or 0) + 1


# -- helpers --------------------------------------------------------------------------------
def wait_phase(phase: Any, at_least: int, timeout: float = 120.0) -> None:
    wait_for(
        lambda: phase.value >= at_least,
        timeout,
        f"the parent to move to phase {at_least}",
        interval=0.005,
    )


def _guard(reports: Any, who: Any, body: Callable[[], None]) -> None:
    try:
        body()
    except BaseException:
        reports.put(("crash", who, traceback.format_exc()))
        raise


# -- 1. random operations, killed at random -------------------------------------------------
def random_ops(
    target: str,
    name: str,
    options: dict[str, Any],
    slot: int,
    incarnation: int,
    seed: int,
    hot: int,
    keys: int,
    phase: Any,
    ready: Any,
    results_path: str,
    reports: Any,
) -> None:
    """Random updates on ``keys`` keys (mostly on the first ``hot``) until the parent stops.

    Every value written (and every compute tag) is unique over the whole test: the
    incarnation times a million plus a counter. For each update whose record can be told
    apart in the log, one JSON line ``[op code name, unique value, result]`` goes to
    ``results_path`` as soon as the call returns (a kill loses at most the last, partial one).
    """

    def body() -> None:
        rng = random.Random(seed)
        counter = iter(range(incarnation * 1_000_000, (incarnation + 1) * 1_000_000))
        problems: list[str] = []
        ops = 0
        with kafkakv.connect(target) as db, open(results_path, "w", buffering=1) as out:
            m = db.map(name, **options)
            ready[slot] = incarnation

            def pick_key() -> str:
                # Hot keys for contention, cold ones that flushes must not forget.
                return f"k{rng.randrange(hot if rng.random() < 0.6 else keys)}"

            def note(code: str, ident: int, result: Any) -> None:
                out.write(json.dumps([code, ident, result]) + "\n")

            while phase.value == RUN:
                key = pick_key()
                choice = rng.random()
                ops += 1
                try:
                    if choice < 0.15:
                        v = next(counter)
                        note("PUT", v, m.put(key, v))
                    elif choice < 0.25:
                        v = next(counter)
                        note("PUT_IF_ABSENT", v, m.put_if_absent(key, v))
                    elif choice < 0.35:
                        v = next(counter)
                        note("REPLACE", v, m.replace(key, v))
                    elif choice < 0.55:
                        expected = m.get(key) if rng.random() < 0.9 else rng.randrange(10)
                        v = next(counter)
                        note("COMPARE_AND_SET", v, m.compare_and_set(key, expected, v))
                    elif choice < 0.62:
                        m.remove(key)
                    elif choice < 0.70:
                        expected = m.get(key)
                        m.remove_if(key, expected if expected is not None else 1)
                    elif choice < 0.85:
                        tag = next(counter)
                        n = rng.choice([0, 1, 2, 3, 7])
                        try:
                            result = m.compute(key, "mp-add", n, tag)
                        except FunctionError:
                            result = "error"
                        note("COMPUTE", tag, result)
                    elif choice < 0.95:
                        v = next(counter)
                        note("MERGE", v, m.merge(key, v, "mp-merge"))
                    else:  # a burst of async puts, all awaited
                        batch = [(next(counter), pick_key()) for _ in range(5)]
                        futures = [(v, m.put_async(k, v)) for v, k in batch]
                        for v, future in futures:
                            note("PUT", v, future.result(timeout=60))
                except Exception:
                    problems.append(traceback.format_exc())
                    if len(problems) > 5:
                        break
            reports.put(("stopped", slot, incarnation))
            wait_phase(phase, REPORT)
            m.sync()
            reports.put(("final", slot, incarnation, dict(m.items()), m.check(), problems, ops))

    _guard(reports, slot, body)


# -- 2. exact counters ----------------------------------------------------------------------
def count(
    target: str, name: str, worker: int, method: str, n: int, phase: Any, reports: Any
) -> None:
    """Increment key ``"counter"`` ``n`` times, by CAS retry loop or by compute."""

    def body() -> None:
        with kafkakv.connect(target) as db:
            m = db.map(name, partitions=2)
            reports.put(("ready", worker))
            wait_phase(phase, GO)
            results, retries = [], 0
            for _ in range(n):
                if method == "cas":
                    while True:
                        old = m.get("counter")
                        new = (old or 0) + 1
                        if m.compare_and_set("counter", old, new):
                            results.append(new)
                            break
                        retries += 1
                        m.sync()
                else:
                    results.append(m.compute("counter", "mp-incr"))
            reports.put(("done", worker, results, retries))
            wait_phase(phase, FINISH)
            m.sync()
            reports.put(("final", worker, m.get("counter"), m.check()))

    _guard(reports, worker, body)


# -- 3. the Fibonacci invariant -------------------------------------------------------------
FIB_KEYS = ("f0", "f1", "f2")


class Fibonacci:
    """F(0)=0, F(1)=1, ... grown on demand; ``index`` of a value (1 gives 2: F(2))."""

    def __init__(self) -> None:
        self.numbers = [0, 1, 1]
        self._index = {0: 0, 1: 2}

    def _grow_to(self, value: int) -> None:
        while self.numbers[-1] < value:
            self.numbers.append(self.numbers[-1] + self.numbers[-2])
            self._index[self.numbers[-1]] = len(self.numbers) - 1

    def __getitem__(self, i: int) -> int:
        while len(self.numbers) <= i:
            self._grow_to(self.numbers[-1] + 1)
        return self.numbers[i]

    def index(self, value: int) -> int | None:
        self._grow_to(value)
        return self._index.get(value)

    def consecutive(self, triple: list[int]) -> bool:
        """Whether ``triple``, sorted, is F(i), F(i+1), F(i+2) for some i >= 1."""
        a, b, c = sorted(triple)
        i = self.index(b)
        return i is not None and i >= 2 and a == self[i - 1] and c == self[i + 1]


def advance(target: str, name: str, worker: int, phase: Any, progress: Any, reports: Any) -> None:
    """Advance the triple with one CAS at a time until the parent stops the run, counting
    this worker's advances in ``progress`` as they land."""

    def body() -> None:
        with kafkakv.connect(target) as db:
            m = db.map(name, value_codec="str")
            reports.put(("ready", worker))
            wait_phase(phase, GO)
            advances = failures = 0
            while phase.value == GO:
                view = [int(m[k]) for k in FIB_KEYS]
                i = view.index(min(view))  # the lowest key on a tie
                new = sum(view) - view[i]
                if m.compare_and_set(FIB_KEYS[i], str(view[i]), str(new)):
                    advances += 1
                    progress.value = advances
                else:
                    failures += 1
                    m.sync()
            reports.put(("done", worker, advances, failures))

    _guard(reports, worker, body)


def observe(target: str, name: str, worker: int, phase: Any, reports: Any) -> None:
    """Check the triple from listener events (strictly) and from local reads (each value a
    Fibonacci number, never going down) until the parent stops the run."""

    def body() -> None:
        fib, fib_reads = Fibonacci(), Fibonacci()  # one per thread: they grow as they go
        violations: list[str] = []
        copy: dict[str, int] = {}
        events = 0

        def listener(key: Any, old: Any, new: Any, mine: bool) -> None:
            nonlocal events
            events += 1
            before = copy.get(key)
            if (None if old is None else int(old)) != before:
                violations.append(f"event {key}: {old} -> {new}, but the copy had {before}")
            copy[key] = int(new)
            if len(copy) == 3 and not fib.consecutive(list(copy.values())):
                violations.append(f"after event {key}: {old} -> {new}: {copy}")

        with kafkakv.connect(target) as db:
            m = db.map(name, value_codec="str")
            m.add_listener(listener)
            reports.put(("ready", worker))
            wait_phase(phase, GO)
            last = dict.fromkeys(FIB_KEYS, 0)
            polls = 0
            while phase.value < REPORT_ALL:
                polls += 1
                for k in FIB_KEYS:
                    value = m.get(k)
                    if value is None:
                        continue
                    v = int(value)
                    if fib_reads.index(v) is None:
                        violations.append(f"read {k} = {v}: not a Fibonacci number")
                    if v < last[k]:
                        violations.append(f"read {k} = {v} after {last[k]}: went down")
                    last[k] = v
                time.sleep(0.0005)
            m.sync()
            state = {k: int(v) for k, v in m.items()}
            # sync() promises the state, not that the follower thread has returned from the
            # listener of the last update it applied (add_listener's contract): give it time
            # to catch up, without which the copy lagged one update behind once in a CI run.
            try:
                wait_for(lambda: dict(copy) == state, 10, "the listener copy to reach the state")
            except AssertionError:
                violations.append(f"listener copy {copy} != state {state} after sync")
            reports.put(("final", worker, violations[:20], events, state, polls))

    _guard(reports, worker, body)


# -- flusher killed mid-flush -----------------------------------------------------------------
def flusher(target: str, name: str, seed: int) -> None:
    """Increment counters and flush after every 5 updates, until killed (the parent's SIGKILL
    lands at random moments, often inside a flush)."""
    rnd = random.Random(seed)
    with kafkakv.connect(target) as db:
        m = db.map(name, flush_period=10**9)
        i = 0
        while True:
            # Increments are not idempotent: a flush whose flush point lagged its data, or a
            # replica replaying ops a flush already covered, would count some twice.
            m.compute(f"k{rnd.randrange(50)}", "mp-incr")
            if rnd.random() < 0.1:
                m.remove(f"k{rnd.randrange(50)}")
            i += 1
            if i % 5 == 0:
                m.flush()
