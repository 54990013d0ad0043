"""A Kafka cluster started by someone else: connect to it, ask it, but never break it."""

from __future__ import annotations

import signal

from kafkakv.dev.base import Cluster
from kafkakv.dev.errors import ClusterError

__all__ = ["ExternalCluster"]


class ExternalCluster(Cluster):
    """The cluster at ``bootstrap`` (for instance ``$KAFKAKV_TEST_BOOTSTRAP``).

    :meth:`leader`, :meth:`wait_leader` and :meth:`wait_in_sync` work as on a
    :class:`~kafkakv.dev.DevCluster`; the fault-injection calls raise
    :class:`~kafkakv.dev.errors.ClusterError`, since this process owns no broker.

    >>> ExternalCluster("127.0.0.1:9092").bootstrap
    '127.0.0.1:9092'
    """

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` given."""
        return self._bootstrap

    def _refuse(self, call: str) -> ClusterError:
        return ClusterError(
            f"{call} needs brokers started by kafkakv.dev; the external cluster at "
            f"{self._bootstrap} offers no fault injection (unset KAFKAKV_TEST_BOOTSTRAP to "
            "run this test on a harness cluster)"
        )

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Refused: raises :class:`~kafkakv.dev.errors.ClusterError`."""
        raise self._refuse(f"kill({node_id})")

    def stop_node(self, node_id: int, timeout: float = 30.0) -> None:
        """Refused: raises :class:`~kafkakv.dev.errors.ClusterError`."""
        raise self._refuse(f"stop_node({node_id})")

    def start_node(self, node_id: int, timeout: float | None = None) -> None:
        """Refused: raises :class:`~kafkakv.dev.errors.ClusterError`."""
        raise self._refuse(f"start_node({node_id})")

    def is_running(self, node_id: int) -> bool:
        """Refused: raises :class:`~kafkakv.dev.errors.ClusterError` (it cannot see processes)."""
        raise self._refuse(f"is_running({node_id})")
