"""Asking a cluster how it is: open ports, brokers in the metadata, leaders and ISRs.

Thin shells over a socket and ``confluent_kafka.admin.AdminClient.list_topics`` (one Metadata
request each; confluent-kafka is imported on first use, so the package imports without it).
librdkafka's own log lines go to the ``kafkakv.dev.client`` logger, which
has a ``NullHandler``: connection-refused noise while brokers start is not printed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import TYPE_CHECKING

from kafkakv.dev.errors import ClusterError
from kafkakv.dev.layout import HOST

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

    # the metadata classes are not re-exported by confluent_kafka.admin
    from confluent_kafka.admin._metadata import ClusterMetadata, PartitionMetadata

__all__ = [
    "admin_client",
    "brokers_seen_by",
    "connected_to_itself",
    "metadata",
    "port_accepts",
    "port_is_free",
    "topic_partitions",
]

_CLIENT_LOG = logging.getLogger("kafkakv.dev.client")
_CLIENT_LOG.addHandler(logging.NullHandler())


def admin_client(bootstrap: str) -> AdminClient:
    """An admin client for ``bootstrap`` that logs to ``kafkakv.dev.client``.

    Creating one starts librdkafka's threads but sends nothing.
    """
    config: dict[str, str | int | float | bool] = {
        "bootstrap.servers": bootstrap,
        "socket.connection.setup.timeout.ms": 2000,
        "reconnect.backoff.max.ms": 500,
    }
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError as exc:
        raise ClusterError(
            "asking the cluster needs confluent-kafka: pip install 'kafkakv[kafka]'"
        ) from exc
    return AdminClient(config, logger=_CLIENT_LOG)


def port_accepts(port: int, timeout: float = 0.5, host: str = HOST) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (default 127.0.0.1; a
    connection that met itself is not something: see :func:`connected_to_itself`)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            return not connected_to_itself(sock)
    except OSError:
        return False


def connected_to_itself(sock: socket.socket) -> bool:
    """Whether ``sock`` is a TCP connection to itself. With nothing listening on a port of the
    ephemeral range (32768-60999 on Linux), a connection to it may get that very port as its
    own, and the two ends meet: it succeeds, with no server, and holds the port a broker is
    about to bind."""
    return bool(sock.getsockname() == sock.getpeername())


def port_is_free(port: int, host: str = HOST) -> bool:
    """Whether ``host:port`` (default 127.0.0.1) can be bound (``SO_REUSEADDR``, as the broker
    binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def metadata(client: AdminClient, timeout: float, topic: str | None = None) -> ClusterMetadata:
    """Fresh cluster metadata (one request), for one topic or for all.

    Raises :class:`~kafkakv.dev.errors.ClusterError` when no broker answers within ``timeout``.
    """
    from confluent_kafka import KafkaException  # present: the client exists

    try:
        if topic is None:
            return client.list_topics(timeout=timeout)
        return client.list_topics(topic=topic, timeout=timeout)
    except KafkaException as exc:
        raise ClusterError(f"no metadata from the cluster: {exc.args[0]}") from exc


def brokers_seen_by(address: str, port: int, timeout: float = 2.0) -> set[int] | None:
    """The broker ids in the metadata that the broker at ``address`` (``host:port``) itself
    returns.

    ``None`` when its ``port`` is closed or it does not answer within ``timeout``; a broker
    opens its client port only once it has caught up with the cluster metadata.
    """
    if not port_accepts(port, host=address.rpartition(":")[0] or HOST):
        return None
    client = admin_client(address)
    with contextlib.suppress(ClusterError):
        return set(metadata(client, timeout).brokers)
    return None


def topic_partitions(
    client: AdminClient, topic: str, timeout: float
) -> dict[int, PartitionMetadata]:
    """Partition number → metadata (leader, replicas, ISR) of ``topic``.

    Raises :class:`~kafkakv.dev.errors.ClusterError` when the topic is unknown or the cluster does
    not answer.
    """
    found = metadata(client, timeout, topic).topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        reason = "no answer" if found is None else str(found.error or "no partitions")
        raise ClusterError(f"topic {topic!r} has no metadata: {reason}")
    return found.partitions
