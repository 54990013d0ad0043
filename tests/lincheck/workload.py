"""The client processes of the linearizability tests (spawned, so they live at module level).

Each process opens its own replica of one map with ``consistency="linearizable"`` and runs a
few threads of random operations on a handful of keys, so that calls of different processes
and threads overlap on the same keys all the time. Every call is written down as it starts and
again as it returns (:class:`Recorder`): one ``os.write`` of a line each, to a file opened for
appending, so that the history of a process killed with SIGKILL holds everything it finished
and every call it was in the middle of.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import kafkakv
from kafkakv import functions

#: How often each operation is drawn, out of the sum. Reads go through every read path of a
#: linearizable map (``[]``, ``get``, ``in``); writes through the sync path, the gathered async
#: one (``put_async``), the batch one (``put_all``, ``remove_all``), a registered function
#: (``compute``) and pipelines of async calls of every kind, several in flight at once.
READS = {"get": 12, "getitem": 8, "contains": 6}
WRITES = {
    "put": 12,
    "put_async": 8,
    "put_if_absent": 7,
    "replace": 6,
    "compare_and_set": 12,
    "remove": 5,
    "remove_if": 5,
    "compute": 5,
    "put_all": 5,
    "remove_all": 2,
    "pipeline": 4,
}


class Recorder:
    """Writes the history's lines of one process."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(self, event: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())

    def called(self, ident: str, client: int, kind: str, key: str, **args: str) -> None:
        self.line(
            {
                "id": ident,
                "client": client,
                "kind": kind,
                "key": key,
                "call": time.monotonic_ns(),
                **args,
            }
        )

    def returned(self, ident: str, output: str, at: int) -> None:
        self.line({"id": ident, "return": at, "output": output})

    def raised(self, ident: str, exc: BaseException) -> None:
        self.line({"id": ident, "error": f"{type(exc).__name__}: {exc}"})


