"""Where every node of a dev cluster listens and how it is configured: pure values, no I/O.

Node ``i`` (ids ``1 .. brokers``) is a combined KRaft node (``process.roles=broker,controller``)
whose client listener is ``base_port + (i - 1) * 10000`` and whose controller listener is the
next port, both on 127.0.0.1 only, unless ``hosts`` gives each node an address of its own (a
simulated host: :mod:`kafkakv.dev.hosts`). With ``sasl_users``, each node also takes SASL/PLAIN
clients (``security.protocol=SASL_PLAINTEXT``) on the port after that, for those users; with
``tls_keystore``, TLS clients (``security.protocol=SSL``) on the port after that one.

>>> layout = ClusterLayout(brokers=3, base_port=19092)
>>> layout.bootstrap
'127.0.0.1:19092,127.0.0.1:29092,127.0.0.1:39092'
>>> layout.voters
'1@127.0.0.1:19093,2@127.0.0.1:29093,3@127.0.0.1:39093'
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kafkakv.errors import ConfigError

__all__ = [
    "DEFAULT_JVM_OPTIONS",
    "HOST",
    "NODE_PORT_STEP",
    "TLS_STORE_PASSWORD",
    "TRANSACTION_CLEANUP_INTERVAL_MS",
    "ClusterLayout",
    "broker_command",
    "format_command",
    "new_cluster_id",
    "render_properties",
]

HOST = "127.0.0.1"
"""Every listener binds to this address only, unless the layout has ``hosts``."""

NODE_PORT_STEP = 10000
"""Node ``i`` listens on ``base_port + (i - 1) * NODE_PORT_STEP``."""

DEFAULT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xms256m",
    "-Xmx768m",
    # One-core-friendly collector and no C2 compiler: a broker is up in seconds on 2 cores.
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)
"""JVM flags of every broker: a small heap and flags that make startup fast."""

_FORMAT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
)

_MAX_PORT = 65535

TRANSACTION_CLEANUP_INTERVAL_MS = 500
"""``transaction.abort.timed.out.transaction.cleanup.interval.ms``: how often the brokers look
for transactions open past their ``transaction.timeout.ms`` and abort them (Kafka's default:
10 s). A writer killed mid-transaction holds ``read_committed`` readers of its partitions for
its transaction timeout (kafkakv's default 8 s) plus up to this long, plus the abort markers'
write: within the 10 s docs/kafka.md promises, where Kafka's default gave 10 to 20 s."""

TLS_STORE_PASSWORD = "kafkakv-dev-cluster"
"""The password of a dev cluster's keystore: a throwaway certificate for 127.0.0.1 only."""

_JAAS_SAFE = re.compile(r"[A-Za-z0-9._-]+")
"""What a SASL user name or password may hold: nothing that needs quoting in a JAAS line."""


@dataclass(frozen=True)
class ClusterLayout:
    """The ports and settings of a cluster of ``brokers`` combined KRaft nodes.

    Raises :class:`~kafkakv.errors.ConfigError` when ``brokers`` is below 1 or a node's ports
    fall outside 1024 .. 65535.
    """

    brokers: int = 3
    base_port: int = 19092
    sasl_users: tuple[tuple[str, str], ...] = ()
    """``(user, password)`` pairs a SASL/PLAIN listener accepts; none: no such listener."""
    tls_keystore: str = ""
    """A PKCS12 keystore (password :data:`TLS_STORE_PASSWORD`) holding the key and certificate
    of a TLS listener; empty: no such listener."""
    hosts: tuple[str, ...] = ()
    """The IPv4 address of each node (node ``i`` at ``hosts[i - 1]``), where it listens and
    what it advertises; empty: every node on :data:`HOST`."""

    def __post_init__(self) -> None:
        if self.brokers < 1:
            raise ConfigError(f"a dev cluster needs at least 1 broker, not {self.brokers}")
        for user, password in self.sasl_users:
            if not _JAAS_SAFE.fullmatch(user) or not _JAAS_SAFE.fullmatch(password):
                raise ConfigError(
                    f"SASL user {user!r}: user names and passwords of the dev cluster are "
                    "letters, digits and -._ only"
                )
        if self.hosts and len(self.hosts) != self.brokers:
            raise ConfigError(
                f"{len(self.hosts)} host address(es) for {self.brokers} broker(s): give one each"
            )
        highest = self.ports[-1]
        if self.base_port < 1024 or highest > _MAX_PORT:
            raise ConfigError(
                f"base port {self.base_port} with {self.brokers} broker(s) needs ports "
                f"{self.base_port} .. {highest}; they must lie in 1024 .. {_MAX_PORT}"
            )

    @property
    def node_ids(self) -> range:
        """The node ids, ``1 .. brokers``."""
        return range(1, self.brokers + 1)

    def client_port(self, node_id: int) -> int:
        """The port node ``node_id`` serves clients on."""
        return self.base_port + (node_id - 1) * NODE_PORT_STEP

    def controller_port(self, node_id: int) -> int:
        """The port of node ``node_id``'s KRaft controller listener (client port + 1)."""
        return self.client_port(node_id) + 1

    def sasl_port(self, node_id: int) -> int:
        """The port of node ``node_id``'s SASL/PLAIN listener (client port + 2), whether or
        not the layout has one."""
        return self.client_port(node_id) + 2

    def tls_port(self, node_id: int) -> int:
        """The port of node ``node_id``'s TLS listener (client port + 3), whether or not the
        layout has one."""
        return self.client_port(node_id) + 3

    def host(self, node_id: int) -> str:
        """The address node ``node_id`` listens on: its entry of ``hosts``, else :data:`HOST`.

        >>> layout = ClusterLayout(2, 19092, hosts=("10.0.0.1", "10.0.0.2"))
        >>> layout.host(2), layout.bootstrap
        ('10.0.0.2', '10.0.0.1:19092,10.0.0.2:29092')
        """
        return self.hosts[node_id - 1] if self.hosts else HOST

    def address(self, node_id: int) -> str:
        """``host:port`` of node ``node_id``'s client listener."""
        return f"{self.host(node_id)}:{self.client_port(node_id)}"

    @property
    def sasl_bootstrap(self) -> str | None:
        """``bootstrap.servers`` of the SASL/PLAIN listeners; None without ``sasl_users``.

        >>> ClusterLayout(1, 19092, sasl_users=(("app", "s3cret"),)).sasl_bootstrap
        '127.0.0.1:19094'
        """
        if not self.sasl_users:
            return None
        return ",".join(f"{self.host(i)}:{self.sasl_port(i)}" for i in self.node_ids)

    @property
    def tls_bootstrap(self) -> str | None:
        """``bootstrap.servers`` of the TLS listeners; None without ``tls_keystore``."""
        if not self.tls_keystore:
            return None
        return ",".join(f"{self.host(i)}:{self.tls_port(i)}" for i in self.node_ids)

    def node_ports(self, node_id: int) -> list[int]:
        """The ports node ``node_id`` binds: client, controller, and SASL and TLS if any."""
        ports = [self.client_port(node_id), self.controller_port(node_id)]
        if self.sasl_users:
            ports.append(self.sasl_port(node_id))
        if self.tls_keystore:
            ports.append(self.tls_port(node_id))
        return ports

    @property
    def ports(self) -> list[int]:
        """Every port the cluster binds, node by node."""
        return [p for i in self.node_ids for p in self.node_ports(i)]

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: every node's client address."""
        return ",".join(self.address(i) for i in self.node_ids)

    @property
    def voters(self) -> str:
        """``controller.quorum.voters``: every node is a voter of the static quorum."""
        return ",".join(f"{i}@{self.host(i)}:{self.controller_port(i)}" for i in self.node_ids)

    @property
    def replication_factor(self) -> int:
        """Replicas of new topics and of the internal topics: ``min(3, brokers)``."""
        return min(3, self.brokers)

    @property
    def min_insync(self) -> int:
        """``min.insync.replicas`` (and the transaction log's min ISR): ``min(2, brokers)``."""
        return min(2, self.brokers)

    def broker_config(self, node_id: int, data_dir: str) -> dict[str, str]:
        """The ``server.properties`` of node ``node_id``, storing its data in ``data_dir``.

        >>> config = ClusterLayout(brokers=1).broker_config(1, "/tmp/d")
        >>> config["default.replication.factor"], config["min.insync.replicas"]
        ('1', '1')
        """
        if node_id not in self.node_ids:
            raise ConfigError(f"node {node_id} is not in 1 .. {self.brokers}")
        if "," in data_dir:
            raise ConfigError(f"a data directory with a comma cannot be a log.dirs: {data_dir!r}")
        port, host = self.client_port(node_id), self.host(node_id)
        rf, isr = str(self.replication_factor), str(self.min_insync)
        listeners = f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{port + 1}"
        advertised = f"PLAINTEXT://{host}:{port}"
        protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        security: dict[str, str] = {}
        # brokers and controllers still talk PLAINTEXT among themselves
        if self.sasl_users:
            address = f"SASL_PLAINTEXT://{host}:{self.sasl_port(node_id)}"
            listeners, advertised = f"{listeners},{address}", f"{advertised},{address}"
            protocols += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
            users = " ".join(f'user_{u}="{pw}"' for u, pw in self.sasl_users)
            security = {
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
                ),
            }
        if self.tls_keystore:
            address = f"SSL://{host}:{self.tls_port(node_id)}"
            listeners, advertised = f"{listeners},{address}", f"{advertised},{address}"
            protocols += ",SSL:SSL"
            security |= {
                "listener.name.ssl.ssl.keystore.type": "PKCS12",
                "listener.name.ssl.ssl.keystore.location": self.tls_keystore,
                "listener.name.ssl.ssl.keystore.password": TLS_STORE_PASSWORD,
                "listener.name.ssl.ssl.key.password": TLS_STORE_PASSWORD,
            }
        return {
            # identity and listeners
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.voters": self.voters,
            "listeners": listeners,
            "advertised.listeners": advertised,
            "listener.security.protocol.map": protocols,
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            **security,
            "log.dirs": data_dir,
            # what a replicated map needs: acks=all means two copies, nothing lost silently
            "num.partitions": "1",
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "unclean.leader.election.enable": "false",
            "auto.create.topics.enable": "false",
            "auto.leader.rebalance.enable": "false",
            # internal topics: replicated like user topics, few partitions (fast to create)
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "3",
            # a transaction left open by a writer killed mid-flush is aborted within 0.5 s of
            # its transaction.timeout.ms (not the default 10 s): readers held at most 10 s
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": str(
                TRANSACTION_CLEANUP_INTERVAL_MS
            ),
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            "share.coordinator.state.topic.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0",
            # failures noticed in seconds, so fault tests stay short
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "4000",
            "replica.lag.time.max.ms": "10000",
            # few threads and small buffers: three brokers share two cores
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.replica.fetchers": "1",
            "num.recovery.threads.per.data.dir": "1",
            "background.threads": "4",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
        }


