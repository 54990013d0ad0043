"""Barriers: how a replica catches up with everything written anywhere before a call.

:class:`Barriers` is a replica's ``sync()``. Where the log's end offset is authoritative
(``barriers="offset"``, or ``"auto"`` on a log whose end offset is linearizable) a barrier is no
record at all: the replica applies up to the end offset it reads. Otherwise a barrier is a
record appended to the ops topic, then applied up to; ``"shared"`` lets concurrent readers of a
partition share one (:class:`SharedBarriers`).

Barriers shared by the readers of a partition: one barrier serves a whole group.

A linearizable read needs a barrier: a record appended to the ops topic, then applied up to.
Many readers of one partition at once need not append one each. A reader joins the partition's
next group; the first member free to lead (no barrier of the partition running) closes the
group and runs one barrier for all of its members; the others wait for it and share its
outcome. A reader that arrives while a barrier runs joins the next group, never the running
one, since that barrier may have been appended before the reader's call began.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping

from kafkakv.errors import OperationTimeoutError
from kafkakv.log.base import Log, Record, left
from kafkakv.map.keyspace import KeySpace
from kafkakv.map.machine import PartitionMachine
from kafkakv.map.ops import BARRIER_VALUE
from kafkakv.map.reads import EndWatch

__all__ = ["Barriers", "SharedBarriers"]

#: ``apply_until(p, offset, deadline)``: return once ``offset`` of ``p`` is applied.
ApplyUntil = Callable[[int, int, float], None]


class _Group:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = False
        self.error: BaseException | None = None


class SharedBarriers:
    """The barrier groups of ``partitions``. Nothing blocks on I/O while holding the lock."""

    def __init__(self, partitions: Iterable[int]) -> None:
        self._cond = threading.Condition()
        self._next: dict[int, _Group | None] = dict.fromkeys(partitions)
        self._busy: dict[int, bool] = dict.fromkeys(self._next, False)

    def join(
        self,
        p: int,
        deadline: float,
        barrier: Callable[[], None],
        check: Callable[[], None],
        what: str,
    ) -> None:
        """Return once a barrier of partition ``p`` run after this call began has been
        applied: lead one (``barrier()``) or wait for the group's leader. ``check()`` is
        called on every wake-up and may raise (the replica closed). Raises the leader's
        error, or :class:`~kafkakv.errors.OperationTimeoutError` (naming ``what``) at
        ``deadline``."""
        cond = self._cond
        with cond:
            group = self._next[p]
            if group is None:
                group = self._next[p] = _Group()
            while not group.done:
                check()
                if not self._busy[p] and self._next[p] is group:
                    self._busy[p] = True
                    self._next[p] = None
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OperationTimeoutError(f"no barrier of {what} in time")
                cond.wait(remaining)
            else:
                if group.error is not None:
                    raise group.error
                return
        try:  # this thread leads the group
            barrier()
        except BaseException as exc:
            group.error = exc
            raise
        finally:
            with cond:
                group.done = True
                self._busy[p] = False
                cond.notify_all()

    def wake_all(self) -> None:
        """Wake every waiting member, so that each runs its ``check()`` (on close)."""
        with self._cond:
            self._cond.notify_all()


class Barriers:
    """A replica's barriers over ``ops``: see the module docstring.

    ``mode`` is the map's ``barriers`` setting; ``"auto"`` is ``"offset"`` on a log whose end
    offset is linearizable, ``"shared"`` elsewhere. What it needs of the replica: its
    ``machines`` (their applied positions), ``apply_until`` (the engine's), ``append`` (the
    log's append, as the replica's own appends: the caller applies them), ``check_usable``
    (raises once the replica is closed), and its ``keyspace``."""

    def __init__(
        self,
        log: Log,
        ops: str,
        machines: Mapping[int, PartitionMachine],
        mode: str,
        timeout: float,
        keyspace: KeySpace,
        apply_until: ApplyUntil,
        append: Callable[..., int],
        check_usable: Callable[[], None],
    ) -> None:
        self.log, self.ops, self.machines = log, ops, machines
        #: sync() needs no barrier record: the log's end offset is authoritative.
        self.offset_barriers = mode == "offset" or (
            mode == "auto" and log.end_offset_is_linearizable
        )
        self.mode = ("offset" if self.offset_barriers else "shared") if mode == "auto" else mode
        self._timeout, self._keyspace = timeout, keyspace
        self._apply_until, self._append, self._check_usable = apply_until, append, check_usable
        #: Where a linearizable read finds the replica at the log's end without asking the
        #: log (see kafkakv.map.reads.PyEndWatch): one watch per partition, by number, when
        #: the replica holds them all and barriers are end offsets, each noted by the
        #: end-offset barriers of its partition; None otherwise (each read then catches up).
        self.end_watches: tuple[EndWatch, ...] | None = (
            tuple(EndWatch(machines[p]) for p in range(keyspace.count))
            if self.offset_barriers and len(machines) == keyspace.count
            else None
        )
        self.shared = SharedBarriers(machines)

    def sync(self, partitions: Iterable[int], timeout: float | None) -> None:
        """Make this replica reflect every update completed anywhere before the call."""
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        mode = self.mode
        for p in partitions:
            if mode == "offset":  # no record at all: the end offset is authoritative
                self.apply_to_end(p, deadline)
            elif mode == "shared":
                self._shared_barrier(p, deadline)
            else:
                self._barrier(p, deadline)

    def catch_up(self, record_key: bytes) -> None:
        """What a linearizable read of ``record_key`` waits for: :meth:`sync` of its
        partition, with the common case first (the log's end offset is authoritative and
        this replica has applied up to it)."""
        keyspace = self._keyspace
        p = 0 if keyspace.count == 1 else keyspace.partition_of(record_key)
        if self.offset_barriers:
            self.apply_to_end(p, None)
        else:
            self.sync((p,), None)

    def apply_to_end(self, p: int, deadline: float | None) -> None:
        """An end-offset barrier: apply ``p`` up to the log's end offset now (None: within the
        map's timeout from when there is something to apply)."""
        watch = None if self.end_watches is None else self.end_watches[p]
        mark = None if watch is None else self.log.end_mark(self.ops, p)
        if mark is not None:
            end = mark.end
        elif deadline is None:
            end = self.log.end_offset(self.ops, p)
        else:
            end = self.log.end_offset(self.ops, p, timeout=left(deadline))
        if end > self.machines[p].applied:
            if deadline is None:
                deadline = time.monotonic() + self._timeout
            self._apply_until(p, end - 1, deadline)
        if watch is not None and mark is not None:
            watch.note(*mark)

    def _barrier(self, p: int, deadline: float) -> None:
        offset = self._append(self.ops, p, [Record(None, BARRIER_VALUE)], timeout=left(deadline))
        self._apply_until(p, offset, deadline)

    def _shared_barrier(self, p: int, deadline: float) -> None:
        """Join the next barrier group of ``p`` (see :class:`SharedBarriers`)."""
        self.shared.join(
            p, deadline, lambda: self._barrier(p, deadline), self._check_usable, f"{self.ops}[{p}]"
        )
