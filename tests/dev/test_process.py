"""Brokers die with the process that started them for tests, and outlive the CLI."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kafkakv.dev.process import spawn
from tests.waiting import wait_for

_STARTER = """
import sys, time
from pathlib import Path
from kafkakv.dev.process import spawn
child = spawn(["sleep", "120"], Path(sys.argv[1]), die_with_parent=sys.argv[2] == "die")
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def _start_starter(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], int]:
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER, str(tmp_path / "out.log"), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    return starter, int(starter.stdout.readline())


def _wait_gone(pid: int, seconds: float) -> None:
    wait_for(lambda: not _alive(pid), seconds, f"process {pid} to exit", interval=0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_child_dies_when_its_starter_is_killed(tmp_path: Path) -> None:
    starter, child = _start_starter(tmp_path, "die")
    assert _alive(child)
    assert os.getsid(child) == child  # its own session: a terminal's Ctrl-C does not reach it
    starter.kill()
    starter.wait()
    _wait_gone(child, 5.0)


def test_child_without_the_death_signal_outlives_its_starter(tmp_path: Path) -> None:
    starter, child = _start_starter(tmp_path, "stay")
    try:
        starter.kill()
        starter.wait()
        time.sleep(0.5)
        assert _alive(child)
    finally:
        os.kill(child, signal.SIGKILL)


_FORK_WATCHER = """
import os, sys
from pathlib import Path
from kafkakv.dev.process import spawn
# Python that runs in a forked child between fork and exec runs these hooks first.
os.register_at_fork(after_in_child=lambda: os.write(2, b"python ran in the child\\n"))
for mode in ("die", "stay"):
    spawn(["true"], Path(sys.argv[1]), die_with_parent=mode == "die").wait()
print("spawned", flush=True)
"""


def test_no_python_runs_between_fork_and_exec(tmp_path: Path) -> None:
    """A ``preexec_fn`` runs Python in the forked copy of a threaded process, with its at-fork
    hooks and finalizers: a broker's child once destroyed a copy of a librdkafka client there
    and aborted (exit -6) before it could exec. Children start without one."""
    out = tmp_path / "out.log"
    done = subprocess.run(
        [sys.executable, "-c", _FORK_WATCHER, str(out)], capture_output=True, text=True
    )
    assert done.stdout == "spawned\n", done.stderr
    assert "python ran in the child" not in out.read_text() + done.stderr


def test_no_module_starts_a_child_with_a_preexec_fn() -> None:
    """The rule behind the test above, for every child the package starts."""
    package = Path(__file__).parents[2] / "src" / "kafkakv"
    offenders = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.keyword) and node.arg == "preexec_fn"
    ]
    assert not offenders, offenders


def test_a_child_started_by_a_thread_that_ends_outlives_that_thread(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG fires when the thread that forked exits: brokers a nemesis thread had
    restarted were killed when it finished. They die with the process, not the thread."""
    started: list[int] = []

    def start() -> None:
        started.append(spawn(["sleep", "120"], tmp_path / "out.log", die_with_parent=True).pid)
        time.sleep(0.5)  # as a nemesis thread waits for the broker it restarted: then ends

    helper = threading.Thread(target=start)
    helper.start()
    helper.join()
    try:
        time.sleep(0.5)
        assert _alive(started[0])
    finally:
        os.kill(started[0], signal.SIGKILL)
