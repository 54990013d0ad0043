"""Fencing under a network partition (issue 44 §2): a replica flushing while its host is cut
off from the cluster, healed later, never makes the data topic go back, and a fresh replica
then equals the others; nothing acknowledged is lost on any of them."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from typing import Any

import pytest

import kafkakv
from kafkakv.dev import DevCluster
from kafkakv.dev.hosts import Hosts
from kafkakv.map import FLUSH_POINT_KEY
from kafkakv.map.machine import read_flush_point

pytestmark = pytest.mark.slow

RUN_S = 15.0
CUT_AT_S, CUT_S = 3.0, 6.0


def _worker(hosts: Hosts, host: str, url: str, name: str, prefix: str) -> subprocess.Popen[bytes]:
    args = ["-m", "tests.kafka._flush_workers", url, name, prefix, str(RUN_S)]
    return hosts.python(host, args, stdout=subprocess.PIPE, stdin=subprocess.PIPE)


def _said(process: subprocess.Popen[bytes], word: str) -> list[str]:
    """Wait until the worker says ``word`` (``opened``: its map is open; ``written``: it wrote
    all it writes); return what it logged before (its stderr comes with its stdout)."""
    assert process.stdout is not None
    logged: list[str] = []
    for line in process.stdout:
        if line == f"{word}\n".encode():
            return logged
        logged.append(line.decode(errors="replace"))
    pytest.fail(f"a worker failed: {''.join(logged)[-3000:]}")


def _result(process: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, _ = process.communicate(b"sync\n", timeout=120)
    lines = out.decode(errors="replace").strip().splitlines()
    assert process.returncode == 0 and lines, f"a worker failed: {out.decode()[-3000:]}"
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc


def _fresh(url: str, name: str) -> tuple[dict[str, int], list[int]]:
    """A fresh replica's state, and the flush points of the data topic in log order."""
    with kafkakv.connect(url, timeout=30) as db:
        m = db.map(name, partitions=1, value_codec="int", timeout=10)
        m.sync()
        engine = m._engine
        points, position = [], 0
        while batch := db.log.read(engine.topics.data, 0, position, max_records=1000):
            points += [read_flush_point(r.value) for r in batch if r.key == FLUSH_POINT_KEY]
            position = (batch[-1].offset or 0) + 1
        return dict(m), points


def test_a_flusher_cut_off_mid_flush_never_regresses_the_data_topic(
    hosts_cluster: DevCluster, host_network: Hosts
) -> None:
    url, name = "kafka://" + hosts_cluster.bootstrap, f"fence-{uuid.uuid4().hex[:10]}"
    first = _worker(host_network, "c1", url, name, "a")
    logged = _said(first, "opened")  # c1 created the map
    second = _worker(host_network, "c2", url, name, "b")
    logged += _said(second, "opened")  # the fault comes once both write, however slow the start
    time.sleep(CUT_AT_S)
    with host_network.isolate("c1"):  # c1 is flushing every 0.2 s: some flush is cut off
        time.sleep(CUT_S)
    logged += _said(first, "written") + _said(second, "written")
    cut_off, other = _result(first), _result(second)
    state, points = host_network.call("ctl", lambda: _fresh(url, name))
    print("".join(logged)[-2000:])
    print(
        f"flushes failed on c1/c2: {cut_off['failed']} / {other['failed']}; "
        f"{len(points)} flush points: {points[:3]}...{points[-3:]}"
    )
    for replica in (cut_off["state"], other["state"]):
        differ = {k: (replica.get(k), state.get(k)) for k in {*replica, *state}}
        differ = {k: v for k, v in differ.items() if v[0] != v[1]}
        assert not differ, f"a replica and a fresh one differ (theirs, fresh): {differ}"
    assert points == sorted(points), f"the data topic's flush points went back: {points}"
    assert cut_off["failed"]["flush"] > 0, "no flush of the cut-off replica failed"
    for worker in (cut_off, other):
        for key, value in worker["acked"].items():
            assert value <= state[key] <= worker["tried"][key], (key, value, state.get(key))
