"""The client processes of the linearizability tests (spawned, so they live at module level).

Each process opens its own replica of one map with ``consistency="linearizable"`` and runs a
few threads of random operations on a handful of keys, so that calls of different processes
and threads overlap on the same keys all the time. Every call is written down as it starts and
again as it returns (:class:`Recorder`): one ``os.write`` of a line each, to a file opened for
appending, so that the history of a process killed with SIGKILL holds everything it finished
and every call it was in the middle of.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import kafkakv

#: How often each operation is drawn, out of the sum. Reads go through every read path of a
#: linearizable map (``[]``, ``get``, ``in``); writes through the sync path, the gathered async
#: one (``put_async``) and the batch one (``put_all``, ``remove_all``).
READS = {"get": 12, "getitem": 8, "contains": 6}
WRITES = {
    "put": 12,
    "put_async": 8,
    "put_if_absent": 7,
    "replace": 6,
    "compare_and_set": 12,
    "remove": 5,
    "remove_if": 5,
    "put_all": 5,
    "remove_all": 2,
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
    value = ident  # unique: every write's value says which call made it
    if kind in ("put_all", "remove_all"):
        other = rng.choice([k for k in keys if k != key])
        pair = [key, other]
        single = "put_blind" if kind == "put_all" else "remove_blind"
        for n, k in enumerate(pair):
            rec.called(f"{ident}.{n}", client, single, k, value=f"{value}.{n}")
        try:
            if kind == "put_all":
                m.put_all({k: f"{value}.{n}" for n, k in enumerate(pair)})
            else:
                m.remove_all(pair)
        except Exception as exc:
            for n in range(2):
                rec.raised(f"{ident}.{n}", exc)
            return
        done = time.monotonic_ns()
        for n in range(2):
            rec.returned(f"{ident}.{n}", "", done)
        return
    expected = ""
    if kind in ("compare_and_set", "remove_if"):
        # Mostly the value this thread saw last (often still current), else absent or stale.
        expected = seen.get(key, "") if rng.random() < 0.7 else rng.choice(["", "0.0.0"])
        if kind == "remove_if" and not expected:
            expected = "0.0.0"  # remove_if takes a value, never "absent"
    call: Callable[[], Any]
    if kind == "get":
        call = lambda: m.get(key)  # noqa: E731
    elif kind == "getitem":

        def call() -> Any:
            try:
                return m[key]
            except KeyError:
                return None

    elif kind == "contains":
        call = lambda: key in m  # noqa: E731
    elif kind == "put":
        call = lambda: m.put(key, value)  # noqa: E731
    elif kind == "put_async":
        call = lambda: m.put_async(key, value).result(60)  # noqa: E731
    elif kind == "put_if_absent":
        call = lambda: m.put_if_absent(key, value)  # noqa: E731
    elif kind == "replace":
        call = lambda: m.replace(key, value)  # noqa: E731
    elif kind == "compare_and_set":
        call = lambda: m.compare_and_set(key, expected or None, value)  # noqa: E731
    elif kind == "remove":
        call = lambda: m.remove(key)  # noqa: E731
    elif kind == "remove_if":
        call = lambda: m.remove_if(key, expected)  # noqa: E731
    else:
        raise AssertionError(kind)
    model_kind = "get" if kind in ("get", "getitem") else "put" if kind == "put_async" else kind
    args = {"value": value} if kind not in READS else {}
    if expected:
        args["expected"] = expected
    rec.called(ident, client, model_kind, key, **args)
    try:
        result = call()
    except Exception as exc:
        rec.raised(ident, exc)
        return
    done = time.monotonic_ns()
    output = _text(result)
    rec.returned(ident, output, done)
    if kind in ("get", "getitem"):
        seen[key] = output
    elif kind in ("put", "put_async") or (output == "true" and kind == "compare_and_set"):
        seen[key] = value


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
    table = WRITES if writes_only else {**READS, **WRITES}
    kinds, weights = list(table), list(table.values())
    errors: list[str] = []
    opened = threading.Semaphore(0)

    def replica(t: int) -> tuple[Any, Any]:
        db = kafkakv.connect(target, **connect)
        more = dict(options)
        if store_dir is not None:
            more.update(store="lmdb", store_path=os.path.join(store_dir, f"{proc}-{t}"))
        if shards and proc:
            more.update(shard=[t % 2])
        return db, db.map(name, consistency="linearizable", **more)

    def run(t: int) -> None:
        rng = random.Random(seed * 1000 + proc * 10 + t)
        seen: dict[str, str] = {}
        client_id = proc * threads + t
        db = None
        try:
            db, m = replica(t)
            mine = [k for k in keys if m.partition_of(k) in m.partitions]
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
