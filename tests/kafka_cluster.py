"""Pytest plugin: real Kafka clusters for the tests that need one (registered in conftest.py).

Fixtures, both session-scoped and started on first use (so a run without Kafka tests starts
nothing), stopped at the end of the session whatever the tests did:

- ``kafka_cluster``: 3 brokers, bootstrap ``127.0.0.1:11092,127.0.0.1:21092,127.0.0.1:31092``
  (replication factor 3, min.insync.replicas 2 by default).
- ``kafka_faults``: 3 brokers for the tests that stop, kill or pause them: ``kafka_cluster``
  itself in a plain run; on an xdist worker, where ``kafka_cluster`` is one cluster that every
  worker shares at once (:mod:`tests.shared_cluster`), a cluster of the worker's own.
- ``kafka_single``: 1 broker on ``127.0.0.1:15092``, which also takes SASL/PLAIN clients
  (``SASL_USER`` / ``SASL_PASSWORD``) on ``127.0.0.1:15094`` (``sasl_bootstrap``) and TLS
  clients on ``127.0.0.1:15095`` (``tls_bootstrap``, trusting ``tls_ca_location``).

Every port (controllers one above) lies below 32768, out of Linux's ephemeral range: a client
connection never holds one as its local port when a broker (re)starts, in the fault tests
above all, where librdkafka keeps reconnecting to a killed broker's port.

Both are :class:`kafkakv.dev.Cluster` objects: ``bootstrap``, ``leader``,
``wait_leader``, ``wait_in_sync``, and the fault calls ``kill``, ``stop_node``, ``start_node``,
``is_running``. Their brokers get ``PR_SET_PDEATHSIG``: they die with pytest even when it is
killed with SIGKILL. A cluster that cannot start FAILS the tests that use it (never skips).

``KAFKAKV_TEST_PORT_OFFSET=N`` adds N to both base ports, for a second test session running
on the same machine at the same time (the default ports would be taken by the first). An
xdist worker adds its own share on top (:func:`port_offset`).

With ``KAFKAKV_TEST_BOOTSTRAP=host:port,...`` both fixtures are that external cluster
instead; the fault calls then raise :class:`kafkakv.dev.errors.ClusterError`, failing the tests
that need them with a message that says why.

Simulated hosts (:mod:`kafkakv.dev.hosts`, as root), both session-scoped and made on first use:

- ``host_network``: hosts ``b1``, ``b2``, ``b3`` (brokers), ``c1``, ``c2`` (clients) and
  ``ctl`` (where the test's own admin client runs), each a network namespace on one bridge
  (10.213.0.11 ...), removed at the end of the session, or by the next run if this one is
  killed.
- ``hosts_cluster``: three brokers, node ``i`` on host ``b<i>`` (:func:`broker_host`; ports
  as ``kafka_cluster``'s, on each host's address); its admin client and probes run in
  ``ctl``.

Hosts that cannot be made (not root, ``ip`` or ``iptables`` missing) FAIL the tests that use
them, saying why.

Every test that uses one of the Kafka fixtures gets the ``kafka`` marker (``-m "not kafka"``
skips them all).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping

import pytest
from confluent_kafka.admin import NewTopic

from kafkakv.dev import Cluster, DevCluster, ExternalCluster
from kafkakv.dev.hosts import Hosts
from kafkakv.errors import KafkaKVError
from tests.parallel import (
    EXTERNAL_ENV,
    PORT_OFFSET_ENV,
    WORKER_PORT_STEP,
    release_after_last_use,
    shared_folder,
    worker_index,
)
from tests.shared_cluster import attach

__all__ = [
    "HOST_NAMES",
    "SASL_PASSWORD",
    "SASL_USER",
    "broker_host",
    "create_topic",
    "host_network",
    "hosts_cluster",
    "kafka_cluster",
    "kafka_faults",
    "kafka_single",
    "port_offset",
    "unique_topic",
]

SASL_USER, SASL_PASSWORD = "kafkakv-test", "test-secret-17"
"""The one user of ``kafka_single``'s SASL/PLAIN listener."""

_FIXTURES = frozenset({"kafka_cluster", "kafka_faults", "kafka_single", "hosts_cluster"})
_SHARED_START_S = 300.0
"""How long a worker waits for the controller's shared cluster: the first run fetches its
jars with Maven."""

HOST_NAMES = ("b1", "b2", "b3", "c1", "c2", "ctl")
"""The hosts of ``host_network``: three for brokers, two for clients, one for the test."""


def port_offset(config: pytest.Config) -> int:
    """What this session adds to the base ports: ``$KAFKAKV_TEST_PORT_OFFSET``, plus
    :data:`~tests.parallel.WORKER_PORT_STEP` times the index of the xdist worker it is."""
    return int(os.environ.get(PORT_OFFSET_ENV) or 0) + WORKER_PORT_STEP * worker_index(config)


