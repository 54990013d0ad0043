"""Clients whose wall clocks disagree by a minute share a map with expiry on Kafka (issue 44,
"Clocks"): three replica processes at +30 s, -30 s and 0 s (the clock shim,
kafkakv.dev.clock) each put keys with short and long ttls and run their reapers.

What docs/maps.md ("Clocks and skew") states, checked here in every replica's own reads and
against the machine's monotonic clock, which the shim leaves alone:

- no replica reads a key as gone before its ttl has passed since its put began (the leader
  broker's clock decides, not the writer's nor the reaper's);
- every replica reads a short-lived key as gone within ttl + ``SLACK`` of its put's return;
- a long-lived key stays, whoever wrote it;
- afterwards every replica, and a fresh one, hold the same keys.

Before expiry went by the log's clock, the +30 s replica reaped the -30 s writer's keys at
once (its ``EXPIRE`` carried its own clock's stamp) and the -30 s replica's keys outlived
their ttl by 30 s elsewhere.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import kafkakv
from kafkakv.dev import Cluster
from kafkakv.dev.clock import run_skewed
from kafkakv.map.topics import MapTopics

SKEWS = {"fast": 30.0, "slow": -30.0, "true": 0.0}
SHORT, LONG = (2.0, 4.0), (45.0, 90.0)
SLACK = 2.0
"""Seconds past its ttl by which every replica reads a key as gone: the documented reap
delay (the estimate's lag, a 0-50 ms jitter, one append) with room for a loaded machine."""
EARLY = 0.02
"""Seconds by which the machine's monotonic and wall clocks may disagree over the test."""

_ROOT = Path(__file__).resolve().parents[2]


def _lines(proc: subprocess.Popen[str], tag: str, out: queue.Queue[tuple[str, Any]]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.put((tag, json.loads(line)))
    out.put((tag, None))


def _tell(procs: Iterable[subprocess.Popen[str]], line: str) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()


def test_skewed_clients_neither_shorten_nor_lengthen_a_keys_life(kafka_cluster: Cluster) -> None:
    url = "kafka://" + kafka_cluster.bootstrap
    name = f"clock-{uuid.uuid4().hex[:10]}"
    with kafkakv.connect(url, timeout=20) as db:
        db.map(name, value_codec="json", expiry=True)  # created by a client at 0 s
    ttls = ",".join(f"{t:g}" for t in SHORT + LONG)
    keys = [f"{tag}-{t:g}" for tag in SKEWS for t in SHORT + LONG]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), str(Path(kafkakv.__file__).parents[1])])
    messages: queue.Queue[tuple[str, Any]] = queue.Queue()
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for tag, skew in SKEWS.items():
            args = [sys.executable, "-m", "tests.kafka._clock_workers", url, name, tag, ttls]
            procs[tag] = proc = run_skewed(
                [*args, ",".join(keys)],
                skew,
                env=env,
                cwd=_ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            threading.Thread(target=_lines, args=(proc, tag, messages), daemon=True).start()
        puts: dict[str, tuple[float, float, float]] = {}  # key -> (ttl, start, end)
        finals: dict[str, dict[str, Any]] = {}
        opened: set[str] = set()
        written: set[str] = set()
        deadline = time.monotonic() + 45
        while len(written) < len(SKEWS):
            tag, message = messages.get(timeout=max(0.1, deadline - time.monotonic()))
            assert message is not None, f"replica {tag} ended early ({procs[tag].wait()})"
            if "wall" in message:  # the shim took: this replica's wall clock is off by its skew
                off = message["wall"] - (time.time() - (time.monotonic() - message["mono"]))
                assert abs(off - SKEWS[tag]) < 1.0, f"{tag}: clock off by {off:.2f} s"
                opened.add(tag)
                if len(opened) == len(SKEWS):  # all open: they put at once
                    _tell(procs.values(), "go")
            elif "put" in message:
                puts[message["put"]] = (message["ttl"], message["start"], message["end"])
            elif "written" in message:
                written.add(tag)
        # Watch until every short-lived key is due to be gone everywhere, then stop.
        last = max(end + ttl for ttl, _, end in puts.values() if ttl in SHORT)
        time.sleep(max(0.0, last + SLACK + 0.3 - time.monotonic()))
        _tell(procs.values(), "stop")
        while len(finals) < len(SKEWS):
            tag, message = messages.get(timeout=max(0.1, deadline + 30 - time.monotonic()))
            assert message is not None, f"replica {tag} ended early ({procs[tag].wait()})"
            finals[tag] = message
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    with kafkakv.connect(url, timeout=20) as db:
        fresh = db.map(name, value_codec="json")
        fresh.sync()
        fresh_held, fresh_stored = sorted(fresh.keys()), sorted(fresh._state.store)

    problems = []
    for reader, final in finals.items():
        for key, (ttl, start, end) in puts.items():
            gone = final["gone"].get(key)
            if key not in final["seen"]:
                # A replica that applied the put only when the key was due to be gone (a
                # starved process) rightly never shows it; one that had it in time must.
                applied = final["applied"].get(key)
                if applied is None or applied < start + ttl - EARLY:
                    when = "never" if applied is None else f"{applied - start:.3f} s after"
                    problems.append(f"{reader} never read {key} (applied {when} its put)")
                continue
            if ttl in SHORT:  # shown with -s: how long past its ttl each replica saw it
                past = "never" if gone is None else f"{gone - start - ttl:+.3f} s"
                print(f"{reader} read {key} (put took {end - start:.3f} s) gone at ttl {past}")
            if gone is not None and gone < start + ttl - EARLY:
                problems.append(f"{reader} read {key} as gone {start + ttl - gone:.3f} s early")
            if ttl in SHORT and (gone is None or gone > end + ttl + SLACK):
                late = "never" if gone is None else f"{gone - end - ttl:.3f} s past its ttl"
                problems.append(f"{reader} read {key} as gone {late}")
    assert not problems, problems
    long_lived = sorted(f"{tag}-{t:g}" for tag in SKEWS for t in LONG)
    for reader, final in finals.items():
        assert final["held"] == long_lived, reader
        assert final["stored"] == [k.decode() for k in fresh_stored], reader
    assert fresh_held == long_lived and [k.decode() for k in fresh_stored] == long_lived


def test_the_ops_topic_is_stamped_by_the_broker_and_an_older_one_is_warned_about(
    kafka_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """kafkakv creates the ops topic with ``LogAppendTime``; a map with expiry on an ops
    topic with ``CreateTime`` (made by an earlier kafkakv) opens, and says how to fix it."""
    url = "kafka://" + kafka_cluster.bootstrap
    new, old = (f"clock-{uuid.uuid4().hex[:10]}" for _ in range(2))
    with kafkakv.connect(url, timeout=20) as db:
        db.map(new, expiry=True)
        assert db.log.topic_config(f"{new}_ops")["message.timestamp.type"] == "LogAppendTime"
        topics = MapTopics.for_name(old)
        for name, config in topics.settings(db.log.new_topic_replication()).items():
            config = {k: v for k, v in config.items() if k != "message.timestamp.type"}
            db.log.create_topic(name, 1, config)
        assert db.log.topic_config(topics.ops)["message.timestamp.type"] == "CreateTime"
        with caplog.at_level(logging.WARNING, logger="kafkakv.map"):
            m = db.map(old, expiry=True)
        assert f"--entity-name {old}_ops" in caplog.text and "CreateTime" in caplog.text
        m.put("k", 1, ttl=60)
        assert 58 < (m.ttl("k") or 0) <= 60


def test_a_replica_that_opens_has_measured_the_log_clock_where_keys_expire(
    kafka_cluster: Cluster,
) -> None:
    """A new replica replays records stamped long before it applies them: it measures the
    log's clock while it opens, so its first reads and ``ttl()`` count from now."""
    url = "kafka://" + kafka_cluster.bootstrap
    name = f"clock-{uuid.uuid4().hex[:10]}"
    with kafkakv.connect(url, timeout=20) as db:
        before_put = time.monotonic()
        db.map(name, expiry=True, partitions=2).put("k", 1, ttl=60)
        after_put = time.monotonic()
        time.sleep(2.0)
        with kafkakv.connect(url, timeout=20) as other:
            m = other.map(name)
            assert any(m._engine.log_clock.fresh(p) for p in (0, 1))
            before_ttl = time.monotonic()
            ttl = m.ttl("k") or 0
            after_ttl = time.monotonic()
    # The key was stamped between before_put and after_put, and counted down since: bounds
    # from the time that really passed (opening the second replica took over 3 s on a
    # loaded machine, and a fixed lower bound of 55 failed), with 1 s for the clocks'
    # resolution. Counted from its replay instead, it would be near 60.
    assert 60 - (after_ttl - before_put) - 1.0 < ttl < 60 - (before_ttl - after_put) + 0.5
