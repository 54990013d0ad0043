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
from collections.abc import Mapping
from dataclasses import dataclass

from kafkakv.errors import ConfigError, TopicExistsError, TopicMismatchError
from kafkakv.log.base import Log
from kafkakv.log.config import validate_topic_name

__all__ = ["MapTopics", "ensure_topics"]

_SAFE = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}
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

    def settings(self, ops_retention_bytes: int = 2 << 30) -> dict[str, dict[str, str]]:
        """Kafka topic configs to create the three topics with."""
        return {
            self.data: {**_SAFE, "cleanup.policy": "compact", "min.compaction.lag.ms": "0"},
            self.ops: {**_SAFE, **_NO_AGE, "retention.bytes": str(ops_retention_bytes)},
            self.flush: {**_SAFE, **_NO_AGE, "retention.bytes": str(1 << 30)},
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
    wanted = settings or topics.settings()
    existing = set(log.topics())
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
