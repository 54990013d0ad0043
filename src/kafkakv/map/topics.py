"""The three topics of a map, their required settings, and creating or verifying them.

=================  ===================================================================
``<name>``         data: compacted snapshot of every key, written only by flushes
``<name>_ops``     ops: every update attempt, in order; kept until a flush covers it
``<name>_flush``   flush: requests to flush, for observability and stale detection
=================  ===================================================================

The ops and flush topics must never lose records by age (``retention.ms=-1``): a replica that
starts after a quiet week still needs every op after the last flush. Their size retention is a
safety net sized from the flush period (see docs/maps.md). The data topic must be compacted and
only compacted: deleting old data by age would lose keys nobody updated lately.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kafkakv.errors import ConfigError, TopicExistsError, TopicMismatchError
from kafkakv.log.base import Log
from kafkakv.log.config import validate_topic_name
from kafkakv.log.partitioner import partition_for

__all__ = ["AdoptReport", "MapTopics", "adopt_existing", "ensure_topics"]

_SAFE = {"unclean.leader.election.enable": "false"}
_NO_AGE = {"cleanup.policy": "delete", "retention.ms": "-1", "file.delete.delay.ms": "7200000"}

#: (setting, required value) pairs checked on existing topics; anything else may differ.
_REQUIRED_DATA = {"cleanup.policy": "compact", "unclean.leader.election.enable": "false"}
_REQUIRED_LOG = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "unclean.leader.election.enable": "false",
}


@dataclass(frozen=True)
class MapTopics:
    """Names of a map's three topics (``MapTopics.for_name("flowers")``)."""

    data: str
    ops: str
    flush: str

    @classmethod
    def for_name(cls, name: str) -> MapTopics:
        validate_topic_name(name)
        topics = cls(name, f"{name}_ops", f"{name}_flush")
        validate_topic_name(topics.flush)
        return topics

    def settings(
        self, replication: int = 1, ops_retention_bytes: int = 2 << 30
    ) -> dict[str, dict[str, str]]:
        """Kafka topic configs to create the three topics with, for ``replication`` copies.

        ``min.insync.replicas`` is 2 from three copies on (an acknowledged update survives
        the loss of any one broker, and one broker down stops no writes), else 1.
        """
        safe = {**_SAFE, "min.insync.replicas": "2" if replication >= 3 else "1"}
        return {
            self.data: {**safe, "cleanup.policy": "compact", "min.compaction.lag.ms": "0"},
            self.ops: {**safe, **_NO_AGE, "retention.bytes": str(ops_retention_bytes)},
            self.flush: {**safe, **_NO_AGE, "retention.bytes": str(1 << 30)},
        }


def ensure_topics(
    log: Log,
    topics: MapTopics,
    partitions: int | None,
    settings: Mapping[str, Mapping[str, str]] | None = None,
) -> int:
    """Create the map's topics, or verify the existing ones; return the partition count.

    ``partitions=None`` takes the existing count (1 when creating). Raises
    :class:`~kafkakv.errors.TopicMismatchError` naming the topic and setting that is wrong, or
    when the three topics disagree on their partition count, or the count differs from
    ``partitions``. Cost: one metadata round trip per topic.
    """
    if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
        raise ConfigError(f"partitions must be a positive int, not {partitions!r}")
    existing = set(log.topics())
    missing = {topics.data, topics.ops, topics.flush} - existing
    wanted = settings or (topics.settings(log.new_topic_replication()) if missing else {})
    for name in (topics.data, topics.ops, topics.flush):
        if name not in existing:
            count = partitions or _existing_count(log, topics, existing) or 1
            # Another process may create it meanwhile; it is verified below either way.
            with contextlib.suppress(TopicExistsError):
                log.create_topic(name, count, wanted[name])
    counts = {name: log.partitions(name) for name in (topics.data, topics.ops, topics.flush)}
    if len(set(counts.values())) != 1:
        detail = ", ".join(f"{n}={c}" for n, c in counts.items())
        raise TopicMismatchError(f"a map's topics must have equal partition counts: {detail}")
    count = counts[topics.data]
    if partitions is not None and partitions != count:
        raise TopicMismatchError(
            f"map topics {topics.data!r} exist with {count} partitions, not {partitions}"
        )
    _verify(log, topics.data, _REQUIRED_DATA)
    _verify(log, topics.ops, _REQUIRED_LOG)
    _verify(log, topics.flush, _REQUIRED_LOG)
    return count


