"""Waiting in tests for something another thread or process does: one helper, one message."""

from __future__ import annotations

import inspect
import signal
import subprocess
import time
from collections.abc import Callable

__all__ = ["interrupt", "wait_for"]


def wait_for(
    condition: Callable[[], object],
    timeout: float = 20.0,
    what: str | None = None,
    *,
    interval: float = 0.01,
) -> None:
    """Return once ``condition()`` is true, checking every ``interval`` seconds; fail the test
    after ``timeout`` seconds, naming ``what`` was awaited (by default the condition's source)
    and what it returned last. For work that has nothing to wait on (a thread of the code
    under test, another process); where the code offers a blocking wait, use that instead.

    >>> wait_for(lambda: True)
    >>> wait_for(lambda: [], 0.05, "an empty list to fill up")
    Traceback (most recent call last):
    AssertionError: timed out after 0.05 s waiting for an empty list to fill up (last: [])
    """
    deadline = time.monotonic() + timeout
    while not (last := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what or _source(condition)} "
                f"(last: {last!r})"
            )
        time.sleep(interval)


def _source(condition: Callable[[], object]) -> str:
    """The text of ``condition`` (a lambda's whole line), or its name when that is unknown."""
    try:
        return " ".join(inspect.getsource(condition).split())
    except (OSError, TypeError):
        return getattr(condition, "__qualname__", repr(condition))


def interrupt(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """Send ``proc`` SIGINT (Ctrl-C) and return its stderr once it exits. A process still
    running after ``timeout`` seconds fails the test with every thread's traceback, which
    faulthandler prints on SIGABRT: start the process with ``python -X faulthandler``."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        err = proc.communicate(timeout=30)[1]
        raise AssertionError(
            f"still running {timeout} s after SIGINT; its threads then:\n{err}"
        ) from None
