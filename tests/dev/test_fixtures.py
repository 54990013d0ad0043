"""The pytest plugin itself, run in a pytest of its own: fail (never skip), external mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafkakv.dev import Cluster

ROOT = Path(__file__).resolve().parents[2]

_INNER = """
def test_brokers_answer(kafka_cluster):
    assert len(kafka_cluster.admin().list_topics(timeout=10).brokers) >= 1

def test_fault_needs_the_harness(kafka_cluster):
    kafka_cluster.kill(1)
"""


def _inner_pytest(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(_INNER)
    plugins = ["-p", "tests.kafka_cluster", "-p", "no:cacheprovider"]
    where = ["--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *plugins, "-q", "-rA", *where],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


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
