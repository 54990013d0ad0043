"""Threads in tests: another thread inside a ``with`` block, for as long as a test needs it
there; the process's native threads and sockets, to see what a client leaves running."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

__all__ = ["inside_in_another_thread", "native_threads_and_sockets", "thread_name"]


@contextmanager
def inside_in_another_thread(
    block: Callable[[], AbstractContextManager[Any]], timeout: float = 30.0
) -> Iterator[None]:
    """Start a thread that enters ``block()`` and stays inside it; yield once it is inside,
    and let it leave (and join it) when the ``with`` ends."""
    inside, leave = threading.Event(), threading.Event()

    def run() -> None:
        with block():
            inside.set()
            leave.wait(timeout)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert inside.wait(timeout), "the other thread did not get inside its block"
        yield
    finally:
        leave.set()
        thread.join(timeout)


def thread_name(identity: str) -> str:
    """The name of a thread of :func:`native_threads_and_sockets` now (librdkafka's begin
    with ``rdk:``, Python's are ``python``); ``""`` for a socket or a thread that ended."""
    if not identity.startswith("thread "):
        return ""
    try:
        with open(f"/proc/self/task/{identity.split()[1]}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def native_threads_and_sockets() -> set[str]:
    """This process's native threads and open sockets, as names unique while they live."""
    found = {f"thread {tid}" for tid in os.listdir("/proc/self/task")}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                found.add(target)
    return found
