"""A real Apache Kafka cluster (KRaft, combined broker+controller nodes) on 127.0.0.1, or with
each node on a simulated host of its own (a :class:`Placement`, such as
:meth:`kafkakv.dev.hosts.Hosts.placement`).

:class:`DevCluster` owns the broker processes; the files they use live in a state directory
laid out by :class:`~kafkakv.dev.storage.StateDir`.
"""

from __future__ import annotations

import enum
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, TypeVar

from kafkakv.dev.base import Cluster
from kafkakv.dev.errors import ClusterError
from kafkakv.dev.jars import (
    DEFAULT_KAFKA_VERSION,
    KafkaJars,
    Progress,
    default_cache_root,
    fetch_kafka,
    find_java,
)
from kafkakv.dev.layout import DEFAULT_JVM_OPTIONS, ClusterLayout, broker_command
from kafkakv.dev.lock import exclusive_lock
from kafkakv.dev.probe import admin_client, brokers_seen_by, port_is_free
from kafkakv.dev.process import BrokerProcess, log_tail
from kafkakv.dev.state import ClusterState
from kafkakv.dev.storage import StateDir
from kafkakv.dev.tls import make_certificate, tls_files
from kafkakv.errors import ConfigError

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

__all__ = ["ClusterStatus", "DevCluster", "NodeStatus", "Placement", "default_state_dir"]

_T = TypeVar("_T")

_POLL_S = 0.25
_PROBE_TIMEOUT_S = 2.0
_STOP_GRACE_S = 3.0


