"""The replicated map: a dict shared by every process that opens it, through a log."""

from kafkakv.map.feed import Change, ChangeFeed, Cursor, Snapshot
from kafkakv.map.futures import OpFuture
from kafkakv.map.keyspace import FLUSH_POINT_KEY
from kafkakv.map.machine import ApplyError
from kafkakv.map.replica import ReplicaMap, SortedReplicaMap
from kafkakv.map.settings import MapSettings
from kafkakv.map.topics import MapTopics

__all__ = [
    "FLUSH_POINT_KEY",
    "ApplyError",
    "Change",
    "ChangeFeed",
    "Cursor",
    "MapSettings",
    "MapTopics",
    "OpFuture",
    "ReplicaMap",
    "Snapshot",
    "SortedReplicaMap",
]
