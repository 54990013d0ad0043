"""What time it is by the log's clock, as one replica can tell: the clock expiry goes by on
Kafka (a log that stamps records with this machine's clock, the embedded log, is read
directly: :attr:`~kafkakv.log.base.Log.clock_is_local`).

A map with expiry decides by record timestamps (see :mod:`kafkakv.map.ops`): on Kafka with
``message.timestamp.type=LogAppendTime`` the leader broker of each ops partition stamps its
records, on the embedded log the appending process. A replica needs the log's "now" twice:
its reaper proposes an ``EXPIRE`` once a deadline has passed by the log's clock, and reads
hide a key past its deadline. Asking the log each time would cost a round trip; reading the
replica's own wall clock instead is what let one fast client reap every key early.

:class:`LogClock` estimates it from what the replica sees. A record stamped ``t`` by the log
and applied here when this process's monotonic clock reads ``m`` says that the log's clock
was at least ``t`` at ``m`` (it was stamped before it was applied): ``t - m`` is a lower
bound of the offset between the log's clock and the monotonic clock. The estimate keeps the
largest such sample per partition, so it is never ahead of the log's clock by more than the
log's clock steps back: a reaper going by it proposes late (by the shortest delivery delay
it saw), never early. The monotonic clock does not move when the wall clock is set, so the
replica's own wall clock plays no part. Should the log's clock step back (another leader
whose clock is behind, a clock set back), an ``EXPIRE`` proposed by the estimate is stamped
before its deadline and changes nothing; :meth:`LogClock.contradicted` then takes that
record's sample as the estimate and asks for a measurement, and the key is proposed again
once the new estimate passes its deadline: one early proposal per step back, no busy loop.

Until a partition has a sample that is known to be fresh (:meth:`LogClock.fresh`, taken
from a record appended for the purpose and read back at once), its estimate may be far
behind (records replayed at open are old): the reaper measures it first.

No threads, no I/O: the caller passes the monotonic time, and changes the estimate from one
thread at a time (the engine: under the replica lock); reads need no lock.

>>> clock = LogClock()
>>> clock.now(0, 5_000.0) is None
True
>>> clock.observe(0, 1_000_000, 5_000.0)   # a record stamped 1,000,000 applied at 5,000
>>> clock.observe(0, 1_000_990, 6_000.0)   # this one came 10 ms slower: an older bound
>>> clock.now(0, 7_000.0)
1002000.0
>>> clock.contradicted(0, 1_001_500, 7_000.0)   # the log said 1,001,500 when we said more
>>> clock.now(0, 7_000.0)
1001500.0
"""

from __future__ import annotations

__all__ = ["LogClock"]


class LogClock:
    """Estimates of the log's clock per partition, in ms since the epoch, from samples of
    record timestamps against this process's monotonic clock in ms (see the module
    docstring). Costs a dict look-up per call."""

    __slots__ = ("_fresh", "_least", "_offsets")

    def __init__(self) -> None:
        #: Per partition, the largest ``timestamp - monotonic`` seen (a lower bound).
        self._offsets: dict[int, float] = {}
        #: Partitions whose estimate rests on a sample taken for the purpose.
        self._fresh: set[int] = set()
        #: The least offset (None: no sample), kept for :meth:`earliest`, which reads call.
        self._least: float | None = None

    def observe(self, partition: int, stamp: int, mono_ms: float) -> None:
        """A record of ``partition`` stamped ``stamp`` by the log was applied at ``mono_ms``."""
        if stamp <= 0:
            return  # no timestamp
        sample = stamp - mono_ms
        best = self._offsets.get(partition)
        if best is None or sample > best:
            self._set(partition, sample)

    def measured(self, partition: int, stamp: int, mono_ms: float) -> None:
        """A record appended for the purpose was stamped ``stamp`` and read back at
        ``mono_ms``: a fresh sample, taken whatever the estimate was."""
        if stamp <= 0:
            return
        self._set(partition, max(stamp - mono_ms, self._offsets.get(partition, -1e300)))
        self._fresh.add(partition)

    def contradicted(self, partition: int, stamp: int, mono_ms: float) -> None:
        """A record stamped ``stamp``, applied at ``mono_ms``, shows the estimate was ahead
        of the log's clock (an ``EXPIRE`` stamped before the deadline it was proposed for):
        its sample is the estimate now, and it is no longer :meth:`fresh`."""
        if stamp > 0:
            self._set(partition, stamp - mono_ms)
        self._fresh.discard(partition)

    def _set(self, partition: int, offset: float) -> None:
        self._offsets[partition] = offset
        self._least = min(self._offsets.values())

    def fresh(self, partition: int) -> bool:
        """Whether the estimate of ``partition`` rests on a sample taken for the purpose."""
        return partition in self._fresh

    def now(self, partition: int, mono_ms: float) -> float | None:
        """The log's clock of ``partition`` at ``mono_ms`` by the estimate (None: no sample)."""
        offset = self._offsets.get(partition)
        return None if offset is None else mono_ms + offset

    def earliest(self, mono_ms: float) -> float | None:
        """The least of every partition's estimate at ``mono_ms`` (None: no sample): a lower
        bound of the log's clock for a read that does not look up a key's partition."""
        least = self._least
        return None if least is None else mono_ms + least
