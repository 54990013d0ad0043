"""Fixtures of the server's tests: a real server on a real log, reached through real HTTP.

``served`` runs :func:`kafkakv.serve.server.serve_in_thread` on the embedded log and on the
Kafka test cluster; :func:`start_server` runs ``python -m kafkakv serve`` as another process,
for what needs signals and restarts.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import kafkakv
from kafkakv.db import Database
from kafkakv.serve.config import ServeConfig
from kafkakv.serve.server import serve_in_thread
from tests.conftest import KAFKA_TIMEOUT, SHARED_LOG_BACKENDS

ROOT = Path(__file__).resolve().parents[2]

# The browser fixtures are a plugin of the modules that use them (pytest_plugins): left out of
# the doctest collection, which would import them first, before pytest can rewrite them.
collect_ignore = ["_browser.py"]


@dataclass
class Served:
    """A running server: its base URL, an HTTP client on it, the log's target, and a
    database of the test's own (another replica of every map)."""

    url: str
    http: httpx.Client
    target: str
    db: Database

    def map_name(self) -> str:
        """A fresh map, created through the API."""
        name = f"m-{uuid.uuid4().hex[:10]}"
        answer = self.http.put(f"/v1/maps/{name}", json={"partitions": 2})
        assert answer.status_code == 201, answer.text
        return name


def target_of(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    if backend == "embedded":
        return str(tmp_path / "log")
    bootstrap: str = request.getfixturevalue("kafka_cluster").bootstrap
    return "kafka://" + bootstrap


def connect(target: str) -> Database:
    if target.startswith("kafka://"):
        return kafkakv.connect(target, timeout=KAFKA_TIMEOUT)
    return kafkakv.connect(target, background_cleaner=False)


@pytest.fixture(params=SHARED_LOG_BACKENDS)
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    """A server on a fresh log of each shared backend, on a free port of 127.0.0.1."""
    target = target_of(request, request.param, tmp_path)
    db = connect(target)
    timeout = KAFKA_TIMEOUT if target.startswith("kafka://") else 10.0
    config = ServeConfig(target, port=0, request_timeout=timeout, heartbeat=0.5)
    try:
        with serve_in_thread(config, db) as url, httpx.Client(base_url=url, timeout=60) as http:
            yield Served(url, http, target, db)
    finally:
        db.close()


@dataclass
class ServerProcess:
    """``python -m kafkakv serve`` in a process of its own."""

    proc: subprocess.Popen[str]
    url: str
    stderr: list[str]

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait for the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def start_server(log: str, *args: str, port: int = 0, timeout: float = 60.0) -> ServerProcess:
    """Start a server on ``log`` and wait until it says where it listens; raises with its
    output when it exits or stays silent for ``timeout`` seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kafkakv", "serve", "-p", log, "--bind", f"127.0.0.1:{port}", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"kafkakv serve: (http://[\d.]+:\d+)/", line)
        if found:
            return ServerProcess(proc, found.group(1), lines)
    proc.kill()
    rest = proc.stderr.read()
    raise AssertionError(f"the server did not start: {''.join(lines)}{rest}")


def events(lines: Iterator[str], count: int) -> list[dict[str, Any]]:
    """The next ``count`` events of a Server-Sent Events stream (comments skipped), each as
    ``{"event": ..., "id": ..., "data": ...}``."""
    found: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in lines:
        if line == "":
            if current:
                found.append(current)
                current = {}
                if len(found) == count:
                    return found
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        current[field] = value.removeprefix(" ")
    raise AssertionError(f"the stream ended after {len(found)} of {count} events: {found}")
