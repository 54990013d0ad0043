"""kafkakv: a replicated key-value database for Python on a partitioned log."""

from kafkakv import codecs, errors, functions, metrics
from kafkakv.db import Database, connect, connect_async
from kafkakv.directory import Directory, DirectoryRecord, RecordError
from kafkakv.errors import KafkaKVError
from kafkakv.log import EmbeddedLog, FsyncPolicy, Log, LogWriter, Record, partition_for
from kafkakv.map import Change, Cursor, MapSettings, OpFuture, ReplicaMap, SortedReplicaMap
from kafkakv.store import DictStore, LmdbStore, SortedStore, Store

__version__ = "0.1.0"

__all__ = [
    "Change",
    "Cursor",
    "Database",
    "DictStore",
    "Directory",
    "DirectoryRecord",
    "EmbeddedLog",
    "FsyncPolicy",
    "KafkaKVError",
    "LmdbStore",
    "Log",
    "LogWriter",
    "MapSettings",
    "OpFuture",
    "Record",
    "RecordError",
    "ReplicaMap",
    "SortedReplicaMap",
    "SortedStore",
    "Store",
    "__version__",
    "codecs",
    "connect",
    "connect_async",
    "errors",
    "functions",
    "metrics",
    "partition_for",
]
