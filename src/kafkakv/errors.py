"""Every error kafkakv raises, under one root.

::

    KafkaKVError                          (``code``, ``code_name``: the backend's error code)
    ├── ConfigError (ValueError)          a setting, argument or topic config that is unknown,
    │                                     of the wrong type or out of range, or that
    │                                     librdkafka or the Kafka brokers refuse
    ├── ClosedError                       a log, writer, store, map, directory or database
    │                                     used after close()
    ├── OperationTimeoutError (TimeoutError)
    │   │                                 a blocking call ran out of its timeout (for Kafka:
    │   │                                 brokers that did not answer, a record not
    │   │                                 acknowledged in time)
    │   └── LockTimeoutError              another process held an embedded log's lock for the
    │                                     whole timeout (``path`` and ``pid`` say which)
    ├── LogError                          anything else the log layer refuses or fails at
    │   ├── TopicExistsError              create_topic() for a name that exists
    │   ├── UnknownTopicError (KeyError)  a topic that does not exist
    │   ├── UnknownPartitionError (KeyError)
    │   │                                 a partition number outside the topic
    │   ├── InvalidRecordError (TypeError)
    │   │                                 a key, value, header or timestamp of the wrong type,
    │   │                                 a null key on a compacted topic, or a record the
    │   │                                 brokers call invalid
    │   ├── RecordTooLargeError           a record larger than the topic's max.message.bytes
    │   ├── OffsetOutOfRangeError         a read below the log start offset (retention removed
    │   │                                 it)
    │   ├── FencedError                   a transactional writer replaced by a newer one with
    │   │                                 the same transactional id (on Kafka, also one whose
    │   │                                 producer failed fatally)
    │   ├── NotALogError                  a directory that holds something other than a log
    │   ├── CorruptLogError               bytes on disk that fail their checksum or framing
    │   ├── UnsupportedOperationError     an operation the backend cannot perform (compact()
    │   │                                 on Kafka)
    │   ├── LogUnavailableError           Kafka brokers down or unreachable, no leader, too
    │   │                                 few in-sync replicas: worth retrying later
    │   ├── LogAuthenticationError        Kafka brokers refused the client's SASL credentials
    │   │                                 or its TLS handshake: a setting to fix
    │   └── LogIOError (OSError)          the operating system refused a file operation
    ├── EncodeError (TypeError)           a key or value its codec cannot encode
    ├── DecodeError (ValueError)          bytes a codec or the ops protocol cannot read
    │   └── ResultDecodeError             an update was applied, but the previous value it
    │                                     returns does not decode (``raw`` has its bytes)
    ├── StoreError                        a replica's store failed or holds something unreadable
    ├── PipelineError                     a Spark job of kafkakv.pipeline failed: Spark's own
    │                                     error, a missing JDBC driver, a damaged position,
    │                                     a PostgreSQL server unreachable or refusing a query
    └── MapError                          anything the replicated map refuses or fails at
        ├── TopicMismatchError (ConfigError)
        │                                 a map's existing topics have the wrong settings
        ├── WrongPartitionError (KeyError)
        │                                 a key outside the partitions a sharded replica holds
        ├── CrossPartitionError (ValueError)
        │                                 keys of one transaction in several partitions
        ├── CursorError (ValueError)      a change-feed cursor that does not parse, names
        │                                 other partitions, or lies past the log's end
        ├── CursorExpiredError            the log no longer holds what follows a cursor (a
        │                                 flush covered it): restart from a snapshot
        ├── BackupError                   a map backup that cannot be taken or restored (a
        │   │                             sharded replica holds only part of the map)
        │   ├── BackupIOError (OSError)   the system refused to read or write a backup file
        │   │                             (missing, no permission, disk full)
        │   ├── NotABackupError           a file that is not a kafkakv map backup, or of a
        │   │                             format version this kafkakv does not read
        │   ├── CorruptBackupError        a backup truncated or damaged: a line that does not
        │   │                             parse, a pair count or checksum unlike its header's
        │   └── MapNotEmptyError          a restore into a map that holds keys, without
        │                                 ``replace``
        ├── DataLossError                 ops a replica needs were removed before a flush
        │                                 covered them (ops retention too small)
        ├── UnknownMapError (KeyError)    ``create=False`` (or a reading command) for a map
        │                                 whose topics do not exist
        ├── PartitionStalledError         a replica stopped applying a partition at a record
        │                                 it cannot apply as the others do (a function it
        │                                 lacks, a store write that failed)
        └── OperationFailedError          an update decided as failed when applied: the same
            │                             on every replica, the state unchanged
            ├── FunctionError             a registered compute/merge function raised
            ├── ResultTooLargeError (RecordTooLargeError)
            │                             a computed value too large for a record
            ├── RepeatedUpdateError       an update whose id the partition applied already
            │                             (a record the transport wrote twice)
            └── UnknownFunctionError (KeyError)
                                          a function name that is not registered

Errors from below are translated at the boundary with ``raise ... from exc``, so the original
error stays attached as ``__cause__``: ``OSError`` by the embedded log and the stores, and
``KafkaException`` by the Kafka log, through one table from librdkafka's codes to these
classes (:mod:`kafkakv.log.kafka.errors`); those errors carry the librdkafka code as ``code``
and its name as ``code_name`` (``-185``, ``"_TIMED_OUT"``). An error that translates none
has ``code`` None.

The development tools (:mod:`kafkakv.dev`: a local Kafka cluster, a throwaway PostgreSQL)
have errors of their own, in :mod:`kafkakv.dev.errors`; the database never raises them.
"""

