"""The suite's own xdist plumbing: groups, and the Kafka cluster every worker shares."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from tests.inner import run_pytest
from tests.shared_cluster import READY, WANT, SharedCluster, attach


def test_no_worker_asks_so_no_cluster_starts(tmp_path: Path) -> None:
    shared = SharedCluster(tmp_path, base_port=11992)
    time.sleep(0.5)
    shared.close()
    assert not (tmp_path / READY).exists() and not (tmp_path / "kafka-cluster").exists()


def test_a_cluster_that_cannot_start_is_an_error_the_worker_reads(tmp_path: Path) -> None:
    # a port of this session's that no cluster takes (the shared one starts at +90)
    port = 11092 + int(os.environ.get("KAFKAKV_TEST_PORT_OFFSET") or 0) + 95
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        shared = SharedCluster(tmp_path, base_port=port)
        try:
            with pytest.raises(RuntimeError, match=rf"{port}.*in use"):
                attach(tmp_path, timeout=60)
            assert (tmp_path / WANT).exists()
        finally:
            shared.close()


def test_a_worker_with_no_controller_gives_up_at_its_timeout(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no Kafka cluster within 1 s"):
        attach(tmp_path, timeout=1)
    assert time.monotonic() - start < 3


_INNER = """
import os

def test_a(kafka_cluster, worker_id):
    with open(os.environ["OUT"], "a") as f:
        f.write(f"{worker_id} {kafka_cluster.bootstrap}\\n")

def test_b(kafka_cluster, worker_id):
    test_a(kafka_cluster, worker_id)

def test_c(kafka_cluster, worker_id):
    kafka_cluster.kill(1)
"""


@pytest.mark.kafka
def test_workers_share_one_cluster_that_takes_no_faults(tmp_path: Path) -> None:
    """Two workers, one cluster (on the shared slot's ports); a fault call on it fails."""
    (tmp_path / "test_inner.py").write_text(_INNER)
    out = tmp_path / "out.txt"
    offset = int(os.environ.get("KAFKAKV_TEST_PORT_OFFSET") or 0) + 50
    env = dict(os.environ, OUT=str(out), KAFKAKV_TEST_PORT_OFFSET=str(offset))
    env.pop("KAFKAKV_TEST_BOOTSTRAP", None)
    plugins = ["-p", "tests.parallel", "-p", "tests.kafka_cluster"]
    args = [*plugins, "-q", "-n", "2", "--dist", "load", str(tmp_path / "test_inner.py")]
    done = run_pytest(tmp_path, args, env, timeout=240)
    assert "1 failed, 2 passed" in done.stdout, done.stdout + done.stderr
    assert "offers no fault injection" in done.stdout
    lines = [line.split() for line in out.read_text().splitlines()]
    first = 11092 + offset + 90
    assert {bootstrap for _, bootstrap in lines} == {
        f"127.0.0.1:{first},127.0.0.1:{first + 10000},127.0.0.1:{first + 20000}"
    }


_INNER_RELEASE = """
import os

import pytest

from tests.parallel import release_after_last_use


def note(what):
    with open(os.environ["OUT"], "a") as f:
        f.write(what + "\\n")


@pytest.fixture(scope="session")
def resource(request):
    request.addfinalizer(lambda: note("finalized"))
    release_after_last_use(request, lambda: note("released"))


@pytest.fixture(scope="session")
def shared(request):
    release_after_last_use(request, lambda: note("shared released"))


@pytest.mark.xdist_group("g")
def test_g1(resource, shared):
    note("g1")


@pytest.mark.xdist_group("g")
def test_g2(resource):
    note("g2")


@pytest.mark.xdist_group("g")
def test_g3(shared):
    note("g3")


def test_other(shared):
    note("other")
"""


def test_a_fixture_only_one_group_uses_is_given_back_after_its_last_test(tmp_path: Path) -> None:
    """``resource`` is used by group g alone: given back right after g2, its last test, not
    at the end of the session (where its finalizer runs too). ``shared`` is used outside the
    group as well: kept until the end."""
    (tmp_path / "test_inner.py").write_text(_INNER_RELEASE)
    out = tmp_path / "out.txt"
    env = dict(os.environ, OUT=str(out))
    args = ["-p", "tests.parallel", "-q", "-n", "1", "--dist", "loadgroup", str(tmp_path)]
    done = run_pytest(tmp_path, args, env, timeout=120)
    assert "4 passed" in done.stdout, done.stdout + done.stderr
    notes = out.read_text().split("\n")[:-1]
    assert "shared released" not in notes
    assert notes.index("released") == notes.index("g2") + 1, notes
    assert notes.index("g3") > notes.index("released") and notes[-1] == "finalized", notes
