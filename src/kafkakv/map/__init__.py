"""The replicated map: a dict shared by every process that opens it, through a log."""

from kafkakv.map.engine import FLUSH_POINT_KEY, ApplyError, OpFuture
from kafkakv.map.replica import ReplicaMap, SortedReplicaMap
from kafkakv.map.settings import MapSettings
from kafkakv.map.topics import MapTopics

__all__ = [
    "FLUSH_POINT_KEY",
    "ApplyError",
    "MapSettings",
    "MapTopics",
    "OpFuture",
    "ReplicaMap",
    "SortedReplicaMap",
]
