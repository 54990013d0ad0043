"""EmbeddedLog: the default log, a directory on local disk shared by many processes.

Layout of a log directory::

    kafkakv-log.json              marks the directory as a log (format version)
    topics/<name>/topic.json      partition count and config, written once at creation
    topics/<name>/<partition>/    one partition (see partition.py)
    txn/                          journals of transactional writers (see txn.py)

Every process that opens the directory gets the same topics and records; appends from any of
them are serialised per partition by file locks, and readers take no lock at all. Any number
of processes may create the same new log at once (the marker is linked in whole, first).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence

from kafkakv.errors import (
    ClosedError,
    ConfigError,
    CorruptLogError,
    InvalidRecordError,
    LockTimeoutError,
    LogIOError,
    NotALogError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from kafkakv.log.base import (
    LATEST_BYTES,
    Batch,
    EndMark,
    EntryBatch,
    FailureCallback,
    LatestBatch,
    Log,
    OwnAppends,
    Problem,
    Record,
    TopicPartition,
    new_tuple,
)
from kafkakv.log.columns import Allocate, Columns
from kafkakv.log.config import TopicConfig, parse_topic_config, validate_topic_name
from kafkakv.log.embedded import fs
from kafkakv.log.embedded.bell import new_token
from kafkakv.log.embedded.check import check_partition
from kafkakv.log.embedded.cleaner import CleanResult, clean_partition, enforce_retention
from kafkakv.log.embedded.columns import finished, new_latest_columns
from kafkakv.log.embedded.format import encode_records
from kafkakv.log.embedded.frame import plain_body_columns
from kafkakv.log.embedded.head import HeadFile, HeadState
from kafkakv.log.embedded.manifest import Manifest, SegmentInfo, segment_name
from kafkakv.log.embedded.notify import ChangeNotifier
from kafkakv.log.embedded.partition import Partition, now_ms
from kafkakv.log.embedded.settings import EmbeddedSettings, FsyncPolicy
from kafkakv.log.embedded.txn import EmbeddedLogWriter, TransactionManager
from kafkakv.log.records import RECORD_OVERHEAD

__all__ = ["EmbeddedLog"]

_log = logging.getLogger("kafkakv.log.embedded")
_MARKER = "kafkakv-log.json"
_FORMAT = 2  # 2: batches of magic 2 (their CRC covers the base offset; see format.py)
_UPGRADED = (1,)  # earlier formats this kafkakv reads; opening one rewrites its marker


def _parse_topic(raw: bytes, path: str) -> tuple[int, TopicConfig]:
    """``(partitions, config)`` of a topic.json; anything else raises CorruptLogError."""
    try:
        doc = json.loads(raw)
        partitions = doc["partitions"]
        if type(partitions) is not int or partitions < 1:
            raise TypeError(f"partitions {partitions!r}")
        config = doc["config"]
        if not isinstance(config, dict):
            raise TypeError(f"config {config!r}")
        return partitions, parse_topic_config(config)
    except (ValueError, KeyError, TypeError, ConfigError) as exc:
        raise CorruptLogError(f"unreadable topic description {path}: {exc!r}", path=path) from exc


class EmbeddedLog(Log):
    """A log stored in ``path``; created if missing or empty.

    ``fsync`` is ``"always"``, ``"interval"`` (default) or ``"never"`` (see
    :class:`~kafkakv.log.embedded.settings.FsyncPolicy` for what each promises).
    ``background_cleaner`` runs compaction and retention every ``cleaner_interval_s`` in a
    daemon thread. ``lock_timeout`` is how long (seconds) a call waits for a lock another
    process or thread holds when the call is given no ``timeout`` of its own; then it raises
    :class:`~kafkakv.errors.LockTimeoutError` naming the lock file and the holder's pid. Reads
    take no lock. ``private=True`` creates every directory 0700 and every file 0600 (else 0755
    and 0644, less the umask), for this log object's lifetime; a map's LMDB store opened on it
    follows. Raises :class:`~kafkakv.errors.NotALogError` for a non-empty directory that
    is not a log, and :class:`~kafkakv.errors.ConfigError` for a path with a NUL byte.

    >>> import tempfile
    >>> with EmbeddedLog(tempfile.mkdtemp()) as log:
    ...     log.create_topic("events", partitions=2)
    ...     log.append("events", 0, [Record(b"k", b"hello")])
    ...     [r.value for r in log.read("events", 0, 0)]
    0
    [b'hello']
    """

    end_offset_is_linearizable = True  # the head file is the one copy every process publishes to
    appends_contiguously = True  # a batch is one write under the partition's lock

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy | str = FsyncPolicy.INTERVAL,
        fsync_interval_ms: int = 1000,
        background_cleaner: bool = True,
        cleaner_interval_s: float = 5.0,
        lock_timeout: float = 30.0,
        private: bool = False,
    ):
        given = os.fspath(path)
        if "\0" in given:
            raise ConfigError(f"a log path cannot contain a NUL byte: {given!r}")
        self.settings = EmbeddedSettings.make(
            fsync, fsync_interval_ms, background_cleaner, cleaner_interval_s, lock_timeout, private
        )
        self.path = os.path.abspath(given)
        self._topics_dir = os.path.join(self.path, "topics")
        self.private = self.settings.private
        self._open_directory()
        self._lock = threading.Lock()
        self._meta: dict[str, tuple[int, TopicConfig]] = {}
        self._parts: dict[tuple[str, int], Partition] = {}
        self._closed = False
        self._token = new_token()  # names this log's bells (see bell.py)
        self._notifier = ChangeNotifier(self._token, self.settings.dir_mode)
        self._txn = TransactionManager(self, os.path.join(self.path, "txn"))
        try:
            self._txn.roll_forward_all()  # finish transactions a crashed writer committed
        except BaseException:
            for part in self._parts.values():
                part.close()
            self._notifier.close()
            raise
        self.background_errors: list[BaseException] = []
        """Errors the background cleaner met (it logs them and keeps going)."""
        self._stop = threading.Event()
        self._cleaner: threading.Thread | None = None
        if self.settings.background_cleaner:
            self._cleaner = threading.Thread(
                target=self._clean_loop, name="kafkakv-cleaner", daemon=True
            )
            self._cleaner.start()
        self._flusher: threading.Thread | None = None
        if self.settings.fsync is FsyncPolicy.INTERVAL and self.settings.fsync_interval_ms > 0:
            self._flusher = threading.Thread(
                target=self._flush_loop, name="kafkakv-flusher", daemon=True
            )
            self._flusher.start()

    def _open_directory(self) -> None:
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise NotALogError(f"{self.path} is not a directory, so it cannot be a kafkakv log")
        try:
            fs.makedirs(self.path, self.settings.dir_mode, exist_ok=True)
            marker = os.path.join(self.path, _MARKER)
            if not os.path.exists(marker):
                self._create_marker(marker)
            with open(marker, encoding="utf-8") as f:
                try:
                    doc = json.load(f)
                except ValueError as exc:
                    raise NotALogError(f"{marker} is not a kafkakv log marker") from exc
            if isinstance(doc, dict) and doc.get("format") in _UPGRADED:
                # This kafkakv writes batches the earlier one refuses: from now on, an earlier
                # kafkakv that opens the log says so, rather than find the batches corrupt.
                fs.replace_file(
                    marker,
                    json.dumps({"format": _FORMAT}).encode(),
                    self.settings.file_mode,
                    tmp=f"{marker}.tmp.{os.getpid()}.{threading.get_ident()}",
                )
            elif not isinstance(doc, dict) or doc.get("format") != _FORMAT:
                raise NotALogError(
                    f"{self.path} has log format {doc!r}; this kafkakv reads {_FORMAT} and "
                    f"{', '.join(map(str, _UPGRADED))}"
                )
            if not os.path.isdir(self._topics_dir):
                fs.makedirs(self._topics_dir, self.settings.dir_mode, exist_ok=True)
                fs.fsync_dir(self.path)
        except NotADirectoryError as exc:
            raise NotALogError(f"{self.path} is not a directory") from exc
        except OSError as exc:
            if isinstance(exc, NotALogError):
                raise
            raise LogIOError(exc.errno or 0, f"cannot open log {self.path}: {exc}") from exc

    def _create_marker(self, marker: str) -> None:
        """Make an empty directory a log: the marker first, whole, before anything else.

        Safe when many processes create the same log at once. Each writes the marker under a
        temporary name and ``link``s it into place (only the first link succeeds, and a link
        never shows a half-written file); the others' temporary files do not count as
        content. So a racing opener sees the directory empty, or marked, never half made.
        The marker and the log directory's own name are synced before anything is put in it
        (under every fsync policy): a power loss never leaves topics without their marker.
        """
        prefix = _MARKER + ".tmp."
        entries = [e for e in os.listdir(self.path) if not e.startswith(prefix)]
        if _MARKER in entries:
            return
        if entries:
            raise NotALogError(f"{self.path} is not empty and is not a kafkakv log (no {_MARKER})")
        tmp = f"{marker}.tmp.{os.getpid()}.{threading.get_ident()}"
        try:
            data = json.dumps({"format": _FORMAT}).encode()
            fs.write_file(tmp, [data], self.settings.file_mode, sync=True)
            try:
                fs.link(tmp, marker)
            except FileExistsError:
                pass  # another process made it first: theirs is read below
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP):
                    raise
                fs.replace(tmp, marker)  # no hard links here: same content, atomic all the same
        finally:
            with contextlib.suppress(FileNotFoundError):
                fs.unlink(tmp)
        fs.fsync_dir(self.path)
        fs.fsync_dir(os.path.dirname(self.path))

    def _deadline(self, timeout: float | None) -> float:
        """When a call given ``timeout`` stops waiting for locks (a :func:`time.monotonic`
        value); None means the log's ``lock_timeout``, and a negative or NaN one 0."""
        if timeout is None:
            timeout = self.settings.lock_timeout
        elif not timeout >= 0:
            timeout = 0.0
        return time.monotonic() + timeout

    # -- helpers ----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the log at {self.path} is closed")

    def _topic(self, topic: str) -> tuple[int, TopicConfig]:
        meta = self._meta.get(topic)
        if meta is not None:
            return meta
        if not isinstance(topic, str):
            raise UnknownTopicError(f"a topic name must be a str, not {type(topic).__name__}")
        path = os.path.join(self._topics_dir, topic, "topic.json")
        if "/" in topic or topic.startswith("."):
            raise UnknownTopicError(f"no topic {topic!r} in {self.path}")
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            if os.path.isdir(os.path.dirname(path)):
                raise CorruptLogError(
                    f"topic {topic!r} has a directory but no {path}: its description is lost",
                    path=path,
                ) from None
            raise UnknownTopicError(f"no topic {topic!r} in {self.path}") from None
        except OSError as exc:
            raise CorruptLogError(f"unreadable topic description {path}: {exc}", path=path) from exc
        meta = _parse_topic(raw, path)
        self._meta[topic] = meta
        return meta

    def _partition(self, topic: str, partition: int) -> Partition:
        if self._closed:  # every operation passes here: no call while open
            self._check_open()
        part = self._parts.get((topic, partition))
        if part is not None:
            return part
        count, config = self._topic(topic)
        if type(partition) is not int or not 0 <= partition < count:
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0..{count - 1}; there is no partition {partition!r}"
            )
        with self._lock:
            if self._closed:  # closed meanwhile: close() releases the partitions under this lock
                self._check_open()
            part = self._parts.get((topic, partition))
            if part is None:
                part = Partition(
                    topic,
                    partition,
                    os.path.join(self._topics_dir, topic, str(partition)),
                    config,
                    self.settings,
                    self._txn.committed,
                    self._txn.resolve_pending,
                    self._notifier,
                    self._token,
                )
                self._parts[(topic, partition)] = part
        return part

    def _encode(self, part: Partition, records: Sequence[Record]) -> tuple[bytes, int, int, int]:
        kind = type(records)  # a list or tuple passes without the Sequence ABC's Python check
        if (
            kind is not list
            and kind is not tuple
            and (isinstance(records, Record) or not isinstance(records, Sequence))
        ):
            raise InvalidRecordError(
                f"append takes a sequence of Record, not {type(records).__name__}"
            )
        body, base_ts, max_ts = encode_records(
            records,
            time.time_ns() // 1_000_000,  # now_ms(), one call fewer on every append
            max_message_bytes=part.config.max_message_bytes,
            null_keys=part.null_keys,
        )
        return body, len(records), base_ts, max_ts

    # -- topics -----------------------------------------------------------------------
    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, object] | None = None
    ) -> None:
        """Create ``name``; atomic (a directory rename), so concurrent creators see one win."""
        self._check_open()
        validate_topic_name(name)
        if type(partitions) is not int or not 1 <= partitions <= 100_000:
            raise ConfigError(f"partitions must be an int from 1 to 100000, not {partitions!r}")
        cfg = parse_topic_config(config)
        final = os.path.join(self._topics_dir, name)
        if os.path.exists(final):
            raise TopicExistsError(f"topic {name!r} already exists in {self.path}")
        tmp = os.path.join(self._topics_dir, f".tmp-{name}-{uuid.uuid4().hex}")
        try:
            dir_mode, file_mode = self.settings.dir_mode, self.settings.file_mode
            fs.makedirs(tmp, dir_mode)
            desc = json.dumps({"partitions": partitions, "config": cfg.to_kafka()}, indent=1)
            fs.write_file(os.path.join(tmp, "topic.json"), [desc.encode()], file_mode, sync=True)
            now = now_ms()
            for p in range(partitions):
                pdir = os.path.join(tmp, str(p))
                fs.makedirs(pdir, dir_mode)
                seg = SegmentInfo(base=0, name=segment_name(0, 0), created_ms=now)
                for ext in (".log", ".index"):
                    fs.write_file(os.path.join(pdir, seg.name + ext), [], file_mode, sync=False)
                HeadFile.create(
                    os.path.join(pdir, "head"),
                    HeadState(
                        seq=1,
                        next_offset=0,
                        start_offset=0,
                        active_base=0,
                        active_pos=0,
                        layout_version=1,
                        last_index_pos=0,
                    ),
                    file_mode,
                )
                # Last, so that its directory sync covers the names made before it.
                Manifest(version=1, segments=(seg,)).save(pdir, mode=file_mode)
            fs.fsync_dir(tmp)  # the partition directories' names
            try:
                fs.rename(tmp, final)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise TopicExistsError(
                        f"topic {name!r} already exists in {self.path}"
                    ) from None
                raise
            fs.fsync_dir(self._topics_dir)
        except OSError as exc:
            raise LogIOError(exc.errno or 0, f"cannot create topic {name!r}: {exc}") from exc
        finally:
            if os.path.exists(tmp):
                fs.rmtree(tmp, ignore_errors=True)

    def topics(self) -> list[str]:
        """Every topic directory, including one whose ``topic.json`` is lost or damaged (its
        :meth:`partitions` raises :class:`CorruptLogError`, and :meth:`check` reports it):
        damage never makes a topic vanish. One directory listing."""
        self._check_open()
        return sorted(
            n
            for n in os.listdir(self._topics_dir)
            if not n.startswith(".") and os.path.isdir(os.path.join(self._topics_dir, n))
        )

    def partitions(self, topic: str) -> int:
        self._check_open()
        return self._topic(topic)[0]

    def topic_config(self, topic: str) -> dict[str, str]:
        self._check_open()
        return self._topic(topic)[1].to_kafka()

    # -- records ----------------------------------------------------------------------
    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        timeout: float | None = None,
        origin: object = None,
    ) -> int:
        """Append one atomic batch; see :meth:`Log.append`. ``origin``: who applies it itself
        (see :meth:`own_appends`).

        Waits for the partition's lock at most ``timeout`` seconds (None: ``lock_timeout``),
        then raises :class:`~kafkakv.errors.LockTimeoutError`. Costs: encoding O(bytes)
        outside the lock; under the lock a handful of system calls (flock, a pread after the
        published end, pwrite of the batch, pwrite of the head), plus ``fdatasync`` under the ``always`` policy.
        """
        part = self._parts.get((topic, partition))  # every append passes here: no call to look
        if part is None or self._closed:
            part = self._partition(topic, partition)  # opens it, or refuses
        body, count, base_ts, max_ts = self._encode(part, records)
        if timeout is None:
            deadline = None
        elif timeout >= 0:  # as _deadline, one call fewer
            deadline = time.monotonic() + timeout
        else:
            deadline = self._deadline(timeout)
        return part.append(body, count, base_ts, max_ts, deadline, origin)

    def send(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        on_failure: FailureCallback | None = None,
        *,
        timeout: float | None = None,
        origin: object = None,
    ) -> None:
        """See :meth:`Log.send`: one :meth:`append` (stored before it returns, so failures
        raise and ``on_failure`` is never called), waiting for the lock as it does."""
        self.append(topic, partition, records, timeout=timeout, origin=origin)

    def frames_columns(self) -> bool:
        """True: see :meth:`send_columns`."""
        return True

    def send_columns(
        self,
        topic: str,
        partition: int,
        columns: Columns,
        *,
        timeout: float | None = None,
        origin: object = None,
    ) -> None:
        """See :meth:`Log.send_columns`: one :meth:`append` of a body framed straight from the
        columns' buffers (``frame.plain_body_columns``, in C), as atomic as any append."""
        if columns.apart or not columns.length:
            super().send_columns(topic, partition, columns, timeout=timeout)
            return
        part = self._parts.get((topic, partition))
        if part is None or self._closed:
            part = self._partition(topic, partition)  # opens it, or refuses
        length, wide, key_offsets, key_data, value_offsets, value_data, _apart = columns
        body = plain_body_columns(
            length,
            wide,
            key_offsets,
            key_data,
            value_offsets,
            value_data,
            part.config.max_message_bytes - RECORD_OVERHEAD,
        )
        if body is None:  # a row too large: the records' path raises, naming it
            records = [Record(k, v) for k, v in columns.pairs()]
            self.append(topic, partition, records, timeout=timeout, origin=origin)
            return
        now = time.time_ns() // 1_000_000
        deadline = None if timeout is None else self._deadline(timeout)
        part.append(body, length, now, now, deadline, origin)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> list[Record]:
        """See :meth:`Log.read`. Lock-free; one sparse-index lookup, then sequential reads."""
        part = self._reading(topic, partition, offset, max_records)
        records: list[Record] = part.read(offset, max_records, max_bytes)[0]
        return records

    def read_batch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> Batch:
        """See :meth:`Log.read_batch`: the records, and the next offset the partition's read
        found (one past the last record)."""
        part = self._parts.get((topic, partition))
        if part is None or self._closed or type(offset) is not int or offset < 0 or max_records < 1:
            part = self._reading(topic, partition, offset, max_records)  # or refuses
        return new_tuple(Batch, part.read(offset, max_records, max_bytes))

    def _reading(self, topic: str, partition: int, offset: int, max_records: int) -> Partition:
        """The partition a read asks for, once its arguments are checked."""
        part = self._parts.get((topic, partition))  # every read passes here: no call to look
        if part is None or self._closed:
            part = self._partition(topic, partition)  # opens it, or refuses
        if type(offset) is not int or offset < 0:
            raise ConfigError(f"offset must be an int >= 0, not {offset!r}")
        if max_records < 1:
            raise ConfigError(f"max_records must be >= 1, not {max_records!r}")
        return part

    def read_entries(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> EntryBatch:
        """See :meth:`Log.read_entries`: straight from the decoded batches, no records built."""
        part = self._reading(topic, partition, offset, max_records)
        return EntryBatch(*part.read(offset, max_records, max_bytes, "entries"))

    def read_latest(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
    ) -> LatestBatch:
        """See :meth:`Log.read_latest`: one dict straight from the stored batches' bytes, no
        record, entry or row built (:func:`~kafkakv.log.embedded.frame.latest_into`)."""
        part = self._reading(topic, partition, offset, max_records)
        return LatestBatch(*part.read(offset, max_records, max_bytes, "latest"))

    def latest_columns(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        apart: Sequence[bytes] = (),
        allocate: Allocate | None = None,
    ) -> Columns:
        """See :meth:`Log.latest_columns`: the stored batches' bodies go to a C accumulator
        (:mod:`~kafkakv.log.embedded.columns`), which keeps the last value per key as where
        it lies in them, and writes the columns once at the end."""
        part = self._reading(topic, partition, offset, 1)
        into = new_latest_columns()
        while True:
            _, after = part.read(offset, 1 << 62, LATEST_BYTES, "columns", into)
            if after == offset:
                return finished(into, apart, allocate)
            offset = after

    def start_offset(self, topic: str, partition: int) -> int:
        return self._partition(topic, partition).start_offset()

    def end_offset(self, topic: str, partition: int, *, timeout: float | None = None) -> int:
        return self._partition(topic, partition).end_offset()  # shared memory: no wait

    def end_mark(self, topic: str, partition: int) -> EndMark | None:
        return self._partition(topic, partition).end_mark()

    def data_bytes(self, topic: str, partition: int) -> int:
        """Bytes of record batches in ``partition`` of ``topic`` (what ``kafkakv log describe``
        shows): file sizes, less the space a segment has reserved past its data."""
        return self._partition(topic, partition).data_bytes()

    def wait(self, topic: str, partition: int, offset: int, timeout: float | None) -> bool:
        """See :meth:`Log.wait`. Sleeps on inotify events of the partition's head file."""
        part = self._partition(topic, partition)
        arrived = self._notifier.wait_for(
            part._head.path, lambda: self._closed or part.end_offset() > offset, timeout
        )
        self._check_open()  # closed while waiting: say so rather than answer
        return arrived

    def wait_any(
        self,
        positions: Mapping[TopicPartition, int],
        timeout: float | None,
        *,
        deaf_to: object = None,
    ) -> set[TopicPartition]:
        """See :meth:`Log.wait_any`. Sleeps until another log rings a partition's bell or this
        one appends to it (not for ``deaf_to``: see :meth:`own_appends`)."""
        watched = [(tp, self._partition(*tp), offset) for tp, offset in positions.items()]
        found: set[TopicPartition] = set()  # what the last look found (one look per wake-up)

        def ready() -> bool:
            if self._closed:  # first: close() releases the head files after waking waiters
                return True
            found.clear()
            for tp, part, offset in watched:
                if part.published().next_offset > offset:  # end_offset(), one call fewer
                    found.add(tp)
            return bool(found)

        self._notifier.wait_for_any(
            [part._head.path for _, part, _ in watched], ready, timeout, deaf_to
        )
        if self._closed:  # closed while waiting: say so rather than answer
            self._check_open()
        return found

    def own_appends(self, applier: object) -> OwnAppends:
        """See :meth:`Log.own_appends`: appends attributed to ``applier`` wake no other process
        (they ring this log's bell, which only other logs watch) and none of ``applier``'s
        waits in this one; they wake every other waiter."""
        return OwnAppends(
            functools.partial(self.append, origin=applier),
            functools.partial(self.send, origin=applier),
            functools.partial(self.wait_any, deaf_to=applier),
        )

    def writer(self, transactional_id: str, *, timeout: float | None = None) -> EmbeddedLogWriter:
        """See :meth:`Log.writer`. Rolls forward the id's last transaction if it was cut off.

        Waits for the id's lock (and, to roll forward, partition locks) at most ``timeout``
        seconds (None: ``lock_timeout``), then raises :class:`~kafkakv.errors.LockTimeoutError`.
        """
        self._check_open()
        return EmbeddedLogWriter(self, transactional_id, self._deadline(timeout))

    # -- maintenance ------------------------------------------------------------------
    def compact(
        self, topic: str, partition: int | None = None, *, timeout: float | None = None
    ) -> list[CleanResult]:
        """Clean now (whatever the dirty ratio), waiting for a cleaner in another process.

        Raises :class:`~kafkakv.errors.ConfigError` when the topic is not compacted, and
        :class:`~kafkakv.errors.LockTimeoutError` when a partition's cleaner lock or write lock
        stays held for ``timeout`` seconds (None: ``lock_timeout``).
        """
        count, config = self._topic(topic)
        if not config.compact:
            raise ConfigError(
                f"topic {topic!r} has cleanup.policy={','.join(sorted(config.cleanup_policy))}; it is not compacted"
            )
        numbers = range(count) if partition is None else [partition]
        results = []
        for p in numbers:
            result = clean_partition(
                self._partition(topic, p), force=True, block=True, timeout=timeout
            )
            results.append(result or CleanResult())
        return results

    def enforce_retention(self, topic: str, *, timeout: float | None = None) -> int:
        """Apply ``retention.bytes`` / ``retention.ms`` now; return segments removed.

        Waits for each partition's lock at most ``timeout`` seconds (None: ``lock_timeout``).
        """
        count, _ = self._topic(topic)
        return sum(
            enforce_retention(self._partition(topic, p), timeout=timeout) for p in range(count)
        )

    def check(self) -> list[Problem]:
        """See :meth:`Log.check`. Reads every segment and index in full."""
        self._check_open()
        problems: list[Problem] = []
        for topic in self.topics():
            try:
                count, _ = self._topic(topic)
            except CorruptLogError as exc:
                problems.append(Problem(topic, None, "topic.json", str(exc)))
                continue
            for p in range(count):
                problems.extend(check_partition(self._partition(topic, p)))
        return problems

    def _clean_loop(self) -> None:
        # A lock held elsewhere delays a round by one interval at most, and close() as long.
        # A busy writer holds it often: the partition is cleaned a round later, no error. A
        # lock out of reach for lock_timeout (a stopped writer) is reported, once per period.
        timeout = min(self.settings.lock_timeout, self.settings.cleaner_interval_s)
        missed: dict[tuple[str, int], float] = {}  # partition -> since when its lock is
        while not self._stop.wait(self.settings.cleaner_interval_s):
            try:
                for topic in self.topics():
                    try:
                        count, config = self._topic(topic)
                    except CorruptLogError as exc:  # a damaged topic: the others go on
                        self._background_error(exc)
                        continue
                    for p in range(count):
                        if self._stop.is_set():
                            return
                        part = self._partition(topic, p)
                        try:
                            if config.compact:
                                clean_partition(part, force=False, timeout=timeout)
                            if config.delete:
                                enforce_retention(part, timeout=timeout)
                        except LockTimeoutError as exc:
                            now = time.monotonic()
                            since = missed.setdefault((topic, p), now)
                            if now - since >= self.settings.lock_timeout:
                                self._background_error(exc)
                                missed[(topic, p)] = now
                        except CorruptLogError as exc:  # damaged files
                            self._background_error(exc)
                        else:
                            missed.pop((topic, p), None)
            except ClosedError:
                return
            except Exception as exc:  # keep cleaning other partitions next round
                _log.exception("background cleaner of %s failed", self.path)
                self.background_errors.append(exc)
                del self.background_errors[:-100]

    def _flush_loop(self) -> None:
        """Under ``fsync=interval``: every ``fsync_interval_ms``, ``fdatasync`` the partitions
        appended to since their last sync, outside their locks (see Partition.sync_pending)."""
        every = min(self.settings.fsync_interval_ms / 1000, threading.TIMEOUT_MAX)
        while not self._stop.wait(every):
            self._flush_pending()

    def _flush_pending(self) -> None:
        for part in list(self._parts.values()):
            try:
                part.sync_pending()
            except OSError as exc:  # an fdatasync failed: those batches may not be on disk
                _log.error("flusher of %s: cannot sync %s: %s", self.path, part.dir, exc)
                self.background_errors.append(exc)
                del self.background_errors[:-100]

    def _background_error(self, exc: Exception) -> None:
        _log.warning("background cleaner of %s: %s", self.path, exc)
        self.background_errors.append(exc)
        del self.background_errors[:-100]

    # -- lifecycle --------------------------------------------------------------------
    def close(self) -> None:
        """Stop the cleaner and flusher, flush (unless fsync is ``never``) and release every
        file."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for thread in (self._cleaner, self._flusher):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=30)
        self._notifier.close()
        with self._lock:
            for part in self._parts.values():
                if self.settings.fsync is not FsyncPolicy.NEVER:
                    with contextlib.suppress(OSError):
                        part.sync_locked(force=True)
                part.close()
            self._parts.clear()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"EmbeddedLog({self.path!r}, {state})"
