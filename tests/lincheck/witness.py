"""A *witness* of a map on a simulated host: a replica that puts keys of its own
(``w-<host>-<n>``) until stopped and notes which puts were acknowledged, so that a test can
ask, after faults and their heal, whether every acknowledged put is in every replica
(benchmarks/nemesis.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import kafkakv
from kafkakv.dev.hosts import Hosts
from kafkakv.errors import KafkaKVError

__all__ = ["Witness", "fresh_state", "open_map"]


class Witness:
    """A replica of a map in one host that puts keys of its own until stopped, and
    knows which of its puts were acknowledged (their futures resolved without error)."""

    def __init__(
        self, hosts: Hosts, host: str, url: str, name: str, timeout: float, **options: Any
    ) -> None:
        self.hosts, self.host, self.prefix = hosts, host, f"w-{host}-"
        self.timeout = timeout
        self.longest = 0.0  # the longest put, acknowledged or not (seconds)
        self.acked: list[str] = []
        self.unknown = 0
        self.stop = threading.Event()
        self.db, self.map = hosts.call(
            host, lambda: open_map(url, name, timeout, **options), timeout=60
        )
        self.thread = threading.Thread(target=hosts.call, args=(host, self._write), daemon=True)
        self.thread.start()

    def _write(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            key = f"{self.prefix}{n}"
            began = time.monotonic()
            try:
                self.map.put_async(key, str(n)).result(self.timeout + 5)
            except (KafkaKVError, TimeoutError):
                self.unknown += 1
                continue
            finally:
                self.longest = max(self.longest, time.monotonic() - began)
            self.acked.append(key)
            time.sleep(0.02)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(self.timeout + 30)
        assert not self.thread.is_alive(), f"the witness in {self.host} did not stop"

    def state(self) -> dict[Any, Any]:
        """What this replica holds now, without a barrier (in its host)."""
        return self.hosts.call(self.host, lambda: dict(self.map.items()), timeout=30)

    def close(self) -> None:
        self.hosts.call(self.host, self.db.close, timeout=60)


def open_map(url: str, name: str, timeout: float, **options: Any) -> tuple[kafkakv.Database, Any]:
    """A database on ``url`` and its linearizable replica of map ``name``."""
    db = kafkakv.connect(url)
    try:
        return db, db.map(name, consistency="linearizable", timeout=timeout, **options)
    except BaseException:
        db.close()
        raise


def fresh_state(hosts: Hosts, url: str, name: str, timeout: float) -> dict[Any, Any]:
    """The state of a replica of ``name`` opened now in host ``ctl``, after a barrier."""

    def read() -> dict[Any, Any]:
        db, m = open_map(url, name, timeout)
        with db:
            m.sync(60)
            return dict(m.items())

    return hosts.call("ctl", read, timeout=120)
