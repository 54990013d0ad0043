"""Forking a process whose threads are writing to a map: run as
``python -m tests.map.forking PATH``, from the repository's root.

It runs in an interpreter of its own because ``fork()`` copies the whole process but only the
forking thread: what a child finds of the other threads' libraries is whatever they held at
that instant. A test process that has already run a thousand tests carries threads and
extension state of Kafka clients, Arrow and a browser driver, none of which promise anything
about fork. The promise checked here is kafkakv's own: a map inherited through fork is refused
in the child with a clear error, a database of the child's own works there, nothing
deadlocks, and the parent is unharmed. It exits 0 when all of that held, and otherwise prints
what did not.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from typing import Any

import kafkakv
from kafkakv.errors import ClosedError

FORKS = 8
CHILD_PATIENCE = 30.0  # seconds a child may take before it counts as deadlocked
_CHILD_OK = 0


def _in_child(m: Any, db: kafkakv.Database, path: str) -> int:
    """What a child made by fork checks; its exit code (0: all as promised)."""
    for use in (
        lambda: m["k"],
        lambda: m.put("k", 2),
        lambda: m.put_async("k", 2),
        lambda: len(m),
        lambda: m.sync(),
        lambda: db.map("other"),
    ):
        try:
            use()
        except ClosedError as exc:
            if "call kafkakv.connect() in this one" not in str(exc):
                return 2
        else:
            return 3
    db.close()  # the parent's to close: nothing happens here
    with kafkakv.connect(path) as own:  # a database of its own works
        mine = own.map("forked")
        mine["child"] = os.getpid()
        mine.sync()
        if mine["child"] != os.getpid():
            return 4
    return _CHILD_OK


def _wait_for_child(pid: int) -> int:
    """The child's exit code; a child still running after CHILD_PATIENCE is killed (-1)."""
    deadline = time.monotonic() + CHILD_PATIENCE
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -1
        time.sleep(0.02)


def run(path: str) -> list[str]:
    """Fork FORKS times while two threads run put_async; what went wrong (empty: nothing)."""
    wrong: list[str] = []
    with kafkakv.connect(path) as db:
        m = db.map("forked")
        m["k"] = 1
        stop = threading.Event()

        def busy() -> None:  # threads that hold the map's locks at any moment
            i = 0
            while not stop.is_set():
                m.put_async(f"b{i % 100}", i)
                i += 1

        writers = [threading.Thread(target=busy) for _ in range(2)]
        for t in writers:
            t.start()
        try:
            for n in range(FORKS):
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child reports through its exit code
                    code = 1
                    try:
                        code = _in_child(m, db, path)
                    finally:
                        os._exit(code)
                code = _wait_for_child(pid)
                if code == -1:
                    wrong.append(f"child {n} deadlocked")
                elif code != _CHILD_OK:
                    wrong.append(f"child {n} exited with {code}")
        finally:
            stop.set()
            for t in writers:
                t.join()
        m.sync()
        if not (isinstance(m["child"], int) and m["k"] == 1):
            wrong.append(f"the parent was harmed: child={m['child']!r} k={m['k']!r}")
    return wrong


if __name__ == "__main__":
    faulthandler.enable()  # a child that crashes says where
    problems = run(sys.argv[1])
    print("\n".join(problems) or f"{FORKS} children as promised")
    sys.exit(1 if problems else 0)
