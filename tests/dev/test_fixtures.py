"""The pytest plugin itself, run in a pytest of its own: fail (never skip), external mode."""

from __future__ import annotations

import getpass
import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from kafkakv.dev import Cluster
from tests.inner import run_pytest

_INNER = """
def test_brokers_answer(kafka_cluster):
    assert len(kafka_cluster.admin().list_topics(timeout=10).brokers) >= 1

def test_fault_needs_the_harness(kafka_cluster):
    kafka_cluster.kill(1)
"""


def _inner_pytest(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(_INNER)
    args = ["-p", "tests.kafka_cluster", "-q", "-rA", str(tmp_path / "test_inner.py")]
    return run_pytest(tmp_path, args, env, timeout=180)


def test_a_cluster_that_cannot_start_fails_the_tests_and_never_skips(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "KAFKAKV_TEST_BOOTSTRAP")}
    env["PATH"] = ""  # no java, no mvn
    env["KAFKAKV_CACHE"] = str(tmp_path / "cache")
    done = _inner_pytest(tmp_path, env)
    out = done.stdout
    assert done.returncode == 1, out
    assert "2 errors" in out and "skipped" not in out, out
    assert "the kafka-cluster Kafka cluster did not start" in out and "java not found" in out


@pytest.mark.kafka
def test_external_cluster_runs_tests_but_refuses_faults(
    kafka_faults: Cluster, tmp_path: Path
) -> None:
    env = dict(os.environ, KAFKAKV_TEST_BOOTSTRAP=kafka_faults.bootstrap)
    done = _inner_pytest(tmp_path, env)
    out = done.stdout
    assert "1 failed, 1 passed" in out, out
    assert "PASSED" in out and "::test_brokers_answer" in out
    assert "offers no fault injection" in out and "KAFKAKV_TEST_BOOTSTRAP" in out
    assert kafka_faults.is_running(1)


def test_a_pytest_run_by_a_test_leaves_the_outer_runs_directories_reachable(
    tmp_path: Path,
) -> None:
    """A PostgreSQL server of the suite, run as root, runs as its own system user and reaches
    its data under pytest's directories through the search bit that kafkakv.dev.postgres adds
    to each parent. A pytest that a test runs must not reset ``/tmp/pytest-of-<user>`` to 700
    (one did, and a fresh-clone run's initdb failed with 'Permission denied')."""
    root = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"
    root.mkdir(mode=0o700, exist_ok=True)
    root.chmod(stat.S_IMODE(root.stat().st_mode) | stat.S_IXOTH)  # as the PostgreSQL tests do
    (tmp_path / "test_inner.py").write_text(
        "def test_tmp(tmp_path):\n    assert tmp_path.is_dir()\n"
    )
    done = run_pytest(tmp_path, ["-q", str(tmp_path / "test_inner.py")], os.environ, timeout=120)
    assert "1 passed" in done.stdout, done.stdout + done.stderr
    assert root.stat().st_mode & stat.S_IXOTH, oct(root.stat().st_mode)
