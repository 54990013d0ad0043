"""One Kafka cluster for every xdist worker: started by the controller when a worker first asks.

Most Kafka tests only create topics of their own and read and write them, so any number of
them can share one cluster, at the same time, from any worker. Before this, each worker that
ran one started a 3-broker cluster of its own, and all of them had to run on one worker (a
group) so that only one was started: the largest group then set the length of the run.

The controller (the pytest process that runs no test) owns the shared cluster, so that it
lives until every worker is done with it:

- at configure, it makes a folder and starts :class:`SharedCluster`, a thread that waits for
  a request there (a file, :data:`WANT`); each worker is told the folder;
- a worker's ``kafka_cluster`` fixture calls :func:`attach`: it writes the request and waits
  for the answer, :data:`READY`: the cluster's bootstrap, or why it could not start (the test
  then fails saying so);
- at unconfigure, the controller stops the cluster; its brokers die with the controller even
  when it is killed (``PR_SET_PDEATHSIG``, :mod:`kafkakv.dev.process`).

A run that needs no Kafka starts none. Tests that stop, kill or pause brokers do not use this
cluster: they take ``kafka_faults``, a cluster of their worker's own
(:mod:`tests.kafka_cluster`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from kafkakv.dev import DevCluster
from kafkakv.errors import KafkaKVError

__all__ = ["READY", "WANT", "SharedCluster", "attach"]

WANT = "kafka-cluster.want"
"""The file a worker writes to ask for the shared cluster."""

READY = "kafka-cluster.json"
"""The controller's answer: ``{"bootstrap": ...}`` or ``{"error": ...}``."""

_POLL_S = 0.2


class SharedCluster:
    """The controller's side: a thread that starts a 3-broker cluster on ``base_port`` in
    ``folder`` once a worker asks for it (see the module doc); :meth:`close` stops both."""

    def __init__(self, folder: Path, base_port: int) -> None:
        self._folder = folder
        self._base_port = base_port
        self._closed = threading.Event()
        self._cluster: DevCluster | None = None
        self._thread = threading.Thread(target=self._serve, name="kafkakv-shared-cluster")
        self._thread.daemon = True
        self._thread.start()

    def _serve(self) -> None:
        want = self._folder / WANT
        while not want.exists():
            if self._closed.wait(_POLL_S):
                return
        try:
            cluster = DevCluster(3, self._base_port, self._folder / "kafka-cluster")
            self._cluster = cluster
            cluster.start()
            answer = {"bootstrap": cluster.bootstrap}
        except (KafkaKVError, ValueError, OSError) as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        _write(self._folder / READY, answer)

    def close(self) -> None:
        """Stop the thread and the cluster, if it was started."""
        self._closed.set()
        self._thread.join(timeout=600)
        if self._cluster is not None:
            self._cluster.stop()


def attach(folder: Path, timeout: float) -> str:
    """The worker's side: ask the controller for the shared cluster in ``folder`` and return
    its bootstrap. Raises ``RuntimeError`` with the controller's reason when it could not start
    one, and ``TimeoutError`` when no answer came within ``timeout`` seconds."""
    ready = folder / READY
    if not ready.exists():
        _write(folder / WANT, {"pid": os.getpid()})
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the controller started no Kafka cluster within {timeout:.0f} s")
        time.sleep(_POLL_S)
    answer = json.loads(ready.read_text(encoding="utf-8"))
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return str(answer["bootstrap"])


def _write(path: Path, content: Mapping[str, object]) -> None:
    """Write ``content`` to ``path`` whole: a reader sees all of it or no file."""
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    partial.write_text(json.dumps(content), encoding="utf-8")
    os.replace(partial, path)