from __future__ import annotations

__all__ = [
    "BackupError",
    "BackupIOError",
    "ClosedError",
    "ConfigError",
    "CorruptBackupError",
    "CorruptLogError",
    "CrossPartitionError",
    "CursorError",
    "CursorExpiredError",
    "DataLossError",
    "DecodeError",
    "EncodeError",
    "FencedError",
    "FunctionError",
    "InvalidRecordError",
    "KafkaKVError",
    "LockTimeoutError",
    "LogAuthenticationError",
    "LogError",
    "LogIOError",
    "LogUnavailableError",
    "MapError",
    "MapNotEmptyError",
    "NotABackupError",
    "NotALogError",
    "OffsetOutOfRangeError",
    "OperationFailedError",
    "OperationTimeoutError",
    "PartitionStalledError",
    "PipelineError",
    "RecordTooLargeError",
    "RepeatedUpdateError",
    "ResultDecodeError",
    "ResultTooLargeError",
    "StoreError",
    "TopicExistsError",
    "TopicMismatchError",
    "UnknownFunctionError",
    "UnknownMapError",
    "UnknownPartitionError",
    "UnknownTopicError",
    "UnsupportedOperationError",
    "WrongPartitionError",
]


class KafkaKVError(Exception):
    """Root of every error kafkakv raises on purpose.

    ``code`` is the error code of the backend's error this one translates, and ``code_name``
    the code's name: librdkafka's (``KafkaError.code()`` and ``.name()``, e.g. ``-185`` and
    ``"_TIMED_OUT"``) for every error the Kafka log translates; None for an error that
    translates none. Both are keyword arguments, so every subclass keeps its own signature."""

    def __init__(
        self, *args: object, code: int | None = None, code_name: str | None = None
    ) -> None:
        super().__init__(*args)
        self.code = code
        self.code_name = code_name


class ConfigError(KafkaKVError, ValueError):
    """A setting or a topic config entry is unknown, of the wrong type, or out of range."""


class ClosedError(KafkaKVError):
    """A log, writer or map was used after ``close()``."""


class OperationTimeoutError(KafkaKVError, TimeoutError):
    """A blocking call did not finish within its timeout."""


class LockTimeoutError(OperationTimeoutError):
    """Another process held a lock of the embedded log (a partition's writer lock, a topic's
    lock) for the whole timeout: a writer stopped by SIGSTOP or a debugger, say. ``path`` is the
    lock file and ``pid`` the process that holds it (None when it could not be told)."""

    def __init__(self, message: str, *, path: str, pid: int | None) -> None:
        super().__init__(message)
        self.path = path
        self.pid = pid


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


class LogUnavailableError(LogError):
    """The log's servers cannot take the request now: brokers down or unreachable, a partition
    without a leader, fewer in-sync replicas than ``min.insync.replicas``. Worth retrying."""


class LogAuthenticationError(LogError):
    """The Kafka brokers refused the client: SASL authentication failed, or the TLS handshake
    did (a wrong CA, TLS spoken to a plaintext listener...). Retrying will not help; the
    message names what the client library reported."""


class EncodeError(KafkaKVError, TypeError):
    """A codec cannot encode the key or value given; nothing was appended."""


class DecodeError(KafkaKVError, ValueError):
    """Bytes that a codec, or the ops protocol, cannot read."""


class ResultDecodeError(DecodeError):
    """An update WAS applied, but the value it returns (the key's previous value, or what a
    function returned) does not decode with this replica's value codec: usually a replica that
    opened the map with another codec wrote it. ``raw`` holds the undecoded bytes, so nothing
    is lost; the update is not undone."""

    def __init__(self, message: str, raw: bytes) -> None:
        super().__init__(message)
        self.raw = raw


class MapError(KafkaKVError):
    """The replicated map refused or failed an operation."""


class TopicMismatchError(MapError, ConfigError):
    """A map's topics exist with settings the protocol cannot work with; the message names the
    topic and the setting."""


