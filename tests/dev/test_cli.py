"""``kafkakv dev-cluster start|status|stop`` as a person runs it, in separate processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kafkakv
from kafkakv.dev import DevCluster
from kafkakv.dev.state import ClusterState

pytestmark = pytest.mark.kafka

BASE_PORT = 29092  # below the ephemeral range, where clients' own ports cannot take it


def _kafkakv(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafkakv", "dev-cluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _runs(pid: int) -> bool:
    try:
        return b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_start_status_refuse_stop(tmp_path: Path) -> None:
    where = str(tmp_path / "dev")
    try:
        security = ("--tls", "--sasl-user", "app:s3cret")
        started = _kafkakv(
            "start", "--brokers", "1", "--base-port", str(BASE_PORT), "--dir", where, *security
        )
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == f"127.0.0.1:{BASE_PORT}"
        assert "starting node 1" in started.stderr and "ready in" in started.stderr
        assert f"SASL/PLAIN clients: 127.0.0.1:{BASE_PORT + 2}" in started.stderr
        ca = str(Path(where).absolute() / "tls" / "ca.pem")
        assert f"TLS clients: 127.0.0.1:{BASE_PORT + 3}" in started.stderr
        assert f"ssl.ca.location={ca}" in started.stderr
        tls = f"kafka://127.0.0.1:{BASE_PORT + 3}?security.protocol=SSL&ssl.ca.location={ca}"
        with kafkakv.connect(tls, timeout=20) as db:  # the listener it printed works
            db.log.create_topic("made-over-tls", 1)
        with kafkakv.connect(f"kafka://127.0.0.1:{BASE_PORT}", timeout=20) as db:
            assert "made-over-tls" in db.log.topics()

        state = ClusterState.load(Path(where))
        assert state is not None
        pid = state.pids[1]
        assert _runs(pid)  # the broker outlived the command that started it
        assert os.getsid(pid) == pid

        status = _kafkakv("status", "--dir", where)
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"pid {pid:>7}  127.0.0.1:{BASE_PORT}  running  ready" in status.stdout

        again = _kafkakv("start", "--brokers", "1", "--base-port", str(BASE_PORT), "--dir", where)
        assert again.returncode == 2
        assert again.stderr.startswith("error: ") and "already running" in again.stderr

        stopped = _kafkakv("stop", "--dir", where)
        assert stopped.returncode == 0, stopped.stderr
        assert f"stopped 1 broker(s) (pids {pid})" in stopped.stdout
        assert not _runs(pid)

        after = _kafkakv("status", "--dir", where)
        assert after.returncode == 1 and "stopped" in after.stdout
        nothing = _kafkakv("stop", "--dir", where)
        assert nothing.returncode == 0 and "no dev cluster running" in nothing.stdout
    finally:
        if ClusterState.load(Path(where)) is not None:
            DevCluster.attach(where).stop()


def test_a_sasl_user_without_a_password_is_a_usage_error(tmp_path: Path) -> None:
    done = _kafkakv("start", "--dir", str(tmp_path), "--sasl-user", "app")
    assert done.returncode == 2 and "USER:PASSWORD" in done.stderr
    assert ClusterState.load(tmp_path) is None  # nothing started


def test_stop_of_a_directory_without_a_cluster_says_so(tmp_path: Path) -> None:
    done = _kafkakv("stop", "--dir", str(tmp_path))
    assert done.returncode == 0
    assert "no dev cluster running" in done.stdout