def _cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    brokers: int,
    base_port: int,
    sasl_users: Mapping[str, str] | None = None,
    tls: bool = False,
) -> Cluster:
    bootstrap = os.environ.get(EXTERNAL_ENV)
    if bootstrap:
        return ExternalCluster(bootstrap)
    try:
        base_port += port_offset(request.config)
        cluster = DevCluster(
            brokers, base_port, tmp_path_factory.mktemp(name), sasl_users=sasl_users, tls=tls
        )
    except (KafkaKVError, ValueError) as exc:
        pytest.fail(f"the {name} Kafka cluster cannot be set up: {exc}", pytrace=False)
    request.addfinalizer(cluster.stop)  # before start: a half-started cluster is stopped too
    release_after_last_use(request, cluster.stop)
    try:
        cluster.start()
    except KafkaKVError as exc:
        pytest.fail(f"the {name} Kafka cluster did not start: {exc}", pytrace=False)
    return cluster


@pytest.fixture(scope="session")
def kafka_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Cluster:
    """Three brokers on 127.0.0.1:11092/21092/31092 for the whole session. On an xdist
    worker: the one cluster every worker shares (:mod:`tests.shared_cluster`), which takes no
    fault calls; a test that stops, kills or pauses brokers takes ``kafka_faults``."""
    folder = shared_folder(request.config)
    if folder is None or os.environ.get(EXTERNAL_ENV):
        return _cluster(request, tmp_path_factory, "kafka-cluster", brokers=3, base_port=11092)
    try:
        bootstrap = attach(folder, timeout=_SHARED_START_S)
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"the shared kafka-cluster Kafka cluster did not start: {exc}", pytrace=False)
    return ExternalCluster(bootstrap)


@pytest.fixture(scope="session")
def kafka_faults(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Cluster:
    """Three brokers that the test may stop, kill and pause (and must bring back): outside
    xdist ``kafka_cluster`` itself; on an xdist worker, a cluster of that worker's own, on its
    ports, so that no other worker's tests see the faults."""
    if shared_folder(request.config) is None or os.environ.get(EXTERNAL_ENV):
        cluster: Cluster = request.getfixturevalue("kafka_cluster")
        return cluster
    return _cluster(request, tmp_path_factory, "kafka-faults", brokers=3, base_port=11092)


@pytest.fixture(scope="session")
def kafka_single(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Cluster:
    """One broker on 127.0.0.1:15092 (SASL/PLAIN on 15094, TLS on 15095) for the session."""
    return _cluster(
        request,
        tmp_path_factory,
        "kafka-single",
        brokers=1,
        base_port=15092,
        sasl_users={SASL_USER: SASL_PASSWORD},
        tls=True,
    )


@pytest.fixture(scope="session")
def host_network(request: pytest.FixtureRequest) -> Hosts:
    """The simulated hosts :data:`HOST_NAMES` for the whole session (see the module doc)."""
    hosts = Hosts(HOST_NAMES)
    request.addfinalizer(hosts.close)
    release_after_last_use(request, hosts.close)
    try:
        hosts.start()
    except KafkaKVError as exc:
        pytest.fail(f"the simulated hosts could not be made: {exc}", pytrace=False)
    return hosts


def broker_host(node_id: int) -> str:
    """The host of ``hosts_cluster``'s node ``node_id``."""
    return f"b{node_id}"


@pytest.fixture(scope="session")
def hosts_cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    host_network: Hosts,
) -> DevCluster:
    """Three brokers on hosts b1, b2, b3 for the whole session (see the module doc)."""
    placement = host_network.placement([broker_host(i) for i in (1, 2, 3)], clients="ctl")
    state = tmp_path_factory.mktemp("hosts-cluster")
    try:
        cluster = DevCluster(3, 11092, state, placement=placement)
    except (KafkaKVError, ValueError) as exc:
        pytest.fail(f"the Kafka cluster on hosts cannot be set up: {exc}", pytrace=False)
    request.addfinalizer(cluster.stop)
    release_after_last_use(request, cluster.stop)
    try:
        cluster.start()
    except KafkaKVError as exc:
        pytest.fail(f"the Kafka cluster on hosts did not start: {exc}", pytrace=False)
    return cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a Kafka fixture with ``kafka``."""
    for item in items:
        if _FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)


def unique_topic(prefix: str = "t") -> str:
    """A topic name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topic(
    cluster: Cluster,
    topic: str,
    partitions: int = 1,
    replication: int = -1,
    config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create ``topic`` and wait until every partition has a leader and its full ISR.

    ``replication=-1`` takes the broker default (3 on ``kafka_cluster``, 1 on
    ``kafka_single``).
    """
    new = NewTopic(topic, partitions, replication, config=dict(config or {}))
    futures = cluster.admin().create_topics([new], operation_timeout=timeout)
    futures[topic].result(timeout)
    cluster.wait_in_sync(topic, timeout)
