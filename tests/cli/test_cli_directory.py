"""``kafkakv directory load|serve`` against real logs (no mocks): the embedded log in a
temporary directory, and the 3-broker Kafka test cluster."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result

from kafkakv.cli.main import main
from kafkakv.dev import Cluster
from kafkakv.log import EmbeddedLog, Record
from kafkakv.log.kafka import KafkaLog
from tests.conftest import KAFKA_TIMEOUT

KAFKAKV = [sys.executable, "-m", "kafkakv"]


def cli(target: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["directory", "-p", target, *args], env={"KAFKAKV_LOG": None})


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


def make_topic(log_dir: Path, rows: list[tuple[bytes, bytes | None]], partitions: int = 1) -> str:
    name = f"d-{uuid.uuid4().hex[:10]}"
    with EmbeddedLog(log_dir, background_cleaner=False) as lg:
        lg.create_topic(name, partitions, {"cleanup.policy": "compact"})
        lg.append(name, 0, [Record(k, v) for k, v in rows])
    return name


def test_load_reports_readiness_and_dumps(log_dir: Path) -> None:
    rows = [(f"t{i}".encode(), orjson.dumps({"acquirer": i})) for i in range(5)]
    name = make_topic(log_dir, [*rows, (b"t1", None), (b"bad", b"{")], partitions=2)
    result = cli(str(log_dir), "load", name)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert f"ready: 4 keys from 7 records in 2 partitions of {name} in " in result.stderr
    assert "(1 errors)" in result.stderr
    assert "record error: partition 0 offset 6 key b'bad': JSONDecodeError" in result.stderr
    dumped = cli(str(log_dir), "load", name, "--dump", "--partitions", "0")
    assert dumped.exit_code == 0, dumped.stderr
    lines = [json.loads(line) for line in dumped.stdout.splitlines()]
    assert sorted(lines, key=lambda d: d["key"]) == [
        {"key": f"t{i}", "value": {"acquirer": i}} for i in (0, 2, 3, 4)
    ]
    assert "in 1 partitions" in dumped.stderr


def test_load_with_an_lmdb_store_resumes(log_dir: Path, tmp_path: Path) -> None:
    name = make_topic(log_dir, [(b"a", b"1"), (b"b", b"2")])
    store = str(tmp_path / "store")
    first = cli(str(log_dir), "load", name, "--store", "lmdb", "--store-path", store)
    assert "ready: 2 keys from 2 records" in first.stderr
    again = cli(str(log_dir), "load", name, "--store", "lmdb", "--store-path", store, "--dump")
    assert "ready: 2 keys from 0 records" in again.stderr
    assert len(again.stdout.splitlines()) == 2


def test_clear_errors(log_dir: Path, tmp_path: Path) -> None:
    name = make_topic(log_dir, [(b"a", b"1")])
    for args, fragment in (
        (("load", "nope"), "nope"),
        (("load", name, "--partitions", "3"), "partitions"),
        (("load", name, "--store", "lmdb"), "path"),
    ):
        result = cli(str(log_dir), *args)
        assert result.exit_code == 2, (args, result.stdout, result.stderr)
        assert result.stderr.startswith("error: ") and fragment in result.stderr, result.stderr
        assert "Traceback" not in result.output
    missing = cli(str(tmp_path / "missing"), "load", name)
    assert missing.exit_code == 2 and "no log at" in missing.stderr
    assert not (tmp_path / "missing").exists()  # never created
    bad = cli(str(log_dir), "load", name, "--partitions", "x")
    assert bad.exit_code == 2 and "partition numbers" in bad.stderr
    unset = CliRunner().invoke(main, ["directory", "load", name], env={"KAFKAKV_LOG": None})
    assert unset.exit_code == 2 and "--path" in unset.stderr


def test_serve_follows_serves_metrics_and_stops_on_sigterm(log_dir: Path) -> None:
    name = make_topic(log_dir, [(b"a", b"1")])
    proc = subprocess.Popen(
        [*KAFKAKV, "directory", "-p", str(log_dir), "serve", name, "--port", "0", "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KAFKAKV_LOG": ""},
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        ready = proc.stderr.readline()
        assert ready.startswith("ready: 1 keys from 1 records"), ready
        metrics_line = proc.stderr.readline()
        assert metrics_line.startswith("metrics: http://127.0.0.1:"), metrics_line
        url = metrics_line.split()[1]
        with EmbeddedLog(log_dir, background_cleaner=False) as lg:
            lg.append(name, 0, [Record(b"a", b"2"), Record(b"b", b"[3]")])
        changes = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert changes == [
            {"key": "a", "old": 1, "new": 2},
            {"key": "b", "old": None, "new": [3]},
        ]
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        assert f'kafkakv_directory_entries{{directory="{name}",topic="{name}"}} 2.0' in body
        assert "kafkakv_directory_records_total" in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_load_from_kafka(kafka_cluster: Cluster) -> None:
    url = "kafka://" + kafka_cluster.bootstrap
    name = f"d-{uuid.uuid4().hex[:10]}"
    with KafkaLog(kafka_cluster.bootstrap, timeout=KAFKA_TIMEOUT) as lg:
        lg.create_topic(name, 3, {"cleanup.policy": "compact"})
        for p in range(3):
            lg.send(name, p, [Record(f"k{p}-{i}".encode(), b"1") for i in range(10)])
    result = cli(url, "load", name, "--dump")
    assert result.exit_code == 0, result.stderr
    assert f"ready: 30 keys from 30 records in 3 partitions of {name}" in result.stderr
    assert len(result.stdout.splitlines()) == 30
    missing = cli(url, "load", f"{name}-nope")
    assert missing.exit_code == 2 and missing.stderr.startswith("error: ")


def _closed_port() -> int:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize(
    ("args", "bound"),
    [
        (["load", "t", "--timeout", "3"], 3),  # --timeout bounds the whole command
        (["serve", "t", "--timeout", "3", "--port", "0"], 3),
        (["--request-timeout", "2", "load", "t"], 2),  # and --request-timeout each request
    ],
    ids=["load-timeout", "serve-timeout", "request-timeout"],
)
def test_no_broker_fails_within_the_timeout(args: list[str], bound: float) -> None:
    """Nothing listens: the command says so with ``error: ...`` and exit code 2 within about
    its timeout, not after the Kafka log's default 30 s."""
    url = f"kafka://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    result = CliRunner().invoke(main, ["directory", "-p", url, *args], env={"KAFKAKV_LOG": None})
    elapsed = time.monotonic() - started
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.startswith("error: no Kafka broker answered at 127.0.0.1:")
    assert elapsed < bound + 2, f"took {elapsed:.1f} s"
