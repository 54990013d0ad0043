"""The log layer: one :class:`Log` interface, backends behind it."""

from kafkakv.log.base import (
    Batch,
    CleanResult,
    Entry,
    EntryBatch,
    LatestBatch,
    Log,
    LogWriter,
    Problem,
    Record,
    TopicPartition,
)
from kafkakv.log.config import TopicConfig, parse_topic_config
from kafkakv.log.embedded import EmbeddedLog, FsyncPolicy
from kafkakv.log.memory import MemoryLog
from kafkakv.log.partitioner import murmur2, partition_for

__all__ = [
    "Batch",
    "CleanResult",
    "EmbeddedLog",
    "Entry",
    "EntryBatch",
    "FsyncPolicy",
    "LatestBatch",
    "Log",
    "LogWriter",
    "MemoryLog",
    "Problem",
    "Record",
    "TopicConfig",
    "TopicPartition",
    "murmur2",
    "parse_topic_config",
    "partition_for",
]
