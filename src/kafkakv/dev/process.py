"""Starting, finding and stopping broker processes (Linux), and :func:`dies_with_parent`,
which the brokers and the PostgreSQL server of :mod:`kafkakv.dev.postgres` share.

Every broker runs in a session (and process group) of its own, so a Ctrl-C in the terminal
that started it does not reach it. A broker started with ``die_with_parent`` also gets
``PR_SET_PDEATHSIG = SIGKILL``: the kernel kills it when the thread that started it exits,
however that ends (even ``kill -9`` of pytest).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kafkakv.dev.errors import ClusterError

__all__ = ["BrokerProcess", "dies_with_parent", "launch", "live_args", "log_tail", "spawn"]

_POLL_S = 0.05
_TAIL_LINES = 30
_TAIL_BYTES = 64 * 1024


def dies_with_parent(argv: Sequence[str], sig: int = signal.SIGKILL) -> list[str]:
    """``argv`` made to receive ``sig`` when the thread that starts it exits (Linux
    ``PR_SET_PDEATHSIG``; :func:`launch` starts it from a thread that lives as long as this
    process): also when this process is killed with SIGKILL, which no ``atexit`` or
    ``finally`` sees.

    util-linux's ``setpriv --pdeathsig`` sets it, then execs ``argv`` in the same process (its
    pid is the program's), through ``/bin/sh``, which checks the parent still lives. Not a
    ``preexec_fn``: that runs Python in the forked child of a threaded process, with this
    process's at-fork hooks and whatever they free; a broker's child that destroyed a copy of
    a librdkafka client there aborted (``rd_kafka_cgrp_destroy_final: assert``) before it
    could exec. Without ``preexec_fn`` no Python code runs between fork and exec. Raises
    ``OSError`` where ``setpriv`` is missing.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise OSError(
            "setpriv (util-linux) is not installed: it makes the child die with its parent"
        )
    name = signal.Signals(sig).name.removeprefix("SIG")
    # A parent that died before setpriv set the signal would never send it: the shell checks
    # that the parent is still this process (else the child was handed to another) and
    # exits 126 rather than run an orphan.
    check = 'test "$PPID" = "$1" || exit 126; shift; exec "$@"'
    return [
        setpriv,
        f"--pdeathsig={name}",
        "--",
        "/bin/sh",
        "-c",
        check,
        "kafkakv-child",
        str(os.getpid()),
        *argv,
    ]


_launcher: concurrent.futures.ThreadPoolExecutor | None = None
_launcher_lock = threading.Lock()


def launch(command: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(command, **options)``, forked by this process's launcher thread.

    ``PR_SET_PDEATHSIG`` (:func:`dies_with_parent`) fires when the *thread* that forked the
    child exits. Forked by a thread that ends early (a fault's heal in a nemesis thread, a
    test's helper thread), a broker would be killed with it: a long run lost every broker its
    nemesis thread had restarted when that thread finished. The launcher thread lives as long
    as the process, so such a child dies with the process and only then.
    """
    global _launcher
    with _launcher_lock:
        if _launcher is None:
            _launcher = concurrent.futures.ThreadPoolExecutor(1, "kafkakv-launcher")
        launcher = _launcher

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(list(command), **options)

    return launcher.submit(start).result()


def spawn(argv: Sequence[str], output: Path, *, die_with_parent: bool) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session with stdout and stderr appended to ``output``.

    Raises :class:`~kafkakv.dev.errors.ClusterError` when the program cannot be started.
    """
    try:
        command = dies_with_parent(argv) if die_with_parent else list(argv)
    except OSError as exc:
        raise ClusterError(str(exc)) from exc
    try:
        with open(output, "ab") as out:
            return launch(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
    except OSError as exc:
        raise ClusterError(f"cannot start {argv[0]}: {exc}") from exc


class BrokerProcess:
    """One running broker: a child this process started, or a pid adopted from a state file.

    A child is watched through its :class:`subprocess.Popen` (which also reaps it); an adopted
    pid through ``/proc``, and counts as alive only while its command line still runs
    ``kafka.Kafka`` on ``config_path`` (a recycled pid is not mistaken for the broker).
    """

    def __init__(
        self, pid: int, config_path: Path, popen: subprocess.Popen[bytes] | None = None
    ) -> None:
        self.pid = pid
        self.config_path = config_path
        self._popen = popen

    @classmethod
    def start(
        cls, argv: Sequence[str], output: Path, config_path: Path, *, die_with_parent: bool
    ) -> BrokerProcess:
        """Spawn a broker (see :func:`spawn`) and watch it."""
        popen = spawn(argv, output, die_with_parent=die_with_parent)
        return cls(popen.pid, config_path, popen)

    def alive(self) -> bool:
        """Whether the broker process still runs (a zombie does not)."""
        if self._popen is not None:
            return self._popen.poll() is None
        return _runs_broker(self.pid, self.config_path)

    def exit_code(self) -> int | None:
        """The exit status of a child that ended; ``None`` while it runs or when adopted."""
        return None if self._popen is None else self._popen.poll()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the broker; nothing when it has already ended."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def wait_gone(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to end; whether it did."""
        if self._popen is not None:
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def terminate(self, grace: float) -> None:
        """SIGTERM, then SIGKILL if still running after ``grace`` seconds; returns when gone."""
        self.signal(signal.SIGTERM)
        if not self.wait_gone(grace):
            self.signal(signal.SIGKILL)
            self.wait_gone(10.0)


def live_args(pid: int) -> list[bytes] | None:
    """The command line of process ``pid`` while it runs (``/proc``); None when it is gone
    or a zombie."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            args = handle.read().split(b"\0")
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return None if state == b"Z" else args


def _runs_broker(pid: int, config_path: Path) -> bool:
    """Whether ``pid`` is a live (not zombie) ``kafka.Kafka`` process on ``config_path``."""
    args = live_args(pid)
    return args is not None and b"kafka.Kafka" in args and os.fsencode(config_path) in args


def log_tail(path: Path, lines: int = _TAIL_LINES, *, offset: int = 0) -> str:
    """The last ``lines`` lines of the text file at ``path`` written after byte ``offset``
    ('' when it cannot be read).

    Reads at most the last 64 KiB.
    """
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(offset, handle.tell() - _TAIL_BYTES))
            data = handle.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])
