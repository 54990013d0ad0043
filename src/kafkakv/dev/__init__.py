"""Development tooling, apart from the database: no module of the database imports this package
(``tests/dev/test_isolation.py`` checks). What it holds:

- a real Apache Kafka cluster for tests and developers, from Maven Central jars (exported here);
- :mod:`kafkakv.dev.postgres`: a throwaway PostgreSQL server for the pipeline's tests, demo
  and benchmarks (imported from there: it loads :mod:`kafkakv.pipeline`);
- :mod:`kafkakv.dev.hosts`: simulated hosts (a network namespace each, on one bridge) and the
  faults of the network between them; a :class:`DevCluster` runs on them with a ``placement``
  (imported from there: it needs root);
- :mod:`kafkakv.dev.errors`: their errors.

:func:`fetch_kafka` gets the broker jars (KRaft mode, no ZooKeeper) with Maven once and caches
them under ``${KAFKAKV_CACHE:-~/.cache/kafkakv}``; :class:`DevCluster` formats storage and
runs N brokers on 127.0.0.1, with calls that kill and restart them for fault tests; :class:`ExternalCluster` stands for a cluster started elsewhere.
The ``kafkakv dev-cluster`` command and the pytest fixtures in ``tests/kafka_cluster.py`` are
thin shells over these. See ``docs/dev-cluster.md``.

Example (not run as a doctest: it starts JVMs)::

    with DevCluster(brokers=3) as cluster:
        producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap})
        ...
        cluster.kill(cluster.leader("topic", 0))
"""

from kafkakv.dev.base import Cluster
from kafkakv.dev.cluster import ClusterStatus, DevCluster, NodeStatus, default_state_dir
from kafkakv.dev.external import ExternalCluster
from kafkakv.dev.jars import (
    DEFAULT_KAFKA_VERSION,
    KafkaJars,
    cached_jars,
    default_cache_root,
    fetch_kafka,
    find_java,
)
from kafkakv.dev.layout import ClusterLayout

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "Cluster",
    "ClusterLayout",
    "ClusterStatus",
    "DevCluster",
    "ExternalCluster",
    "KafkaJars",
    "NodeStatus",
    "cached_jars",
    "default_cache_root",
    "default_state_dir",
    "fetch_kafka",
    "find_java",
]
