"""The errors of the development tooling, apart from the database's own (:mod:`kafkakv.errors`).

::

    KafkaKVError (kafkakv.errors)
    ├── ClusterError          the dev cluster could not start, stop or answer: a broker that
    │   │                     died, a port in use, a cluster already running, a wait that
    │   │                     timed out, a fault call on a cluster that offers none
    │   └── JarFetchError     java or mvn missing, or Maven failed to fetch the broker jars
    │                         (the message ends with Maven's output)
    ├── HostsError            simulated hosts could not be made or faulted: not root, ip or
    │                         iptables missing, a command that failed (its stderr in the
    │                         message), a host that does not exist
    ├── PostgresError         the throwaway PostgreSQL server could not start or stop
    └── ClockShimError        the wall-clock shim (kafkakv.dev.clock) could not be built

They derive from :class:`~kafkakv.errors.KafkaKVError`, so a caller (the ``kafkakv`` command
among them) that reports every kafkakv error reports these too; no module of the database
raises them.
"""

from __future__ import annotations

from kafkakv.errors import KafkaKVError

__all__ = ["ClockShimError", "ClusterError", "HostsError", "JarFetchError", "PostgresError"]


class ClusterError(KafkaKVError):
    """The dev cluster of :mod:`kafkakv.dev` failed: a broker that did not start or died (the
    message names the node and ends with the tail of its log), a port already in use, a
    cluster already running from the same directory, a wait that ran out of time, or a
    fault-injection call on a cluster that does not support it."""


class JarFetchError(ClusterError):
    """The broker jars could not be fetched: ``java`` or ``mvn`` is not installed, Maven
    failed or timed out (the message ends with the tail of its output), or another process
    held the cache lock for too long."""


class HostsError(KafkaKVError):
    """The simulated hosts of :mod:`kafkakv.dev.hosts` failed: not root, ``ip`` or
    ``iptables`` not installed (the message says which package), an ``ip``/``iptables``
    command that failed (its words in the message), an unknown host name, a network used
    before :meth:`~kafkakv.dev.hosts.Hosts.start` or after its close."""


class PostgresError(KafkaKVError):
    """The throwaway PostgreSQL server of :mod:`kafkakv.dev.postgres` could not start: the
    server binaries missing (``pip install 'kafkakv[spark]'``), a data directory it cannot
    use, ``initdb`` or the server failing (the message ends with the tail of its log), a
    port in use, a start that timed out."""


class ClockShimError(KafkaKVError):
    """The wall-clock shim of :mod:`kafkakv.dev.clock` could not be built: ``gcc`` missing or
    failing (the message ends with its output)."""
