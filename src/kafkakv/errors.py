"""Every error kafkakv raises, under one root.

::

    KafkaKVError
    ├── ConfigError (ValueError)          a setting or topic config that is unknown or out of range
    ├── ClosedError                       a log, writer or map used after close()
    ├── OperationTimeoutError (TimeoutError)
    │                                     a blocking call ran out of its timeout
    └── LogError                          anything the log layer refuses or fails at
        ├── TopicExistsError              create_topic() for a name that exists
        ├── UnknownTopicError (KeyError)  a topic that does not exist
        ├── UnknownPartitionError (KeyError)
        │                                 a partition number outside the topic
        ├── InvalidRecordError (TypeError)
        │                                 a key, value, header or timestamp of the wrong type,
        │                                 or a null key on a compacted topic
        ├── RecordTooLargeError           a record larger than the topic's max.message.bytes
        ├── OffsetOutOfRangeError         a read below the log start offset (retention removed it)
        ├── FencedError                   a transactional writer replaced by a newer one
        │                                 with the same transactional id
        ├── NotALogError                  a directory that holds something other than a log
        ├── CorruptLogError               bytes on disk that fail their checksum or framing
        ├── UnsupportedOperationError     an operation the backend cannot perform
        └── LogIOError (OSError)          the operating system refused a file operation

Errors from below (``OSError``, and later ``KafkaException``) are translated at the boundary
with ``raise ... from exc``, so the original error stays attached as ``__cause__``.
"""

from __future__ import annotations

__all__ = [
    "ClosedError",
    "ConfigError",
    "CorruptLogError",
    "FencedError",
    "InvalidRecordError",
    "KafkaKVError",
    "LogError",
    "LogIOError",
    "NotALogError",
    "OffsetOutOfRangeError",
    "OperationTimeoutError",
    "RecordTooLargeError",
    "TopicExistsError",
    "UnknownPartitionError",
    "UnknownTopicError",
    "UnsupportedOperationError",
]


class KafkaKVError(Exception):
    """Root of every error kafkakv raises on purpose."""


class ConfigError(KafkaKVError, ValueError):
    """A setting or a topic config entry is unknown, of the wrong type, or out of range."""


class ClosedError(KafkaKVError):
    """A log, writer or map was used after ``close()``."""


class OperationTimeoutError(KafkaKVError, TimeoutError):
    """A blocking call did not finish within its timeout."""


class LogError(KafkaKVError):
    """The log refused or failed an operation."""


class TopicExistsError(LogError):
    """``create_topic`` was called with the name of an existing topic."""


class UnknownTopicError(LogError, KeyError):
    """The topic does not exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "unknown topic"


class UnknownPartitionError(LogError, KeyError):
    """The partition number is outside ``0 .. partitions - 1`` of the topic."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown partition"


class InvalidRecordError(LogError, TypeError):
    """A record field has the wrong type, or the record is not allowed on this topic."""


class RecordTooLargeError(LogError):
    """A record is larger than the topic's ``max.message.bytes``."""


class OffsetOutOfRangeError(LogError):
    """A read asked for an offset below the log start offset."""


class FencedError(LogError):
    """A transactional writer was fenced by a newer writer with the same transactional id."""


class NotALogError(LogError):
    """The directory exists, is not empty, and is not a kafkakv log."""


class CorruptLogError(LogError):
    """Bytes on disk failed their checksum or framing.

    ``path`` and ``position`` say where, when known.
    """

    def __init__(self, message: str, *, path: str | None = None, position: int | None = None):
        super().__init__(message)
        self.path = path
        self.position = position


class UnsupportedOperationError(LogError):
    """The backend cannot perform this operation."""


class LogIOError(LogError, OSError):
    """The operating system refused a file operation; ``__cause__`` holds the original."""
