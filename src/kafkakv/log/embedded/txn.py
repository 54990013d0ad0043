"""Transactional writers for the embedded log: atomic batches across partitions, fencing.

One journal file per transactional id (``txn/<digest>.journal``, replaced atomically) holds:

* ``epoch``: bumped by every :meth:`EmbeddedLog.writer` call; a writer whose epoch is no longer
  the journal's is fenced;
* ``pending``: the heads the last committed transaction publishes, with the state each
  partition had before it (so a roll-forward can tell whether it already happened);
* ``high_water``: per partition, the segment and end position of the last committed batch,
  which lets recovery after a reboot tell committed transactional batches from abandoned ones.

A commit: lock the id, check the epoch, lock every partition (sorted), write each batch
(flagged transactional, not yet published), ``fdatasync`` them, write and sync the journal (the
commit point), publish every head. A commit syncs under every fsync policy: only an order on
disk (the batches before the journal, the journal before any later batch) keeps a transaction
whole through a power loss. Without it the crash-state explorer found a transaction visible in
one partition and lost in the other, and a journal lost behind batches synced later, so that
recovery refused the partition (tests/log/test_crash_explorer.py). A writer that dies before the journal leaves only
unpublished tails, which the next writer of each partition truncates; one that dies after it
leaves a journal that the next writer of any of those partitions, or the next ``writer()`` call
for the id, rolls forward. After any crash a transaction is visible everywhere or nowhere.

Every lock wait (the id's lock, each partition's) ends at the call's deadline with
:class:`~kafkakv.errors.LockTimeoutError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kafkakv.errors import (
    ClosedError,
    ConfigError,
    CorruptLogError,
    FencedError,
    InvalidRecordError,
    LockTimeoutError,
    UnknownTopicError,
)
from kafkakv.log.base import LogWriter, Record, TopicPartition
from kafkakv.log.embedded import fs
from kafkakv.log.embedded.flock import acquire_until, flock_until, lock_timeout_error, unflock
from kafkakv.log.embedded.format import HEADER_SIZE, parse_header, verify_crc
from kafkakv.log.embedded.head import HeadState
from kafkakv.log.embedded.partition import Partition, PendingTailError
from kafkakv.log.embedded.settings import EmbeddedSettings

__all__ = ["EmbeddedLogWriter", "Journal", "TransactionManager", "producer_id"]


def producer_id(transactional_id: str) -> int:
    """The 32-bit tag stored in the batches of one transactional id (never 0)."""
    return zlib.crc32(transactional_id.encode()) or 1


@dataclass
class Journal:
    transactional_id: str
    epoch: int = 0
    seq: int = 0
    pending: list[dict[str, int | str]] = field(default_factory=list)
    high_water: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "transactional_id": self.transactional_id,
                "epoch": self.epoch,
                "seq": self.seq,
                "pending": self.pending,
                "high_water": self.high_water,
            }
        )

    @staticmethod
    def from_json(text: str | bytes, path: str) -> Journal:
        """Parse a journal; anything that is not one (bad bytes, bad JSON, a field missing or
        of the wrong type) raises :class:`CorruptLogError` naming ``path``."""
        try:
            doc = json.loads(text)
            journal = Journal(
                doc["transactional_id"],
                doc["epoch"],
                doc["seq"],
                doc["pending"],
                doc["high_water"],
            )
            if not isinstance(journal.transactional_id, str):
                raise TypeError(f"transactional_id {journal.transactional_id!r}")
            if type(journal.epoch) is not int or type(journal.seq) is not int:
                raise TypeError(f"epoch {journal.epoch!r}, seq {journal.seq!r}")
            if not isinstance(journal.pending, list) or not isinstance(journal.high_water, dict):
                raise TypeError("pending or high_water")
            for entry in journal.pending:
                if not isinstance(entry, dict) or not isinstance(entry.get("topic"), str):
                    raise TypeError(f"pending entry {entry!r}")
                for name in _PENDING_INTS:
                    if type(entry[name]) is not int:
                        raise TypeError(f"pending entry {entry!r}: {name}")
            for key, mark in journal.high_water.items():
                if not (
                    isinstance(mark, list) and len(mark) == 2 and all(type(v) is int for v in mark)
                ):
                    raise TypeError(f"high water {key}: {mark!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptLogError(
                f"unreadable transaction journal {path}: {exc!r}", path=path
            ) from exc
        return journal


_PENDING_INTS = (
    "partition",
    "active_base",
    "old_pos",
    "old_next",
    "new_pos",
    "new_next",
    "last_index_pos",
)


def _tp_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


class TxnLog(Protocol):
    """What the transactions need of the log they write to (the embedded log is one): its
    settings, its partitions and their records' encoding, its lock deadline, its transaction
    manager, and whether it is open."""

    @property
    def settings(self) -> EmbeddedSettings: ...

    @property
    def _txn(self) -> TransactionManager: ...

    def _check_open(self) -> None: ...

    def _partition(self, topic: str, partition: int) -> Partition: ...

    def _encode(self, part: Partition, records: Sequence[Record]) -> tuple[bytes, int, int, int]:
        """A batch of ``records`` for ``part``: its bytes, record count, and base and max
        timestamps."""
        ...

    def _deadline(self, timeout: float | None) -> float: ...


class TransactionManager:
    """Journals, id locks and roll-forward for one open embedded log."""

    def __init__(self, log: TxnLog, directory: str):
        self._log = log
        self.dir = directory
        if not os.path.isdir(directory):
            fs.makedirs(directory, log.settings.dir_mode, exist_ok=True)
            fs.fsync_dir(os.path.dirname(directory))  # or its journals may vanish with it
        self._id_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _stem(self, transactional_id: str) -> str:
        return os.path.join(
            self.dir, hashlib.blake2b(transactional_id.encode(), digest_size=16).hexdigest()
        )

    @contextlib.contextmanager
    def id_lock(self, transactional_id: str, deadline: float) -> Iterator[None]:
        """Hold the lock of ``transactional_id`` (thread lock, then ``flock``), waiting for
        it until ``deadline`` at most."""
        with self._guard:
            tlock = self._id_locks.setdefault(transactional_id, threading.Lock())
        path = self._stem(transactional_id) + ".lock"
        what = f"the lock of transactional id {transactional_id!r}"
        start = time.monotonic()
        if not acquire_until(tlock, deadline):
            raise lock_timeout_error(what, path, time.monotonic() - start, thread_lock=True)
        try:
            fd = fs.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self._log.settings.file_mode)
            try:
                held = flock_until(fd, path, deadline, what)
                try:
                    yield
                finally:
                    unflock(held, fd)
            finally:
                fs.close(fd)
        finally:
            tlock.release()

    def load(self, transactional_id: str) -> Journal:
        path = self._stem(transactional_id) + ".journal"
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return Journal(transactional_id)
        return Journal.from_json(raw, path)

    def save(self, journal: Journal) -> None:
        path = self._stem(journal.transactional_id) + ".journal"
        # Durable under every policy: the commit point (see the module docstring).
        fs.replace_file(
            path,
            journal.to_json().encode(),
            self._log.settings.file_mode,
            tmp=f"{path}.tmp.{os.getpid()}.{threading.get_ident()}",
        )

    def journals(self) -> Iterator[Journal]:
        """Every journal. A damaged one raises :class:`CorruptLogError`: skipping it would
        take its committed transactions for abandoned ones, and recovery would drop them."""
        for name in os.listdir(self.dir):
            if name.endswith(".journal"):
                path = os.path.join(self.dir, name)
                try:
                    with open(path, "rb") as f:
                        raw = f.read()
                except FileNotFoundError:
                    continue
                yield Journal.from_json(raw, path)

    # -- commit-state queries used by partition recovery -------------------------------
    def committed(self, producer: int, topic: str, partition: int, base: int, end: int) -> bool:
        """Was the transactional batch ending at ``end`` of segment ``base`` committed?"""
        key = _tp_key(topic, partition)
        for journal in self.journals():
            if producer_id(journal.transactional_id) != producer:
                continue
            mark = journal.high_water.get(key)
            if mark and (mark[0] > base or (mark[0] == base and end <= mark[1])):
                return True
        return False

    # -- roll-forward --------------------------------------------------------------------
    def roll_forward(self, journal: Journal, deadline: float) -> None:
        """Publish every head of ``journal.pending`` that is not published yet. Idempotent.

        Takes no lock when every head is settled already (the usual case: a journal keeps
        its last commit's heads until the next one); else locks the partitions in order,
        each until ``deadline`` at most.
        """
        parts = sorted(
            ((str(e["topic"]), int(e["partition"])) for e in journal.pending),
        )
        handles = {tp: self._log._partition(*tp) for tp in parts}
        if all(
            _settled(handles[(str(e["topic"]), int(e["partition"]))], e) for e in journal.pending
        ):
            return
        with contextlib.ExitStack() as stack:
            for tp in parts:
                stack.enter_context(handles[tp].locked(deadline))
            for entry in journal.pending:
                part = handles[(str(entry["topic"]), int(entry["partition"]))]
                _publish_if_pending(part, entry)

    def roll_forward_all(self) -> None:
        """Roll forward every journal that still lists pending heads (run at open).

        Never waits: a journal whose partitions another process has locked is left to that
        process or the next writer of those partitions (both roll it forward)."""
        for journal in self.journals():
            if journal.pending:
                try:
                    self.roll_forward(journal, deadline=0.0)
                except UnknownTopicError:
                    continue  # a topic of it no longer exists
                except LockTimeoutError:
                    continue

    def resolve_pending(self, part: Partition, deadline: float) -> None:
        """Roll forward any committed transaction that owns unpublished bytes of ``part``."""
        key = (part.topic, part.number)
        for journal in self.journals():
            if any((e["topic"], e["partition"]) == key for e in journal.pending):
                self.roll_forward(journal, deadline)


def _settled(part: Partition, entry: Mapping[str, int | str]) -> bool:
    """Whether ``entry``'s head needs no roll-forward, judged from the published head alone."""
    head = part._head.read()
    if head is None:
        return False  # missing or torn: the locked path decides
    if head.next_offset >= int(entry["new_next"]):
        return True  # published
    return (head.active_base, head.active_pos, head.next_offset) != (
        int(entry["active_base"]),
        int(entry["old_pos"]),
        int(entry["old_next"]),
    )  # the partition moved on without it


def _publish_if_pending(part: Partition, entry: Mapping[str, int | str]) -> None:
    head = part._head.read()
    if head is None:
        return
    if head.next_offset >= int(entry["new_next"]):
        return  # already published
    if (head.active_base, head.active_pos, head.next_offset) != (
        int(entry["active_base"]),
        int(entry["old_pos"]),
        int(entry["old_next"]),
    ):
        return  # the partition moved on without it: nothing of this transaction to publish
    m = part.manifest(head.layout_version)
    part._open_active_locked(m)
    new_pos = int(entry["new_pos"])
    buf = os.pread(part._wfd, new_pos - head.active_pos, head.active_pos)
    pos = 0
    while pos < len(buf):
        if len(buf) - pos < HEADER_SIZE:
            return
        try:
            h = parse_header(buf, pos)
        except CorruptLogError:
            return  # zeros (a preallocated segment) or garbage where the data should be
        if pos + h.size > len(buf) or not verify_crc(buf, pos, h):
            return  # the data did not survive (power loss without fsync): leave it unpublished
        pos += h.size
    part.publish_locked(
        head._replace(
            seq=head.seq + 1,
            next_offset=int(entry["new_next"]),
            active_pos=new_pos,
            last_index_pos=int(entry["last_index_pos"]),
        )
    )


class EmbeddedLogWriter(LogWriter):
    """A fenced transactional writer of an embedded log."""

    def __init__(self, log: TxnLog, transactional_id: str, deadline: float):
        if not isinstance(transactional_id, str) or not transactional_id:
            raise ConfigError("a transactional id must be a non-empty str")
        self._log = log
        self._txm = log._txn
        self._id = transactional_id
        self._producer = producer_id(transactional_id)
        self._closed = False
        # Why, once a newer writer took the id: every later append fails so.
        self._fenced: str | None = None
        with self._txm.id_lock(transactional_id, deadline):
            journal = self._txm.load(transactional_id)
            if journal.pending:
                self._txm.roll_forward(journal, deadline)
            journal.epoch += 1
            journal.pending = []
            self._epoch = journal.epoch
            self._txm.save(journal)

    @property
    def transactional_id(self) -> str:
        return self._id

    @property
    def epoch(self) -> int:
        return self._epoch

    def append(
        self,
        batches: Mapping[TopicPartition, Sequence[Record]],
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int]:
        """Append every batch atomically; one journal write is the commit point.

        Costs one write per partition, one journal replace, and one head publish per
        partition; with fsync ``always`` also one ``fdatasync`` per partition and the journal.
        Raises :class:`FencedError` when a newer writer holds the id, and
        :class:`~kafkakv.errors.LockTimeoutError` when the id's lock and the partitions' locks
        are not all taken within ``timeout`` seconds (None: the log's ``lock_timeout``);
        nothing is appended then.
        """
        if self._closed:
            raise ClosedError(f"transactional writer {self._id!r} is closed")
        if self._fenced is not None:
            raise FencedError(self._fenced)
        self._log._check_open()
        if not batches:  # as an append of no record: refused on every log
            raise InvalidRecordError("a writer append needs at least one partition")
        encoded = {}
        for (topic, number), records in batches.items():
            part = self._log._partition(topic, number)
            encoded[(topic, number)] = (part, self._log._encode(part, records))
        order = sorted(encoded)
        deadline = self._log._deadline(timeout)
        for _attempt in range(3):
            try:
                return self._commit(order, encoded, deadline)
            except PendingTailError as exc:
                owner = exc.args[0] if exc.args else None
                if isinstance(owner, Partition):
                    self._txm.resolve_pending(owner, deadline)
        return self._commit(order, encoded, deadline, resolve=False)

    def _commit(
        self,
        order: list[TopicPartition],
        encoded: Mapping[TopicPartition, tuple[Partition, tuple[bytes, int, int, int]]],
        deadline: float,
        resolve: bool = True,
    ) -> dict[TopicPartition, int]:
        with self._txm.id_lock(self._id, deadline):
            journal = self._txm.load(self._id)
            if journal.epoch != self._epoch:
                self._fenced = (
                    f"transactional writer {self._id!r} (epoch {self._epoch}) was fenced by a "
                    f"newer writer (epoch {journal.epoch})"
                )
                raise FencedError(self._fenced)
            with contextlib.ExitStack() as stack:
                # (partition, head to publish, first offset, batch position)
                prepared: list[tuple[Partition, HeadState, int, int]] = []
                for tp in order:
                    part, (body, count, base_ts, max_ts) = encoded[tp]
                    stack.enter_context(part.locked(deadline))
                    try:
                        head = part.prepare_locked(resolve_pending=resolve)
                    except PendingTailError:
                        raise PendingTailError(part) from None
                    batch = part.write_locked(
                        head, body, count, base_ts, max_ts, producer=self._producer
                    )
                    prepared.append((part, batch.head, batch.first_offset, batch.batch_position))
                for part, *_ in prepared:
                    part.sync_locked(force=True)
                journal.seq += 1
                # A roll inside write_locked is published at once, so the state before this
                # transaction is (new active segment, batch position, first offset).
                journal.pending = [
                    {
                        "topic": part.topic,
                        "partition": part.number,
                        "active_base": new.active_base,
                        "old_pos": position,
                        "old_next": first,
                        "new_next": new.next_offset,
                        "new_pos": new.active_pos,
                        "last_index_pos": new.last_index_pos,
                    }
                    for part, new, first, position in prepared
                ]
                for part, new, _first, _pos in prepared:
                    journal.high_water[_tp_key(part.topic, part.number)] = [
                        new.active_base,
                        new.active_pos,
                    ]
                self._txm.save(journal)  # the commit point
                for part, new, _first, _pos in prepared:
                    part.publish_locked(new)
                return {(p.topic, p.number): first for p, _new, first, _pos in prepared}

    def close(self) -> None:
        self._closed = True
