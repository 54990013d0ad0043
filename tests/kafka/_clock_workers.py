"""A replica with its own wall clock, for test_clock_skew.py: started with ``python -m
tests.kafka._clock_workers URL MAP TAG TTLS KEYS`` under the clock shim (kafkakv.dev.clock).

It opens the map with expiry, reports its wall clock, waits for a line on stdin (every
replica is open: go), puts ``TAG-<ttl>`` for each ttl (seconds, comma-separated),
reporting each put's ``time.monotonic()`` span (the shim leaves that clock alone: it is
the machine's, the parent's too), then watches every key of ``KEYS`` (comma-separated) in
its own reads, every 20 ms, until a line arrives on stdin: then it syncs and reports when
it first saw each key, when it first saw each key gone again, when it applied each key's put
(a listener), and the keys it holds. One JSON object per line on stdout; its reaper runs all
along, by this process's clock.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import kafkakv


def _say(**message: Any) -> None:
    print(json.dumps(message), flush=True)


def main(url: str, name: str, tag: str, ttls: str, watched: str) -> None:
    keys = watched.split(",")
    with kafkakv.connect(url, timeout=20) as db:
        m = db.map(name, value_codec="json", expiry=True)
        m.sync()
        _say(wall=time.time(), mono=time.monotonic())
        sys.stdin.readline()  # go
        stop = threading.Event()

        def wait_for_stop() -> None:
            sys.stdin.readline()
            stop.set()

        threading.Thread(target=wait_for_stop, daemon=True).start()
        for ttl in ttls.split(","):
            started = time.monotonic()
            m.put(f"{tag}-{ttl}", {"by": tag}, ttl=float(ttl))
            _say(put=f"{tag}-{ttl}", ttl=float(ttl), start=started, end=time.monotonic())
        _say(written=tag)
        applied: dict[str, float] = {}  # when this replica applied each key's put

        def on_change(key: Any, old: Any, new: Any, mine: bool) -> None:
            if new is not None and key in watch:
                applied.setdefault(key, time.monotonic())

        watch = set(keys)
        m.add_listener(on_change)
        seen: dict[str, float] = {}
        gone: dict[str, float] = {}
        while not stop.wait(0.02):
            now = time.monotonic()
            for key in keys:
                present = key in m
                if present and key not in seen:
                    seen[key] = now
                elif not present and key in seen and key not in gone:
                    gone[key] = now
        m.sync()
        _say(
            seen=seen, gone=gone, applied=applied, held=sorted(m.keys()), stored=sorted(_stored(m))
        )


def _stored(m: Any) -> list[str]:
    """The keys the replica's store holds, expired or not (its state, not its reads)."""
    return [key.decode() for key, _ in m._state.store.items()]


if __name__ == "__main__":
    main(*sys.argv[1:6])
