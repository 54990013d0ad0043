"""What both guided tours share (examples/log_demo.py and examples/map_demo.py).

The console they print to, the verdicts that tick or cross each claim, the messages from their
child processes and the cleanup of those processes, and the frame of a run: the steps guarded
against failures, the "demo ok" line, and ``main()`` with its ``--dir`` and ``--keep``.

The tours are run as scripts (``python examples/log_demo.py``), so this directory is on
``sys.path`` and they import this module as ``_tour``; so do the child processes they spawn.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sized
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from typing import Any, TypeVar

from rich.console import Console

T = TypeVar("T")

console = Console(highlight=False)


class DemoFailure(Exception):
    """Something the demo cannot go on without did not happen."""


class Verdicts:
    """Prints each claim with a tick or a cross and remembers the crosses."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def expect(self, ok: bool, claim: str, problem: str | None = None) -> bool:
        if ok:
            console.print(f"  [green]✓[/] {claim}")
        else:
            text = problem or f"NOT TRUE: {claim}"
            console.print(f"  [bold red]✗ {text}[/]")
            self.failures.append(text)
        return ok


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {words or word + 's'}"


# -- child processes ----------------------------------------------------------------------------


def report_child_error(events: Any, who: str) -> None:
    """Send the current exception to the parent, so it can fail with the child's traceback."""
    events.put(("error", who, traceback.format_exc()))


class Inbox:
    """Messages from child processes, taken by kind; fails fast when a child reports an error
    or dies without a word. ``timeout`` is how long ``take()`` waits by default."""

    def __init__(self, events: Any, processes: list[SpawnProcess], timeout: float) -> None:
        self.events = events
        self.processes = processes
        self.timeout = timeout
        self.stash: dict[str, list[tuple[Any, ...]]] = {}

    def count(self, kind: str) -> int:
        return len(self.stash.get(kind, []))

    def receive(self, timeout: float) -> None:
        """Receive at most one message, waiting up to ``timeout`` for it."""
        try:
            message = self.events.get(timeout=timeout)
        except queue.Empty:
            dead = [p.name for p in self.processes if p.exitcode not in (None, 0)]
            if dead:
                raise DemoFailure(f"child process(es) died: {', '.join(dead)}") from None
            return
        if message[0] == "error":
            raise DemoFailure(f"{message[1]} failed:\n{message[2]}")
        self.stash.setdefault(message[0], []).append(message)

    def pump(self, seconds: float) -> None:
        """Receive messages for up to ``seconds``."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            self.receive(min(left, 0.2))

    def take(self, kind: str, count: int, timeout: float | None = None) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while self.count(kind) < count:
            if time.monotonic() > deadline:
                raise DemoFailure(f"timed out waiting for {count} '{kind}' messages from children")
            self.receive(0.2)
        taken, self.stash[kind] = self.stash[kind][:count], self.stash[kind][count:]
        return taken


def stop_all(processes: Iterable[SpawnProcess]) -> None:
    """Kill (by its own pid) every child this demo started that is still running."""
    for p in processes:
        if p.is_alive():
            p.kill()
        p.join(timeout=5)


def kill_mid_stream(
    process: SpawnProcess,
    receiver: Connection,
    receive: Callable[[float], bool],
    acks: Sized,
    count: int,
    timeout: float,
    who: str,
) -> None:
    """SIGKILL ``process`` a few milliseconds after it has acknowledged ``count`` updates.

    ``receive(seconds)`` takes one acknowledgement from ``receiver`` into ``acks`` (False when
    none came); ``who`` names the process in the failure when it stalls for ``timeout``. Once
    it is dead, the acknowledgements still in the pipe are received and the pipe is closed.
    """
    deadline = time.monotonic() + timeout
    while len(acks) < count:
        if time.monotonic() > deadline or not receive(1.0):
            raise DemoFailure(f"{who} stalled after {len(acks)} acknowledgements")
    # Let it run on for a random few milliseconds (still draining the pipe), so that the kill
    # lands at an arbitrary point of an update rather than right after an acknowledgement.
    until = time.monotonic() + random.uniform(0.0, 0.03)
    while time.monotonic() < until:
        receive(0.001)
    os.kill(process.pid or 0, signal.SIGKILL)
    process.join(timeout=10)
    while receive(0.5):  # acknowledgements still in the pipe
        pass
    receiver.close()


# -- the frame of a run -------------------------------------------------------------------------


def run_tour(
    steps: Callable[[Verdicts, list[SpawnProcess]], T], summary: Callable[[T, float], str]
) -> list[str]:
    """Run ``steps`` (given the verdicts and a list to put every child process in); return the
    failures (empty when all hold). A failure that stops the steps is one more cross; every
    child still running is killed in any case. When all hold, prints "demo ok: " and
    ``summary`` of what the steps returned and the seconds they took."""
    v = Verdicts()
    children: list[SpawnProcess] = []
    started = time.monotonic()
    try:
        result = steps(v, children)
    except DemoFailure as exc:
        v.expect(False, "", f"the demo could not go on: {exc}")
        return v.failures
    except Exception as exc:
        console.print_exception()
        v.expect(False, "", f"unexpected {type(exc).__name__}: {exc}")
        return v.failures
    finally:
        stop_all(children)
    console.rule()
    if not v.failures:
        console.print(f"[bold green]demo ok:[/] {summary(result, time.monotonic() - started)}")
    return v.failures


def tour_main(
    argv: list[str] | None,
    doc: str | None,
    run: Callable[[str, bool], list[str]],
    *,
    what: str,
    prefix: str,
    kept_note: Callable[[str], str] = lambda path: "",
) -> int:
    """Parse ``--dir`` and ``--keep``, run the tour in that directory (or in a new temporary
    one, named with ``prefix``) and report; returns the exit code.

    ``run(path, keep)`` runs the tour, where ``keep`` says whether the directory stays at the
    end. ``what`` names the directory in the help and the messages ("log directory"), and
    ``kept_note(path)`` is added to the message that says it is kept.
    On failure the directory is always kept; a ``--dir`` is never removed.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument("--dir", help=f"{what} to use (must be empty or not exist yet)")
    parser.add_argument("--keep", action="store_true", help=f"keep the temporary {what} at the end")
    args = parser.parse_args(argv)
    if args.dir:
        path = os.path.abspath(args.dir)
        if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
            console.print(f"[red]{path} must be an empty directory or not exist yet.[/]")
            return 2
        temporary = False
    else:
        path = tempfile.mkdtemp(prefix=prefix)
        temporary = True
    keep = args.keep or not temporary
    failures = run(path, keep)
    if failures:
        console.print(f"[bold red]demo FAILED: {plural(len(failures), 'claim')} did not hold[/]")
        for failure in failures:
            console.print(f"  - {failure.splitlines()[0]}")
        console.print(f"The {what} is kept for inspection: {path}")
        return 1
    if keep:
        console.print(f"The {what} is kept: {path}{kept_note(path)}")
    else:
        shutil.rmtree(path, ignore_errors=True)
    return 0