class WrongPartitionError(MapError, KeyError):
    """The key belongs to a partition this sharded replica does not hold."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "key outside this replica's partitions"


class CrossPartitionError(MapError, ValueError):
    """The keys of one transaction fall in more than one partition; ``partitions`` maps each
    partition to its keys. A transaction is one record of one partition: place keys that
    change together with a hash tag (``{user42}:balance``; see docs/maps.md)."""

    def __init__(self, message: str, partitions: dict[int, list[object]]) -> None:
        super().__init__(message)
        self.partitions = partitions


class CursorError(MapError, ValueError):
    """A change-feed cursor that does not parse, that names partitions other than the ones
    this replica holds, or that points past the end of the ops topic."""


class CursorExpiredError(MapError):
    """The changes after a cursor can no longer be told: a flush covered the position (the
    data topic keeps only each key's latest value, so the states between are gone).
    ``partition`` is the first such partition and ``flushed`` the ops offset the flush
    covered. Restart from :meth:`~kafkakv.map.ReplicaMap.snapshot`, whose cursor is current."""

    def __init__(self, message: str, *, partition: int, flushed: int) -> None:
        super().__init__(message)
        self.partition = partition
        self.flushed = flushed


class BackupError(MapError):
    """A backup of a map cannot be taken or restored (see :mod:`kafkakv.map.backup`): a
    sharded replica holds only part of the map, for one; the subclasses say the rest."""


class BackupIOError(BackupError, OSError):
    """The operating system refused to read or write a backup file (it does not exist, no
    permission, disk full); ``__cause__`` holds the original ``OSError``. Nothing was
    restored, and a backup being written leaves no file behind."""


class NotABackupError(BackupError):
    """The file is not a kafkakv map backup (its first line is not a backup header), or it
    is of a format version this kafkakv does not read. Nothing was restored."""


class CorruptBackupError(BackupError):
    """The backup is truncated or damaged: a header field or a line that does not parse, or
    pairs whose count or checksum differ from the header's. Found before anything is
    restored. ``line`` is the first line found wrong (1 is the header), when one is."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


class MapNotEmptyError(BackupError):
    """A restore into a map that holds keys, without ``replace``: nothing was written.
    ``count`` is the number of keys it holds."""

    def __init__(self, message: str, *, count: int) -> None:
        super().__init__(message)
        self.count = count


class DataLossError(MapError):
    """Ops a replica must replay are gone from the ops topic (retention removed them before a
    flush covered them); the replica cannot be made equal to the others."""


class UnknownMapError(MapError, KeyError):
    """The map's topics do not exist, and the caller asked not to create them
    (``db.map(name, create=False)``, ``kafkakv map get``...)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown map"


class PartitionStalledError(MapError):
    """This replica stopped applying a partition at a record it cannot apply exactly as the
    other replicas do, rather than skip it and diverge: a compute or merge function that is
    not registered in this process, a store write that failed. Reads and updates of that
    partition raise it until the cause is fixed (register the function; applying resumes by
    itself) or the process restarts with it fixed. ``partition`` and ``offset`` name the ops
    record, ``function`` the missing function's name when that is the cause."""

    def __init__(
        self, message: str, *, partition: int, offset: int, function: str | None = None
    ) -> None:
        super().__init__(message)
        self.partition = partition
        self.offset = offset
        self.function = function


class OperationFailedError(MapError):
    """An update was applied and failed, identically on every replica; the state is unchanged."""


class FunctionError(OperationFailedError):
    """A registered compute or merge function raised. ``function`` is its name; ``error`` the
    text of what it raised (the original exception is ``__cause__`` on the writer's replica)."""

    def __init__(self, function: str, error: BaseException) -> None:
        super().__init__(f"function {function!r} raised {type(error).__name__}: {error}")
        self.function = function
        self.error = f"{type(error).__name__}: {error}"


class ResultTooLargeError(OperationFailedError, RecordTooLargeError):
    """A compute or merge gave a value that, with its key, is larger than a record of the
    map's topics may hold; nothing changed, on every replica."""


class RepeatedUpdateError(OperationFailedError):
    """An ops record whose update id (origin and sequence number) its partition applied
    already: every replica skips it alike (see :mod:`kafkakv.map.dedup`). A caller sees it
    only for a record of its own that reached the log so late that the replicas had stopped
    waiting for its number; it was not applied."""


class UnknownFunctionError(OperationFailedError, KeyError):
    """No function is registered under this name (see :mod:`kafkakv.functions`)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no function registered as {name!r}; register it in every process")
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0])


class StoreError(KafkaKVError):
    """A replica's store failed (disk full, I/O error, a key it cannot hold) or holds something
    unreadable (a directory that is not a store); ``__cause__`` holds the backend's error."""


class PipelineError(KafkaKVError):
    """A Spark job of :mod:`kafkakv.pipeline` failed: Spark raised (the message gives the
    first line that says why, a kafkakv error raised in a worker among them; ``__cause__``
    holds Spark's exception), the PostgreSQL JDBC driver is not on Spark's class path or
    could not be fetched, PostgreSQL cannot be reached (the message names ``host:port``) or
    refused a query (``__cause__`` holds psycopg's error), or a stored ingest position does
    not read back."""