class ClusterStatus(enum.Enum):
    """Where a :class:`DevCluster` is in its life."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"


@dataclass(frozen=True)
class NodeStatus:
    """One node as :meth:`DevCluster.node_status` sees it."""

    node_id: int
    pid: int | None
    port: int
    running: bool
    """The broker process runs."""
    ready: bool
    """The broker answers on its port and is in the metadata it returns."""


class Placement(Protocol):
    """Where the nodes of a :class:`DevCluster` run, and where its own client calls (readiness
    probes, the admin client) run: hosts other than this one's loopback, such as network
    namespaces (:meth:`kafkakv.dev.hosts.Hosts.placement`)."""

    def address(self, node_id: int) -> str:
        """The IPv4 address node ``node_id`` listens on and advertises."""
        ...

    def command(self, node_id: int, argv: list[str]) -> list[str]:
        """``argv`` made to run where node ``node_id`` runs."""
        ...

    def call(self, node_id: int | None, fn: Callable[[], _T]) -> _T:
        """``fn()``, run where a socket reaches node ``node_id``'s own ports (to bind them, to
        connect to them); ``None``: where the cluster's clients run. Clients made by ``fn``
        keep working from any thread."""
        ...


def default_state_dir() -> Path:
    """``${KAFKAKV_CACHE:-~/.cache/kafkakv}/dev-cluster``."""
    return default_cache_root() / "dev-cluster"


class DevCluster(Cluster):
    """``brokers`` combined KRaft nodes started from Maven Central jars, for tests and by hand.

    Node ``i`` (``1 .. brokers``) serves clients on ``127.0.0.1:base_port + (i-1)*10000`` and
    its controller one port above. Nothing runs until :meth:`start`; ``with DevCluster() as c``
    starts it and stops it on the way out. ``sasl_users`` (user name → password) adds a
    SASL/PLAIN listener two ports above each client port (:attr:`sasl_bootstrap`), and
    ``tls=True`` a TLS listener three ports above (:attr:`tls_bootstrap`, with a self-signed
    certificate made once in the state directory, :attr:`tls_ca_location`): for trying a
    client's security settings against a real broker.

    ``placement`` puts each node on a host of its own (its address, a command that runs the
    broker there) and runs the cluster's own probes and admin client where they reach those
    hosts; without it, every node runs here on 127.0.0.1.

    ``die_with_parent`` (the default, for tests) makes the kernel kill every broker when the
    thread that started it exits; leave it on only when that thread lives as long as the
    cluster should (the main thread). The ``kafkakv dev-cluster start`` command turns it off so
    its brokers outlive it.

    >>> DevCluster(brokers=3, base_port=19092).bootstrap
    '127.0.0.1:19092,127.0.0.1:29092,127.0.0.1:39092'
    """

    def __init__(
        self,
        brokers: int = 3,
        base_port: int = 19092,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        kafka_version: str = DEFAULT_KAFKA_VERSION,
        cache_root: Path | None = None,
        die_with_parent: bool = True,
        jvm_options: Iterable[str] = DEFAULT_JVM_OPTIONS,
        start_timeout: float = 90.0,
        progress: Progress | None = None,
        sasl_users: Mapping[str, str] | None = None,
        tls: bool = False,
        placement: Placement | None = None,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self._tls_dir = self.state_dir / "tls" if tls else None
        keystore = "" if self._tls_dir is None else str(tls_files(self._tls_dir).keystore)
        self._placement = placement
        hosts = () if placement is None else tuple(map(placement.address, range(1, brokers + 1)))
        self.layout = ClusterLayout(
            brokers, base_port, tuple(sorted((sasl_users or {}).items())), keystore, hosts
        )
        self.files = StateDir(self.state_dir, self.layout)
        self.kafka_version = kafka_version
        self.start_timeout = start_timeout
        self._cache_root = cache_root
        self._die_with_parent = die_with_parent
        self._jvm_options = tuple(jvm_options)
        self._progress = progress
        self._nodes: dict[int, BrokerProcess] = {}
        self._jars: KafkaJars | None = None
        self._java: str | None = None
        self._state: ClusterState | None = None
        self._status = ClusterStatus.NEW

    # -- what it is -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``host:port`` of every node (``127.0.0.1:<port>`` without a placement),
        comma-separated."""
        return self.layout.bootstrap

    def admin(self) -> AdminClient:
        """An admin client for :attr:`bootstrap`, made on first use (where the placement's
        clients run) and kept."""
        if self._admin is None:
            self._admin = self._net(None, lambda: admin_client(self.bootstrap))
        return self._admin

    @property
    def sasl_bootstrap(self) -> str | None:
        """``host:port`` of every node's SASL/PLAIN listener; None without ``sasl_users``."""
        return self.layout.sasl_bootstrap

    @property
    def tls_bootstrap(self) -> str | None:
        """``host:port`` of every node's TLS listener; None without ``tls``."""
        return self.layout.tls_bootstrap

    @property
    def tls_ca_location(self) -> str | None:
        """The PEM certificate TLS clients trust (``ssl.ca.location``); None without ``tls``.
        It exists once :meth:`start` has run."""
        if self._tls_dir is None:
            return None
        return str(tls_files(self._tls_dir).ca_location)

    @property
    def status(self) -> ClusterStatus:
        """NEW, STARTING, RUNNING or STOPPED."""
        return self._status

    @property
    def node_ids(self) -> range:
        """``1 .. brokers``."""
        return self.layout.node_ids

    @property
    def cluster_id(self) -> str | None:
        """The KRaft cluster id the storage was formatted with; ``None`` before :meth:`start`."""
        return None if self._state is None else self._state.cluster_id

    @property
    def jars(self) -> KafkaJars:
        """The cached Kafka jars (fetched on first use; see :func:`fetch_kafka`)."""
        if self._jars is None:
            self._jars = fetch_kafka(self.kafka_version, self._cache_root, progress=self._progress)
        return self._jars

    def log_path(self, node_id: int) -> Path:
        """Broker ``node_id``'s log4j file, ``<state dir>/node-<i>/logs/server.log``."""
        self._check_id(node_id)
        return self.files.log_path(node_id)

    def output_path(self, node_id: int) -> Path:
        """The file receiving broker ``node_id``'s JVM stdout and stderr."""
        self._check_id(node_id)
        return self.files.output_path(node_id)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> Self:
        """Fetch the jars if needed, format storage once, start every broker, wait until ready.

        Ready means every broker answers on its port and all ``brokers`` node ids are in the
        metadata it returns (a broker is listed only once the controller quorum has a leader
        and has registered it). Takes 5-10 s with cached jars on 2 cores, plus the Maven run
        the first time. Raises :class:`~kafkakv.dev.errors.ClusterError` when a cluster from
        the same state directory runs, a port is in use, a broker exits (naming the node and
        showing its log's tail) or ``timeout`` (default ``start_timeout``) passes; every broker
        this call started is stopped before it raises.
        """
        if self._status in (ClusterStatus.STARTING, ClusterStatus.RUNNING):
            raise ClusterError(
                f"the dev cluster in {self.state_dir} is already {self._status.value}"
            )
        self._status = ClusterStatus.STARTING
        budget = self.start_timeout if timeout is None else timeout
        try:
            self.files.make()
            busy = ClusterError(f"another process is starting a dev cluster from {self.state_dir}")
            with exclusive_lock(self.state_dir / ".lock", 0, busy):
                self._prepare()
                deadline = time.monotonic() + budget
                for node_id in self.node_ids:
                    self._launch(node_id)
                self._wait_ready(self.node_ids, set(self.node_ids), deadline, budget)
        except BaseException:
            self._stop_all(grace=2.0)
            self._status = ClusterStatus.STOPPED
            raise
        self._status = ClusterStatus.RUNNING
        return self

    def stop(self, grace: float = _STOP_GRACE_S) -> None:
        """Stop every broker and return when all are gone (about 3.5 s for three).

        Brokers get SIGTERM one at a time while a majority of the voters runs, so they shut
        down cleanly; the rest (which no longer reach a quorum) get SIGTERM, then SIGKILL after
        ``grace`` seconds. Idempotent; never raises for a broker that already exited."""
        self._stop_all(grace)
        if self._status is not ClusterStatus.NEW:
            self._status = ClusterStatus.STOPPED

    def close(self) -> None:
        """The same as :meth:`stop`."""
        self.stop()

    def __enter__(self) -> Self:
        if self._status in (ClusterStatus.NEW, ClusterStatus.STOPPED):
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @classmethod
    def attach(cls, state_dir: str | os.PathLike[str]) -> DevCluster:
        """The cluster recorded in ``state_dir``, adopting the brokers that still run there.

        Lets another process (``kafkakv dev-cluster status``/``stop``) inspect and stop a
        cluster. Reads the state file and ``/proc``; no network. Its status is RUNNING when a
        broker runs, else STOPPED. Raises :class:`~kafkakv.dev.errors.ClusterError` when the
        directory holds no cluster.
        """
        path = Path(state_dir)
        state = ClusterState.load(path)
        if state is None:
            raise ClusterError(f"no dev cluster in {path} (no state file)")
        cluster = cls(
            state.brokers,
            state.base_port,
            path,
            kafka_version=state.kafka_version,
            die_with_parent=False,
        )
        cluster._state = state
        for node_id, pid in state.pids.items():
            process = BrokerProcess(pid, cluster.files.config_path(node_id))
            if node_id in cluster.node_ids and process.alive():
                cluster._nodes[node_id] = process
        running = bool(cluster._nodes)
        cluster._status = ClusterStatus.RUNNING if running else ClusterStatus.STOPPED
        return cluster

    # -- faults -----------------------------------------------------------------------------

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to broker ``node_id`` (default SIGKILL: a crash, no clean shutdown).

        With SIGKILL, returns once the process is gone. Raises
        :class:`~kafkakv.dev.errors.ClusterError` when the broker is not running.
        """
        process = self._running(node_id)
        process.signal(sig)
        if sig == signal.SIGKILL:
            process.wait_gone(10.0)
            self._forget(node_id)

    def stop_node(self, node_id: int, timeout: float = 30.0) -> None:
        """Stop broker ``node_id`` gracefully: SIGTERM (controlled shutdown), SIGKILL after
        ``timeout`` seconds. Nothing happens when it is not running."""
        self._check_id(node_id)
        process = self._nodes.get(node_id)
        if process is not None:
            process.terminate(timeout)
            self._forget(node_id)

    def start_node(self, node_id: int, timeout: float | None = None) -> None:
        """Start broker ``node_id`` again on its existing data and wait until it answers and is
        in the metadata again (default timeout ``start_timeout``).

        Raises :class:`~kafkakv.dev.errors.ClusterError` when the cluster is not started, the node
        already runs, or it does not come back (its log's tail in the message).
        """
        if self._status is not ClusterStatus.RUNNING:
            raise ClusterError(f"start_node({node_id}): the cluster is {self._status.value}")
        if self.is_running(node_id):
            raise ClusterError(
                f"node {node_id} is already running (pid {self._nodes[node_id].pid})"
            )
        budget = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        self._wait_ports_free(node_id, deadline)
        self._launch(node_id)
        try:
            self._wait_ready([node_id], {node_id}, deadline, budget)
        except BaseException:
            self.stop_node(node_id, timeout=2.0)
            raise

    def is_running(self, node_id: int) -> bool:
        """Whether broker ``node_id``'s process runs (``/proc`` or ``waitpid``; no network)."""
        self._check_id(node_id)
        process = self._nodes.get(node_id)
        return process is not None and process.alive()

    def pid(self, node_id: int) -> int | None:
        """The pid of broker ``node_id`` while it runs, else ``None``."""
        return self._nodes[node_id].pid if self.is_running(node_id) else None

    def node_status(self) -> list[NodeStatus]:
        """Pid, port and running/ready of every node; one metadata probe per running node."""
        rows = []
        for node_id in self.node_ids:
            process = self._nodes.get(node_id)
            running = process is not None and process.alive()
            port = self.layout.client_port(node_id)
            address = self.layout.address(node_id)
            seen = self._net(None, partial(brokers_seen_by, address, port)) if running else None
            pid = process.pid if process is not None and running else None
            rows.append(
                NodeStatus(node_id, pid, port, running, seen is not None and node_id in seen)
            )
        return rows

    # -- the steps of start -----------------------------------------------------------------

    def _prepare(self) -> None:
        """Everything before the first broker starts: tools, state, ports, configs, storage."""
        self._java = find_java()
        jars = self.jars
        if self._tls_dir is not None:
            make_certificate(self._java, self._tls_dir)
        self._state = self.files.claim(self.kafka_version)
        busy = [
            f"{self.layout.host(i)}:{p}"
            for i in self.node_ids
            for p in self.layout.node_ports(i)
            if not self._port_free(i, p)
        ]
        if busy:
            raise ClusterError(
                f"{', '.join(busy)} already in use (another dev cluster or program?); choose "
                "another base port"
            )
        self.files.write_configs()
        self.files.format(self._java, jars, self._state.cluster_id, self._progress)

    def _launch(self, node_id: int) -> None:
        """Spawn broker ``node_id`` and record its pid in the state file."""
        self._say(f"starting node {node_id} on {self.layout.address(node_id)} ...")
        command = broker_command(
            self._java_path(),
            self.jars.classpath,
            str(self.files.config_path(node_id)),
            str(self.files.logs_dir(node_id)),
            str(self.files.log4j_config),
            self._jvm_options,
        )
        if self._placement is not None:
            command = self._placement.command(node_id, command)
        self._nodes[node_id] = BrokerProcess.start(
            command,
            self.files.output_path(node_id),
            self.files.config_path(node_id),
            die_with_parent=self._die_with_parent,
        )
        self._record_pids()

    def _wait_ready(
        self, node_ids: Iterable[int], must_see: set[int], deadline: float, budget: float
    ) -> None:
        """Wait until each of ``node_ids`` answers with ``must_see`` in its metadata."""
        pending = list(node_ids)
        seen: dict[int, set[int] | None] = {}
        while pending:
            for node_id in list(pending):
                if not self._nodes[node_id].alive():
                    raise self._died(node_id)
                address, port = self.layout.address(node_id), self.layout.client_port(node_id)
                seen[node_id] = self._net(
                    None, partial(brokers_seen_by, address, port, _PROBE_TIMEOUT_S)
                )
                found = seen[node_id]
                if found is not None and must_see <= found:
                    pending.remove(node_id)
            if pending and time.monotonic() >= deadline:
                raise self._not_ready(pending, seen, budget)
            if pending:
                time.sleep(_POLL_S)

    def _died(self, node_id: int) -> ClusterError:
        process = self._nodes[node_id]
        code = process.exit_code()
        self._forget(node_id)
        return ClusterError(
            f"broker node {node_id} (pid {process.pid}) exited with status {code} while "
            f"starting.\n{self._tails(node_id)}"
        )

    def _not_ready(
        self, pending: list[int], seen: dict[int, set[int] | None], budget: float
    ) -> ClusterError:
        views = "; ".join(
            f"node {i} "
            + ("does not answer" if seen.get(i) is None else f"sees {sorted(seen[i] or ())}")
            for i in pending
        )
        tails = "\n".join(self._tails(i) for i in pending)
        return ClusterError(
            f"broker node(s) {', '.join(map(str, pending))} not ready after {budget:.0f} s "
            f"({views}).\n{tails}"
        )

    def _tails(self, node_id: int) -> str:
        """The last lines of node ``node_id``'s server log and of its JVM output."""
        parts = []
        for path in (self.files.log_path(node_id), self.files.output_path(node_id)):
            text = log_tail(path, 20)
            if text:
                parts.append(f"--- last lines of {path} ---\n{text}")
        return "\n".join(parts) or f"(node {node_id} wrote no log)"

    # -- small helpers ----------------------------------------------------------------------

    def _stop_all(self, grace: float) -> None:
        """Stop every broker, highest node id first.

        A node shuts down cleanly only while a majority of the voters runs (its controlled
        shutdown asks the controller quorum), so nodes are stopped one by one while that
        holds; the rest get SIGTERM together and SIGKILL after ``grace`` seconds.
        """
        majority = self.layout.brokers // 2 + 1
        order = sorted(self._nodes, reverse=True)
        lingering = []
        for node_id in order:
            process = self._nodes[node_id]
            if not process.alive():
                continue
            running = sum(1 for p in self._nodes.values() if p.alive())
            if running >= majority:
                process.signal(signal.SIGTERM)
                if process.wait_gone(grace):
                    continue
            lingering.append(process)
        for process in lingering:
            process.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in lingering:
            if not process.wait_gone(max(0.0, deadline - time.monotonic())):
                process.signal(signal.SIGKILL)
        for process in lingering:
            process.wait_gone(10.0)
        self._nodes.clear()
        self._admin = None
        if order:
            self._record_pids()

    def _wait_ports_free(self, node_id: int, deadline: float) -> None:
        ports = self.layout.node_ports(node_id)
        while not all(self._port_free(node_id, p) for p in ports):
            if time.monotonic() >= deadline:
                raise ClusterError(f"node {node_id}'s ports {ports} are still in use")
            time.sleep(_POLL_S)

    def _net(self, node_id: int | None, fn: Callable[[], _T]) -> _T:
        """``fn()`` where it reaches node ``node_id`` (None: the cluster's clients) run."""
        return fn() if self._placement is None else self._placement.call(node_id, fn)

    def _port_free(self, node_id: int, port: int) -> bool:
        host = self.layout.host(node_id)
        return self._net(node_id, lambda: port_is_free(port, host))

    def _running(self, node_id: int) -> BrokerProcess:
        self._check_id(node_id)
        process = self._nodes.get(node_id)
        if process is None or not process.alive():
            raise ClusterError(f"node {node_id} is not running")
        return process

    def _forget(self, node_id: int) -> None:
        process = self._nodes.get(node_id)
        if process is not None and not process.alive():
            del self._nodes[node_id]
            self._record_pids()

    def _record_pids(self) -> None:
        if self._state is None:
            return
        self._state.pids = {i: p.pid for i, p in sorted(self._nodes.items())}
        if self.state_dir.is_dir():
            self._state.save(self.state_dir)

    def _java_path(self) -> str:
        if self._java is None:
            self._java = find_java()
        return self._java

    def _check_id(self, node_id: int) -> None:
        if node_id not in self.layout.node_ids:
            raise ConfigError(f"no node {node_id}: node ids are 1 .. {self.layout.brokers}")

    def _say(self, message: str) -> None:
        if self._progress is not None:
            self._progress(message)
