"""Child-process bodies for test_faults.py (spawned, so they live at module level)."""

from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any

import kafkakv


def writer(url: str, name: str, wid: int, seconds: float, reports: Any, sync_now: Any) -> None:
    """Put keys ``w<wid>-<n>`` for ``seconds`` and report every acknowledged key; once every
    writer has stopped (``sync_now``), sync and report this replica's whole state."""
    try:
        with kafkakv.connect(url, timeout=15) as db:
            m = db.map(name, value_codec="json")
            reports.put(("open", wid))
            acked: list[str] = []
            failed = 0
            deadline = time.monotonic() + seconds
            n = 0
            while time.monotonic() < deadline:
                key = f"w{wid}-{n}"
                n += 1
                try:
                    m[key] = {"by": wid, "n": n}
                    acked.append(key)
                except kafkakv.KafkaKVError:
                    failed += 1  # not acknowledged: may or may not be in the log
            reports.put(("written", wid, acked, failed))
            if not sync_now.wait(120):
                raise TimeoutError("the parent never said to sync")
            m.sync(timeout=60)
            reports.put(("state", wid, dict(m.items())))
    except BaseException:
        reports.put(("crash", wid, traceback.format_exc()))


def flusher(url: str, name: str, ready: Any) -> None:
    """Fill a map, then flush in a loop; the parent kills this process with SIGKILL while a
    flush transaction is open (``ready`` is set after the first flush)."""
    with kafkakv.connect(url, timeout=15) as db:
        m = db.map(name, value_codec="json", flush_period=10**9)
        engine = m._engine  # the test needs to flush on demand, many times
        n = 0
        while True:
            futures = [m.put_async(f"k{i}", {"round": n, "i": i}) for i in range(500)]
            for f in futures:
                f.result(timeout=30)
            engine.flush(0)
            n += 1
            if n == 1:
                ready.set()


def kill_now(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def open_transaction(url: str, topic: str, started: Any) -> None:
    """Open a transaction of a kafkakv writer on ``topic[0]`` (kafkakv's transactional settings:
    its ``transaction.timeout.ms`` included), store one record in it, report the wall-clock
    time just before producing it, and never commit: the parent kills this process."""
    with kafkakv.connect(url, timeout=15) as db:
        writer = db.log.writer(f"open-{topic}")
        producer = writer._producer  # type: ignore[attr-defined]  # the test needs it mid-way
        producer.begin_transaction()
        started.put(time.time())
        producer.produce(topic, b"open", b"k", 0)
        producer.flush(15)
        started.put("stored")
        time.sleep(600)
