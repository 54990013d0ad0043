"""kafkakv: a replicated key-value database for Python on a partitioned log."""

from kafkakv import errors
from kafkakv.errors import KafkaKVError
from kafkakv.log import EmbeddedLog, FsyncPolicy, Log, LogWriter, Record, partition_for

__version__ = "0.1.0"

__all__ = [
    "EmbeddedLog",
    "FsyncPolicy",
    "KafkaKVError",
    "Log",
    "LogWriter",
    "Record",
    "__version__",
    "errors",
    "partition_for",
]
