"""Each update applied at most once: which update ids a partition has applied, without I/O.

An update's id is its ops record's ``(origin, seq)``. Transports repeat records: librdkafka's
idempotent producer may write a batch again after it bumps its epoch (a message timeout, a
leader change), and the copy lands later in the partition, maybe a thousand offsets on. Applied
twice, a repeated ``remove`` erases a later put. So every replica keeps, per partition, the ids
it applied, and an update whose id is among them changes nothing: every replica decides that
alike, because the table is a function of the records applied and of nothing else.

**The table.** A writer numbers its updates of partition ``p`` of a map of ``P`` partitions
in :data:`LANES` lanes, lane ``l`` taking ``lP + p, lP + p + LP, lP + p + 2LP, ...``
(:func:`numbering`: seqs unique in the writer, dense in each lane of each partition). A replica
sends its blocking updates in lane 0 and hands the others to a pipelined producer in lane 1:
the two reach the log in another order than they were numbered (on Kafka through two
producers, one of them batching), so each lane keeps its own count. With ``S = LP``, the table
holds for each ``(origin, seq mod S)`` the highest ``seq // S`` applied (``top``) and the holes
below it, ranges of numbers not applied yet: within a lane too a writer's threads overtake
each other, so a number below ``top`` may still come for the first time, and it is applied
then. A number neither above ``top`` nor in a hole is a repeat. Any numbering is recognised
exactly; the writers' numbering only keeps the table small (a range per lane, as a rule
without holes; as many holes as updates were overtaken while in flight).

**Bounds.** An origin keeps at most :data:`MAX_HOLES` holes per lane; past that its oldest
holes go, and a record that would have filled one is refused as a repeat (never applied twice;
the writer learns it failed). Holes that stay are those of updates that never reached the log.
An origin is forgotten once no record of it came for :data:`HORIZON_MS` of the log's time,
measured at ``FLUSHED`` marks (the only records every replica reads from the log with their
timestamp): a repeat later than that would be applied again. librdkafka stops retrying a
record at ``message.timeout.ms`` (the log's timeout), far within the horizon. At most
:data:`MAX_ORIGINS` origins are kept per partition, the least recently seen go first.

**Where the table lives.** In memory, and in every flush: the flush point record of the data
topic and the ``FLUSHED`` mark of the ops topic carry the table as of the ops offset the flush
covers (:meth:`AppliedIds.snapshot`). A new replica loads it with the data and replays the ops
after; a replica resumed from its own store takes it from the mark of its store's flush point
and replays the ids of the ops after that (see :mod:`kafkakv.map.engine`).

>>> ids = AppliedIds(partition=1, partitions=3)
>>> list(numbering(1, 3)[:3]), list(numbering(1, 3, lane=1)[:3])
([1, 7, 13], [4, 10, 16])
>>> def apply(seq, offset):
...     if ids.is_repeat(b"w", seq):
...         return "repeat"
...     ids.admit(b"w", seq, offset)
...     return "applied"
>>> [apply(seq, offset) for offset, seq in enumerate([1, 13, 7, 13, 4, 7, 19])]
['applied', 'applied', 'applied', 'repeat', 'applied', 'repeat', 'applied']
>>> copy = AppliedIds.restore(1, 3, ids.snapshot())
>>> copy.is_repeat(b"w", 7), copy.is_repeat(b"w", 25), copy == ids
(True, False, True)
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["HORIZON_MS", "LANES", "MAX_HOLES", "MAX_ORIGINS", "AppliedIds", "Replay", "numbering"]

#: How long (ms of the log's time, at ``FLUSHED`` marks) an origin is remembered after its
#: last record.
HORIZON_MS = 3_600_000
#: Ranges of not-yet-applied numbers kept per origin and lane.
MAX_HOLES = 1024
#: Numbering lanes of a writer (see the module docstring).
LANES = 2
#: Origins kept per partition.
MAX_ORIGINS = 4096


def numbering(partition: int, partitions: int, lane: int = 0) -> range:
    """A writer's seqs for ``partition`` of a map of ``partitions`` in ``lane``: dense in the
    lane of the partition, unique across lanes and partitions (see the module docstring).

    >>> list(numbering(1, 3)[:3])
    [1, 7, 13]
    """
    return range(lane * partitions + partition, 1 << 62, LANES * partitions)


class _Origin:
    """What one ``(origin, seq mod P)`` has applied: numbers up to ``nxt // P - 1`` (its
    top) but ``holes`` (``[lo, hi]`` ranges of numbers, oldest first), the last at ops offset
    ``last``. ``nxt`` is the seq that comes next, kept as a seq: the common case compares it
    with no arithmetic."""

    __slots__ = ("holes", "last", "nxt")

    def __init__(self, nxt: int, holes: list[list[int]], last: int) -> None:
        self.nxt = nxt
        self.holes = holes
        self.last = last


class AppliedIds:
    """The ids of the updates partition ``partition`` of a map of ``partitions`` applied
    (see the module docstring). Pure: no I/O, no clock."""

    __slots__ = ("_origins", "marks", "partition", "partitions", "stride", "writers")

    def __init__(self, partition: int, partitions: int) -> None:
        self.partition = partition
        self.partitions = max(1, partitions)
        #: Numbers of one lane of one partition are this far apart.
        self.stride = LANES * self.partitions
        #: By origin for the numbers of this partition's numbering (``seq mod P`` is the
        #: partition: no tuple to make, and the bytes hash once), else by ``(origin, seq mod
        #: P)``.
        self._origins: dict[bytes | tuple[bytes, int], _Origin] = {}
        #: The same dict: the machine's loop does :meth:`take`'s common case inline (a
        #: writer's next number: ``writers[origin].nxt == seq``; then ``nxt += stride`` and
        #: ``last = offset``), a Python call fewer per update.
        self.writers = self._origins
        #: ``[offset, timestamp]`` of the ``FLUSHED`` marks that may still bound the horizon.
        self.marks: list[list[int]] = []

    def __len__(self) -> int:
        return len(self._origins)

    def _find(self, origin: bytes, seq: int) -> tuple[int, bytes | tuple[bytes, int]]:
        n, rest = divmod(seq, self.stride)
        return n, origin if rest == self.partition else (origin, rest)

    def take(self, origin: bytes, seq: int, offset: int) -> bool:
        """:meth:`is_repeat` and :meth:`admit` in one call: False for a repeat; else True,
        the update noted as applied at ops ``offset``. O(1) for the next number of a writer."""
        seen = self._origins.get(origin)
        if seen is not None and seq == seen.nxt:
            seen.nxt = seq + self.stride
            seen.last = offset
            return True
        if self.is_repeat(origin, seq):
            return False
        self.admit(origin, seq, offset)
        return True

    def is_repeat(self, origin: bytes, seq: int) -> bool:
        """Whether update ``(origin, seq)`` was applied before. O(1) as a rule; O(holes) for
        a number below the origin's highest."""
        n, key = self._find(origin, seq)
        seen = self._origins.get(key)
        if seen is None or n >= seen.nxt // self.stride:
            return False
        return all(not lo <= n <= hi for lo, hi in seen.holes)

    def admit(self, origin: bytes, seq: int, offset: int) -> None:
        """Note update ``(origin, seq)``, not a repeat (:meth:`is_repeat`), as applied at ops
        ``offset``."""
        n, key = self._find(origin, seq)
        seen = self._origins.get(key)
        if seen is None:
            self._origins[key] = _Origin(seq + self.stride, [[0, n - 1]] if n > 0 else [], offset)
            return
        seen.last = offset
        top = seen.nxt // self.stride - 1
        holes = seen.holes
        if n > top:
            seen.nxt = seq + self.stride
            if n > top + 1:
                holes.append([top + 1, n - 1])
        else:
            for i in range(len(holes) - 1, -1, -1):  # the newest holes fill first, as a rule
                lo, hi = holes[i]
                if lo <= n <= hi:
                    if lo == hi:
                        del holes[i]
                    elif n == lo:
                        holes[i][0] = n + 1
                    elif n == hi:
                        holes[i][1] = n - 1
                    else:
                        holes[i : i + 1] = [[lo, n - 1], [n + 1, hi]]
                    break
        if len(holes) > MAX_HOLES:
            del holes[0]

    def fresh_run(self, origin: bytes, seqs: list[int]) -> bool:
        """Whether ``seqs`` of ``origin``, in order, each come next after the one before
        (the first next after the origin's highest, or the origin unseen): the bulk path's
        check that a batch holds no repeat. Changes nothing."""
        stride, first = self.stride, seqs[0]
        if seqs != list(range(first, first + len(seqs) * stride, stride)):
            return False
        seen = self._origins.get(self._find(origin, first)[1])
        return seen is None or first == seen.nxt

    def take_run(self, origin: bytes, seqs: list[int], offset: int) -> None:
        """Note ``seqs`` of ``origin``, a run :meth:`fresh_run` accepted, the last at ops
        ``offset``."""
        key = self._find(origin, seqs[-1])[1]
        seen = self._origins.get(key)
        nxt = seqs[-1] + self.stride
        if seen is None:
            first = seqs[0] // self.stride
            self._origins[key] = _Origin(nxt, [[0, first - 1]] if first > 0 else [], offset)
        else:
            seen.nxt = nxt
            seen.last = offset

    def at_mark(self, offset: int, timestamp: int | None) -> None:
        """A ``FLUSHED`` mark took effect at ``offset`` with the log's ``timestamp`` (ms):
        forget the origins silent for :data:`HORIZON_MS` by the marks' times, then the least
        recently seen past :data:`MAX_ORIGINS`."""
        if timestamp is None:
            return
        self.marks.append([offset, timestamp])
        cut = timestamp - HORIZON_MS
        gone = [m for m in self.marks if m[1] <= cut]
        if gone:  # what came before the latest mark an hour old is an hour old
            boundary = gone[-1][0]
            self.marks = [m for m in self.marks if m[1] > cut]
            origins = self._origins
            for key in [k for k, o in origins.items() if o.last < boundary]:
                del origins[key]
        if len(self._origins) > MAX_ORIGINS:
            by_age = sorted(self._origins.items(), key=lambda item: item[1].last)
            self._origins.clear()  # in place: it is also ``writers``
            self._origins.update(by_age[len(by_age) - MAX_ORIGINS :])

    # -- persistence ----------------------------------------------------------------------
    def snapshot(self) -> list[Any]:
        """The table as plain msgpack-able lists: ``[marks, [[origin, rest, top, last,
        holes], ...]]``, in the table's order (which later limits keep)."""
        rows = []
        for key, seen in self._origins.items():
            origin, rest = (key, self.partition) if type(key) is bytes else key
            top = seen.nxt // self.stride - 1
            rows.append([origin, rest, top, seen.last, [list(h) for h in seen.holes]])
        return [[list(m) for m in self.marks], rows]

    @classmethod
    def restore(cls, partition: int, partitions: int, rows: Any) -> AppliedIds:
        """The table a :meth:`snapshot` holds (from a flush); an empty one for None (a flush
        written before tables were). Raises ``ValueError`` for rows that are not one."""
        ids = cls(partition, partitions)
        if rows is None:
            return ids
        try:
            converted = msgspec.convert(rows, _Rows)
        except msgspec.ValidationError as exc:
            raise ValueError(f"not a table of applied update ids: {exc}") from None
        ids.marks = [list(m) for m in converted[0]]
        for origin, rest, top, last, holes in converted[1]:
            key = origin if rest == partition else (origin, rest)
            nxt = (top + 1) * ids.stride + rest
            ids._origins[key] = _Origin(nxt, [list(h) for h in holes], last)
        return ids

    def copy(self) -> AppliedIds:
        return AppliedIds.restore(self.partition, self.partitions, self.snapshot())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AppliedIds):
            return NotImplemented
        return self.snapshot() == other.snapshot()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"AppliedIds({self.partition}, {self.partitions}, {self.snapshot()!r})"