def _existing_count(log: Log, topics: MapTopics, existing: set[str]) -> int | None:
    for name in (topics.data, topics.ops, topics.flush):
        if name in existing:
            return log.partitions(name)
    return None


def _verify(log: Log, topic: str, required: Mapping[str, str]) -> None:
    config = log.topic_config(topic)
    for key, value in required.items():
        actual = config.get(key)
        if actual != value:
            raise TopicMismatchError(
                f"topic {topic!r} has {key}={actual}, a map needs {key}={value}; "
                f"fix it with your admin tools or use another map name"
            )


def adopt_existing(
    log: Log,
    topics: MapTopics,
    progress: Callable[[int], None] | None = None,
) -> AdoptReport:
    """Make the existing compacted topic ``topics.data`` the data topic of a map (seed 000's
    procedure for bringing a key-value topic that another program wrote under a map).

    Checks, and refuses with :class:`~kafkakv.errors.TopicMismatchError` when one fails:

    - the data topic exists and is compacted;
    - an ops or flush topic that exists has the same partition count, and the ops topic
      holds no record (a map with history cannot adopt data);
    - every record sits in the partition the map would put its key in (Kafka's Java
      partitioner, murmur2); a topic written with another partitioner (librdkafka's default
      is CRC32) would leave a key in two partitions once the map updates it.

    Then it creates the missing ops and flush topics. Reading every record costs one pass over
    the data topic; ``progress(n)`` is called with the number of records checked so far. A
    map opened afterwards loads every committed record of the data topic.
    """
    existing = set(log.topics())
    if topics.data not in existing:
        raise TopicMismatchError(f"there is no topic {topics.data!r} to adopt")
    config = log.topic_config(topics.data)
    if config.get("cleanup.policy") != "compact":
        raise TopicMismatchError(
            f"topic {topics.data!r} has cleanup.policy={config.get('cleanup.policy')}; "
            "only a compacted topic (cleanup.policy=compact) can be a map's data topic"
        )
    count = log.partitions(topics.data)
    for name in (topics.ops, topics.flush):
        if name in existing and log.partitions(name) != count:
            raise TopicMismatchError(
                f"topic {name!r} has {log.partitions(name)} partitions and {topics.data!r} "
                f"has {count}; they must be equal"
            )
    if topics.ops in existing:
        used = [p for p in range(count) if log.end_offset(topics.ops, p) > 0]
        if used:
            raise TopicMismatchError(
                f"ops topic {topics.ops!r} is not empty (partitions {used}): a map already "
                "used these topics, and adopting data now would mix two histories"
            )
    report = _check_partitioning(log, topics.data, count, progress)
    if report.misplaced:
        key, found, wanted = report.misplaced[0]
        raise TopicMismatchError(
            f"{report.misplaced_count} records of {topics.data!r} are not in the partition the "
            f"map would use (first: key {key!r} in partition {found}, murmur2 says {wanted}); "
            "write the topic with Kafka's default (murmur2) partitioner, or repartition it"
        )
    ensure_topics(log, topics, count)
    return report


@dataclass
class AdoptReport:
    """What :func:`adopt_existing` read: records per partition, and misplaced keys (the
    first 100 as ``(key, partition found, partition wanted)``, and how many in all)."""

    records: dict[int, int]
    misplaced: list[tuple[bytes | None, int, int]]
    misplaced_count: int = 0


def _check_partitioning(
    log: Log, topic: str, count: int, progress: Callable[[int], None] | None
) -> AdoptReport:
    report = AdoptReport({}, [])
    seen = 0
    for p in range(count):
        position, records = log.start_offset(topic, p), 0
        while True:
            batch = log.read_batch(topic, p, position, max_records=5000)
            if not batch.records:
                break
            for record in batch.records:
                key = record.key
                wanted = partition_for(key, count) if key is not None else p
                if wanted != p:
                    report.misplaced_count += 1
                    if len(report.misplaced) < 100:
                        report.misplaced.append((key, p, wanted))
            records += len(batch.records)
            seen += len(batch.records)
            position = batch.next_offset
            if progress is not None:
                progress(seen)
        report.records[p] = records
    return report
