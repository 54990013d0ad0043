"""kafkakv: a replicated key-value database for Python on a partitioned log."""

from kafkakv import codecs, errors, functions
from kafkakv.db import Database, connect
from kafkakv.errors import KafkaKVError
from kafkakv.log import EmbeddedLog, FsyncPolicy, Log, LogWriter, Record, partition_for
from kafkakv.map import MapSettings, OpFuture, ReplicaMap, SortedReplicaMap
from kafkakv.store import DictStore, LmdbStore, SortedStore, Store

__version__ = "0.1.0"

__all__ = [
    "Database",
    "DictStore",
    "EmbeddedLog",
    "FsyncPolicy",
    "KafkaKVError",
    "LmdbStore",
    "Log",
    "LogWriter",
    "MapSettings",
    "OpFuture",
    "Record",
    "ReplicaMap",
    "SortedReplicaMap",
    "SortedStore",
    "Store",
    "__version__",
    "codecs",
    "connect",
    "errors",
    "functions",
    "partition_for",
]