_Rows = tuple[list[tuple[int, int]], list[tuple[bytes, int, int, int, list[tuple[int, int]]]]]


class Replay:
    """Rebuilds the table of a replica resumed from its own store, whose flush point is
    ``flushed``, from the ops after it up to its position, in log order: feed it every update
    (:meth:`update`) and ``FLUSHED`` mark (:meth:`mark`) there, then take :meth:`table`. The
    mark of that flush point carries the table as of ``flushed``; the updates before it in
    the log are held until it comes. Without it (no flush yet; a mark written before marks
    carried tables; retention removed it), the table starts empty.

    >>> replay = Replay(0, 1, flushed=4)
    >>> replay.update(b"w", 6, 5)
    >>> replay.mark(4, AppliedIds(0, 1).snapshot(), 6, 1000)
    >>> replay.update(b"w", 6, 7)  # a repeat: it changes nothing
    >>> replay.table().is_repeat(b"w", 6), replay.table().is_repeat(b"w", 4)
    (True, False)
    """

    def __init__(self, partition: int, partitions: int, flushed: int) -> None:
        self.partition, self.partitions, self.flushed = partition, partitions, flushed
        self._table = AppliedIds(partition, partitions) if flushed < 0 else None
        self._held: list[tuple[bytes, int, int] | tuple[int, int | None]] = []

    def update(self, origin: bytes, seq: int, offset: int) -> None:
        """An update record (decoded, with a key) at ``offset``."""
        table = self._table
        if table is None:
            self._held.append((origin, seq, offset))
        elif not table.is_repeat(origin, seq):
            table.admit(origin, seq, offset)

    def mark(self, covered: int, rows: Any, offset: int, ts: int | None) -> None:
        """A ``FLUSHED`` mark at ``offset`` (timestamp ``ts``) covering ``covered``, with the
        table ``rows`` it carries (None: none)."""
        if self._table is None:
            if covered != self.flushed or rows is None:
                self._held.append((offset, ts))
                return
            self._table = AppliedIds.restore(self.partition, self.partitions, rows)
            self._release()
        self._table.at_mark(offset, ts)

    def table(self) -> AppliedIds:
        """The table rebuilt from what was fed."""
        if self._table is None:
            self._table = AppliedIds(self.partition, self.partitions)
            self._release()
        return self._table

    def _release(self) -> None:
        held, self._held = self._held, []
        for event in held:
            if len(event) == 3:
                self.update(*event)
            else:
                assert self._table is not None
                self._table.at_mark(*event)
