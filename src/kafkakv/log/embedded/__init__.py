"""The embedded log: Kafka-style segments, sparse offset index and compaction on local disk."""

from kafkakv.log.base import CleanResult
from kafkakv.log.embedded.log import EmbeddedLog
from kafkakv.log.embedded.settings import FsyncPolicy

__all__ = ["CleanResult", "EmbeddedLog", "FsyncPolicy"]
