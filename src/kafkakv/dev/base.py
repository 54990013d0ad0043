"""What a test sees of a Kafka cluster: where to connect, who leads, and how to break it.

:class:`Cluster` is the interface. The questions about leaders and ISRs are answered the same
way for every cluster, from fresh metadata; the fault-injection calls are abstract:
:class:`~kafkakv.dev.DevCluster` performs them on brokers it started,
:class:`~kafkakv.dev.ExternalCluster` refuses them.
"""

from __future__ import annotations

import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import TYPE_CHECKING

from kafkakv.dev.errors import ClusterError
from kafkakv.dev.probe import admin_client, topic_partitions

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

    # the metadata classes are not re-exported by confluent_kafka.admin
    from confluent_kafka.admin._metadata import PartitionMetadata

__all__ = ["Cluster"]

_POLL_S = 0.25
_REQUEST_TIMEOUT_S = 5.0


class Cluster(ABC):
    """A Kafka cluster that tests connect to (see the module docstring)."""

    _admin: AdminClient | None = None

    @property
    @abstractmethod
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: ``host:port`` of the brokers, comma-separated."""

    @property
    def sasl_bootstrap(self) -> str | None:
        """``host:port`` of the brokers' SASL/PLAIN listeners, when the cluster has them."""
        return None

    @property
    def tls_bootstrap(self) -> str | None:
        """``host:port`` of the brokers' TLS listeners, when the cluster has them."""
        return None

    @property
    def tls_ca_location(self) -> str | None:
        """The PEM certificate a TLS client must trust, when the cluster has TLS listeners."""
        return None

    @abstractmethod
    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to broker ``node_id``; with SIGKILL, return once it is gone."""

    @abstractmethod
    def stop_node(self, node_id: int, timeout: float = 30.0) -> None:
        """Stop broker ``node_id`` gracefully (SIGTERM; SIGKILL after ``timeout`` seconds)."""

    @abstractmethod
    def start_node(self, node_id: int, timeout: float | None = None) -> None:
        """Start broker ``node_id`` again on its data; return when it is back in the metadata."""

    @abstractmethod
    def is_running(self, node_id: int) -> bool:
        """Whether broker ``node_id``'s process runs."""

    def admin(self) -> AdminClient:
        """An admin client for :attr:`bootstrap`, made on first use and kept."""
        if self._admin is None:
            self._admin = admin_client(self.bootstrap)
        return self._admin

    def partitions(self, topic: str) -> dict[int, PartitionMetadata]:
        """Partition number → leader, replicas and ISR of ``topic``, from fresh metadata.

        One Metadata request. Raises :class:`~kafkakv.dev.errors.ClusterError` for an unknown
        topic or a cluster that does not answer within 5 s.
        """
        return topic_partitions(self.admin(), topic, _REQUEST_TIMEOUT_S)

    def leader(self, topic: str, partition: int) -> int:
        """The node id of the leader of ``topic``'s ``partition``, as the metadata says now.

        A leader that just died stays in the metadata until the controller notices (a few
        seconds); :meth:`wait_leader` waits for a new one. Raises
        :class:`~kafkakv.dev.errors.ClusterError` for an unknown topic or partition, or a
        partition without a leader.
        """
        found = self.partitions(topic).get(partition)
        if found is None:
            raise ClusterError(f"topic {topic!r} has no partition {partition}")
        if found.leader < 0:
            raise ClusterError(f"{topic}[{partition}] has no leader (replicas {found.replicas})")
        return found.leader

    def wait_leader(
        self, topic: str, partition: int, *, exclude: Collection[int] = (), timeout: float = 30.0
    ) -> int:
        """Wait until ``topic``'s ``partition`` has a leader not in ``exclude``; its node id.

        Polls the metadata every 0.25 s. Raises :class:`~kafkakv.dev.errors.ClusterError` when
        ``timeout`` seconds pass first.
        """
        deadline = time.monotonic() + timeout
        last = "no metadata"
        while True:
            try:
                leader = self.leader(topic, partition)
                if leader not in exclude:
                    return leader
                last = f"leader {leader}"
            except ClusterError as exc:
                last = str(exc)
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"{topic}[{partition}] has no leader outside {sorted(exclude)} after "
                    f"{timeout:.0f} s ({last})"
                )
            time.sleep(_POLL_S)

    def wait_in_sync(self, topic: str, timeout: float = 60.0) -> None:
        """Wait until every partition of ``topic`` has a leader and its full ISR.

        Polls the metadata every 0.25 s. Raises :class:`~kafkakv.dev.errors.ClusterError`, naming
        the partitions still short, when ``timeout`` seconds pass first.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                short = _short_partitions(self.partitions(topic))
            except ClusterError as exc:
                short = [str(exc)]
            if not short:
                return
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"topic {topic!r} not in sync after {timeout:.0f} s: {'; '.join(short)}"
                )
            time.sleep(_POLL_S)


def _short_partitions(partitions: dict[int, PartitionMetadata]) -> list[str]:
    """A description of each partition without a leader or with replicas outside its ISR."""
    short = []
    for number, found in sorted(partitions.items()):
        if found.leader < 0 or set(found.isrs) != set(found.replicas):
            short.append(
                f"partition {number} leader {found.leader} "
                f"isr {sorted(found.isrs)} of replicas {sorted(found.replicas)}"
            )
    return short