def _text(value: Any) -> str:
    """A result as the model writes it: None is "", a bool "true"/"false"."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@functions.register("lin-append")
def append(key: Any, old: str | None, tag: str) -> str:
    """The compute of the tests: ``tag`` after the old value, kept to its last 60 characters
    (main.go's ``compute_append``)."""
    return tag if old is None else (old + "+" + tag)[-60:]


def _versioned(found: tuple[str, int] | None) -> str:
    """get_versioned's result as the model writes it: "value@version", "" for None."""
    return "" if found is None else f"{found[0]}@{found[1]}"


def _getitem(m: Any, key: str) -> Any:
    try:
        return m[key]
    except KeyError:
        return None


Call = Callable[[Any, str, str, str], Any]  # (map, key, value, expected) -> result

#: Each kind the workload draws: the model's kind (main.go) and the call. ``expected`` is ""
#: for absent (compare_and_set's None).
SYNC: dict[str, tuple[str, Call]] = {
    "get": ("get", lambda m, k, v, x: m.get(k)),
    "getitem": ("get", lambda m, k, v, x: _getitem(m, k)),
    "contains": ("contains", lambda m, k, v, x: k in m),
    "put": ("put", lambda m, k, v, x: m.put(k, v)),
    "put_async": ("put", lambda m, k, v, x: m.put_async(k, v).result(60)),
    "put_if_absent": ("put_if_absent", lambda m, k, v, x: m.put_if_absent(k, v)),
    "replace": ("replace", lambda m, k, v, x: m.replace(k, v)),
    "compare_and_set": ("compare_and_set", lambda m, k, v, x: m.compare_and_set(k, x or None, v)),
    "remove": ("remove", lambda m, k, v, x: m.remove(k)),
    "remove_if": ("remove_if", lambda m, k, v, x: m.remove_if(k, x)),
    "compute": ("compute_append", lambda m, k, v, x: m.compute(k, "lin-append", v)),
    "get_versioned": ("get_versioned", lambda m, k, v, x: _versioned(m.get_versioned(k))),
    "compare_version_and_set": (
        "compare_version_and_set",
        lambda m, k, v, x: m.compare_version_and_set(k, int(x) if x else None, v),
    ),
}
#: The async calls a pipeline issues back to back before it waits for any (futures).
ASYNC: dict[str, tuple[str, Call]] = {
    "put": ("put", lambda m, k, v, x: m.put_async(k, v)),
    "put_if_absent": ("put_if_absent", lambda m, k, v, x: m.put_if_absent_async(k, v)),
    "replace": ("replace", lambda m, k, v, x: m.replace_async(k, v)),
    "compare_and_set": (
        "compare_and_set",
        lambda m, k, v, x: m.compare_and_set_async(k, x or None, v),
    ),
    "remove": ("remove", lambda m, k, v, x: m.remove_async(k)),
    "remove_if": ("remove_if", lambda m, k, v, x: m.remove_if_async(k, x)),
    "compute": ("compute_append", lambda m, k, v, x: m.compute_async(k, "lin-append", v)),
    "compare_version_and_set": (
        "compare_version_and_set",
        lambda m, k, v, x: m.compare_version_and_set_async(k, int(x) if x else None, v),
    ),
}
#: What a map with versions adds to READS and WRITES.
VERSIONED = {"get_versioned": 10, "compare_version_and_set": 10}
PIPELINE = 4  # async calls in flight at once per thread
OPEN_PATIENCE_S = 60.0  # how long a client tries to open its replica


def _expected(kind: str, key: str, rng: random.Random, seen: dict[str, str]) -> str:
    """The expected value of a compare_and_set or remove_if, or the version of a
    compare_version_and_set: mostly the one this thread saw last (often still current), else
    absent or a stale one."""
    if kind == "compare_version_and_set":
        return seen.get(key + "@", "") if rng.random() < 0.7 else rng.choice(["", "999999999"])
    if kind not in ("compare_and_set", "remove_if"):
        return ""
    expected = seen.get(key, "") if rng.random() < 0.7 else rng.choice(["", "0.0.0"])
    if kind == "remove_if" and not expected:
        expected = "0.0.0"  # remove_if takes a value, never "absent"
    return expected


def _args(value: str, expected: str, kind: str) -> dict[str, str]:
    args = {} if kind in ("get", "contains") else {"value": value}
    if expected:
        args["expected"] = expected
    return args


def _one(
    m: Any,
    rec: Recorder,
    rng: random.Random,
    kinds: list[str],
    weights: list[int],
    keys: list[str],
    client: int,
    ident: str,
    seen: dict[str, str],
) -> None:
    """Draw one operation, call it and record it."""
    kind = rng.choices(kinds, weights)[0]
    key = rng.choice(keys)
    if kind in ("put_all", "remove_all"):
        _batch(m, rec, kind, [key, rng.choice([k for k in keys if k != key])], client, ident)
    elif kind == "pipeline":
        _pipeline(m, rec, rng, kinds, keys, client, ident, seen)
    else:
        if kind == "compare_version_and_set" and rng.random() < 0.5:
            # the read-modify-write of a user: read the version, then set by it at once (the
            # only way a compare by version matches often while six threads write four keys)
            _sync(m, rec, "get_versioned", key, "", client, ident + ".r", seen)
            expected = seen.get(key + "@", "")
        else:
            expected = _expected(kind, key, rng, seen)
        _sync(m, rec, kind, key, expected, client, ident, seen)


def _sync(
    m: Any,
    rec: Recorder,
    kind: str,
    key: str,
    expected: str,
    client: int,
    ident: str,
    seen: dict[str, str],
) -> None:
    """Call one sync operation, record it, and keep what it showed of ``key`` in ``seen``."""
    model_kind, call = SYNC[kind]
    value = ident  # unique: every write's value says which call made it
    rec.called(ident, client, model_kind, key, **_args(value, expected, model_kind))
    try:
        result = call(m, key, value, expected)
    except Exception as exc:
        rec.raised(ident, exc)
        return
    done = time.monotonic_ns()
    output = _text(result)
    rec.returned(ident, output, done)
    if model_kind == "get":
        seen[key] = output
    elif model_kind == "get_versioned":
        if output:
            seen[key], seen[key + "@"] = output.rsplit("@", 1)
        else:
            seen[key], seen[key + "@"] = "", ""
    elif model_kind == "put" or (model_kind == "compare_and_set" and output == "true"):
        seen[key] = value


def _batch(m: Any, rec: Recorder, kind: str, pair: list[str], client: int, ident: str) -> None:
    """``put_all`` or ``remove_all`` of two keys: a blind put or remove of each, one call."""
    single = "put_blind" if kind == "put_all" else "remove_blind"
    for n, k in enumerate(pair):
        rec.called(f"{ident}.{n}", client, single, k, value=f"{ident}.{n}")
    try:
        if kind == "put_all":
            m.put_all({k: f"{ident}.{n}" for n, k in enumerate(pair)})
        else:
            m.remove_all(pair)
    except Exception as exc:
        for n in range(2):
            rec.raised(f"{ident}.{n}", exc)
        return
    done = time.monotonic_ns()
    for n in range(2):
        rec.returned(f"{ident}.{n}", "", done)


def _pipeline(
    m: Any,
    rec: Recorder,
    rng: random.Random,
    kinds: list[str],
    keys: list[str],
    client: int,
    ident: str,
    seen: dict[str, str],
) -> None:
    """``PIPELINE`` async calls issued back to back, then waited for: each call returns when
    its future resolves (noted by a done callback, in whichever thread resolves it)."""
    futures = []
    choices = [k for k in ASYNC if k in kinds]  # compare_version_and_set with versions only
    for n in range(PIPELINE):
        kind = rng.choice(choices)
        key = rng.choice(keys)
        model_kind, call = ASYNC[kind]
        expected = _expected(kind, key, rng, seen)
        one = f"{ident}.{n}"
        rec.called(one, client, model_kind, key, **_args(one, expected, model_kind))
        try:
            future = call(m, key, one, expected)
        except Exception as exc:
            rec.raised(one, exc)
            continue

        def done(f: Any, one: str = one) -> None:
            at = time.monotonic_ns()
            exc = f.exception()
            if exc is not None:
                rec.raised(one, exc)
            else:
                rec.returned(one, _text(f.result()), at)

        future.add_done_callback(done)
        futures.append(future)
    concurrent.futures.wait(futures, 60)  # what each returned or raised its callback noted


def client(
    target: str,
    connect: dict[str, Any],
    name: str,
    proc: int,
    threads: int,
    ops: int,
    keys: list[str],
    out: str,
    seed: int,
    *,
    options: dict[str, Any],
    store_dir: str | None,
    reopen: int,
    shards: bool,
    writes_only: bool,
    ready: Any,
    go: Any,
) -> None:
    """One process of the test: ``threads`` threads of ``ops`` operations each, each thread
    with a replica of its own (its own connection, as another process would have). With
    ``store_dir`` the replicas keep an LMDB store there; with ``reopen``, a thread closes its
    replica after every ``reopen`` operations and opens it again (a restart: the store and
    the log as it left them). With ``shards``, thread ``t`` of every process but the first
    holds only partition ``t % 2`` of the map (a shard) and calls only keys of it. Sets ``ready[proc]`` once every replica is open and starts when
    ``go.value`` is set."""
    rec = Recorder(out)
    tables: dict[bool, tuple[list[str], list[int]]] = {}

    def drawn(m: Any) -> tuple[list[str], list[int]]:
        """The kinds to draw from and their weights, for the map as it was created."""
        versions = m.creation_options["versions"]
        if versions not in tables:
            table = dict(WRITES) if writes_only else {**READS, **WRITES}
            if versions:
                table.update(VERSIONED)
            tables[versions] = list(table), list(table.values())
        return tables[versions]

    errors: list[str] = []
    opened = threading.Semaphore(0)

    def replica(t: int) -> tuple[Any, Any]:
        """Open thread ``t``'s replica, trying again for up to ``OPEN_PATIENCE_S`` while the
        log does not answer (a network fault of benchmarks/nemesis.py may strike as it opens)."""
        more = dict(options)
        if store_dir is not None:
            more.update(store="lmdb", store_path=os.path.join(store_dir, f"{proc}-{t}"))
        if shards and proc:
            more.update(shard=[t % 2])
        began = time.monotonic()
        while True:
            db = kafkakv.connect(target, **connect)
            try:
                return db, db.map(name, consistency="linearizable", **more)
            except kafkakv.KafkaKVError:
                db.close()
                if time.monotonic() - began > OPEN_PATIENCE_S:
                    raise

    def run(t: int) -> None:
        rng = random.Random(seed * 1000 + proc * 10 + t)
        seen: dict[str, str] = {}
        client_id = proc * threads + t
        db = None
        try:
            db, m = replica(t)
            mine = [k for k in keys if m.partition_of(k) in m.partitions]
            kinds, weights = drawn(m)
            opened.release()
            while not go.value:
                time.sleep(0.001)
            for i in range(ops):
                if reopen and i and i % reopen == 0:
                    db.close()
                    db, m = replica(t)
                _one(m, rec, rng, kinds, weights, mine, client_id, f"{proc}.{t}.{i}", seen)
        except BaseException:
            errors.append(traceback.format_exc())
            opened.release()
        finally:
            if db is not None:
                db.close()

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    try:
        for w in workers:
            w.start()
        for _ in workers:
            opened.acquire()
        if not errors:
            ready[proc] = 1
        for w in workers:
            w.join()
        if errors:
            raise RuntimeError("a client thread failed:\n" + "\n".join(errors))
    finally:
        os.close(rec.fd)
