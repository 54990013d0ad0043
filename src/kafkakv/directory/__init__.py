"""Directories: read-only replicas of any compacted topic, loaded to the end, then followed."""

from kafkakv.directory.base import (
    DirectoryRecord,
    DirectoryState,
    Listener,
    RecordError,
    Table,
    Transform,
)
from kafkakv.directory.decode import RecordDecoder
from kafkakv.directory.directory import Directory
from kafkakv.directory.metrics import DirectoryMetrics
from kafkakv.directory.table import MemoryTable, StoreTable

__all__ = [
    "Directory",
    "DirectoryMetrics",
    "DirectoryRecord",
    "DirectoryState",
    "Listener",
    "MemoryTable",
    "RecordDecoder",
    "RecordError",
    "StoreTable",
    "Table",
    "Transform",
]
