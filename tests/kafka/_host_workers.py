"""A client for tests/kafka/test_partitions.py that runs on a simulated host:
``python -m tests.kafka._host_workers URL NAME TIMEOUT LOG_TIMEOUT THREADS``.

It opens map ``NAME`` (linearizable, ``TIMEOUT`` seconds; its log's ``LOG_TIMEOUT``) and puts
one key (trying again for up to a minute, as the cluster may still recover from a fault), then
``THREADS`` threads call it without pause, alternating a put and a get, until the process is
killed. It prints one JSON line per event: ``{"event": "open", "first_put_tries": n}`` once the map is open, then one
per call: ``{"event": "call", "op", "thread", "start", "end", "error"}``, with times from
``time.monotonic()`` (the same clock in every process of the machine) and ``error`` the class
and message of what it raised (null when it succeeded). With ``KAFKAKV_WORKER_DUMP=path``, the
stacks of every thread are appended to ``path`` whenever a call runs 0.5 s past its timeout.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

import kafkakv

_print_lock = threading.Lock()


def _emit(doc: dict[str, object]) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()


_started: dict[int, float] = {}  # thread -> start of its call in progress


def _watch(limit: float, path: str) -> None:
    """Append every thread's stack to ``path`` when a call has run past ``limit`` seconds
    (once per call): where a call that overstays its timeout waits."""
    seen: set[float] = set()
    while True:
        time.sleep(0.2)
        now = time.monotonic()
        late = [t for t in _started.values() if now - t > limit and t not in seen]
        if late:
            seen.update(late)
            with open(path, "a") as out:
                out.write(f"--- a call running for {now - min(late):.1f} s\n")
                for ident, frame in sys._current_frames().items():
                    out.write(f"thread {ident}\n{''.join(traceback.format_stack(frame))}\n")


def _caller(m: kafkakv.ReplicaMap[str, int], thread: int) -> None:
    n = 0
    while True:
        n += 1
        op = "put" if n % 2 else "get"
        key = f"t{thread}-k{n % 5}"
        start = _started[thread] = time.monotonic()
        error = None
        try:
            if op == "put":
                m[key] = n
            else:
                m.get(key)
        except kafkakv.KafkaKVError as exc:
            error = f"{type(exc).__name__}: {exc}"
        end = time.monotonic()
        del _started[thread]
        _emit(
            {
                "event": "call",
                "op": op,
                "thread": thread,
                "start": start,
                "end": end,
                "error": error,
            }
        )
        if error is not None and end - start < 0.05:
            time.sleep(0.05)  # a call refused at once: do not spin


def main(url: str, name: str, timeout: float, log_timeout: float, threads: int) -> None:
    with kafkakv.connect(url, timeout=log_timeout) as db:
        m = db.map(name, value_codec="int", timeout=timeout, consistency="linearizable")
        began, tries = time.monotonic(), 0
        while True:  # the first put: the cluster may still be recovering from a fault
            tries += 1
            try:
                m["opened"] = 1
                break
            except kafkakv.KafkaKVError:
                if time.monotonic() - began > 60:
                    raise
        _emit({"event": "open", "at": time.monotonic(), "first_put_tries": tries})
        workers = [
            threading.Thread(target=_caller, args=(m, i), daemon=True) for i in range(threads)
        ]
        dump = os.environ.get("KAFKAKV_WORKER_DUMP")
        if dump:
            threading.Thread(target=_watch, args=(timeout + 0.5, dump), daemon=True).start()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
