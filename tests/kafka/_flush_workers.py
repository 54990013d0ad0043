"""A writer and flusher for tests/kafka/test_partitions_flush.py, on a simulated host:
``python -m tests.kafka._flush_workers URL NAME PREFIX SECONDS``.

It opens map ``NAME`` (one partition, a short flush period, a timeout of 5 s) and for
``SECONDS`` (from when it prints ``opened``) puts keys ``PREFIX0`` to ``PREFIX9`` in turn, each with the next value of a counter,
while another thread asks for a flush every 0.2 s; errors are counted, never fatal. Then it
prints ``written`` and waits for a line on stdin (the test's word that every worker is done),
syncs (trying again while the cluster recovers) and prints one JSON line: the last value of
each key whose put returned (``acked``), the last value each key was put with at all
(``tried``), how many flushes and puts failed, and the map as this replica holds it.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import kafkakv


def main(url: str, name: str, prefix: str, seconds: float) -> None:
    with kafkakv.connect(url, timeout=5) as db:
        m = db.map(name, partitions=1, value_codec="int", timeout=5, flush_period=20)
        sys.stdout.write("opened\n")  # the test times its fault from here
        sys.stdout.flush()
        stop = time.monotonic() + seconds
        failed = {"flush": 0, "put": 0}

        def flusher() -> None:
            while time.monotonic() < stop:
                try:
                    m.flush()
                except kafkakv.KafkaKVError:
                    failed["flush"] += 1
                time.sleep(0.2)

        thread = threading.Thread(target=flusher, daemon=True)
        thread.start()
        acked: dict[str, int] = {}
        tried: dict[str, int] = {}
        n = 0
        while time.monotonic() < stop:
            n += 1
            key = f"{prefix}{n % 10}"
            tried[key] = n
            try:
                m[key] = n
                acked[key] = n
            except kafkakv.KafkaKVError:
                failed["put"] += 1
                time.sleep(0.05)
        thread.join()
        sys.stdout.write("written\n")
        sys.stdout.flush()
        sys.stdin.readline()
        while True:  # the cluster may still recover from the fault
            try:
                m.sync()
                break
            except kafkakv.KafkaKVError:
                if time.monotonic() > stop + 60:
                    raise
        doc = {"acked": acked, "tried": tried, "failed": failed, "state": dict(m)}
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