def render_properties(config: Mapping[str, str], comment: str = "") -> str:
    """``config`` as a Java properties file, one ``name=value`` line each.

    Backslashes are doubled so Java reads the value back unchanged.

    >>> print(render_properties({"node.id": "1"}, "node 1"), end="")
    # node 1
    node.id=1
    """
    lines = [f"# {line}" for line in comment.splitlines()]
    lines += [f"{name}={value.replace(chr(92), chr(92) * 2)}" for name, value in config.items()]
    return "\n".join(lines) + "\n"


def new_cluster_id() -> str:
    """A fresh cluster id in Kafka's form: a random UUID as 22 characters of URL-safe base64.

    Never one that starts with ``-`` (as Kafka's own ``Uuid.randomUuid``): the storage tool
    would read it as an option and refuse to format (1 id in 64 otherwise).

    >>> len(new_cluster_id())
    22
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


def _java_prefix(
    java: str, classpath: str, logs_dir: str, log4j_config: str, jvm: Sequence[str]
) -> list[str]:
    return [
        java,
        *jvm,
        f"-Dkafka.logs.dir={logs_dir}",
        f"-Dlog4j2.configurationFile={log4j_config}",
        "-cp",
        classpath,
    ]


def broker_command(
    java: str,
    classpath: str,
    config_path: str,
    logs_dir: str,
    log4j_config: str,
    jvm: Sequence[str] = DEFAULT_JVM_OPTIONS,
) -> list[str]:
    """The command line that runs one broker (``kafka.Kafka``) on ``config_path``."""
    return [*_java_prefix(java, classpath, logs_dir, log4j_config, jvm), "kafka.Kafka", config_path]


def format_command(
    java: str,
    classpath: str,
    config_path: str,
    cluster_id: str,
    logs_dir: str,
    log4j_config: str,
) -> list[str]:
    """The command line that formats one node's storage for ``cluster_id`` (static quorum)."""
    prefix = _java_prefix(java, classpath, logs_dir, log4j_config, _FORMAT_JVM_OPTIONS)
    return [*prefix, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", config_path]
