"""A reference replica: the state the log gives a map, built by the engine's own code.

:func:`reference` makes a second :class:`~kafkakv.map.engine.ReplicaEngine` over the same log,
topics and partitions as a running one, for one map with an empty store, and never starts it:
no threads, no updates of its own, no lock contention with the replica it mirrors.
:func:`rebuild` loads a partition of it from the data topic as a new replica's bootstrap
does; :func:`replay` then applies the ops after that, up to an offset and no further, through
the engine's apply step (store writes, taps, listeners), as the replica did.

Two features read the log this way: :func:`~kafkakv.map.deepcheck.deep_check` compares the
result with the replica's store, and a change feed (:mod:`kafkakv.map.feed`) tells the changes
from a cursor behind the replica. Costs: what opening a fresh replica costs, the data topic and
the unflushed ops read once, and a copy of the map in memory while it lives. Close it after
use.

A reader that wants the changes of a range and has no replica open (a Spark stream's read
task) makes one with :func:`reference_of`, from the log and the map's topics alone; one that
wants a partition's state at an offset (a Spark read task) calls :func:`state_at`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kafkakv.errors import DataLossError
from kafkakv.gcpause import gc_paused
from kafkakv.log.base import Log
from kafkakv.map.bootstrap import READ_BATCH
from kafkakv.map.engine import ReplicaEngine
from kafkakv.map.follower import STALL_RETRY
from kafkakv.map.machine import MapState
from kafkakv.map.settings import MapSettings
from kafkakv.map.topics import MapTopics, check_topics, settings_as_created

__all__ = [
    "planned",
    "rebuild",
    "reference",
    "reference_of",
    "reference_planned",
    "replay",
    "state_at",
]


def reference(engine: ReplicaEngine, state: MapState) -> ReplicaEngine:
    """A reference replica of map ``state`` (whose store should be empty) over ``engine``'s
    log, topics and partitions, never started. No I/O until it is filled."""
    return ReplicaEngine(
        engine.log,
        engine.topics,
        engine.partition_count,
        engine.held,
        [state],
        engine.settings,
        engine.max_record_bytes,
    )


def reference_of(
    log: Log, topics: MapTopics, held: Sequence[int], state: MapState, settings: MapSettings
) -> ReplicaEngine:
    """A reference replica of map ``state`` (whose store should be empty) holding partitions
    ``held`` of ``topics`` on ``log``, with no running replica to copy: :func:`planned` and
    :func:`reference_planned` in one. Never started, it appends nothing."""
    return reference_planned(log, topics, held, state, planned(log, topics, settings))


def planned(log: Log, topics: MapTopics, settings: MapSettings) -> tuple[int, MapSettings]:
    """The map's partition count, and ``settings`` with the ones the map was created with
    (placement, versions, expiry) in place of its own: the topics and the map's settings
    checked as when a replica opens, creating nothing. What a reader plans with once and
    gives each of its tasks (:func:`reference_planned`). Costs a metadata round trip per
    topic and the read of the data topic's first record (with its whole batch: a flush of a
    million keys may be one). Raises :class:`~kafkakv.errors.UnknownMapError` for a missing
    topic, :class:`~kafkakv.errors.TopicMismatchError` for topics or settings that do not
    fit the map (see :func:`~kafkakv.map.topics.check_topics` and
    :func:`~kafkakv.map.topics.check_map_settings`)."""
    count = check_topics(log, topics, None, create=False).partitions
    return count, settings_as_created(log, topics, settings)


def reference_planned(
    log: Log,
    topics: MapTopics,
    held: Sequence[int],
    state: MapState,
    plan: tuple[int, MapSettings],
) -> ReplicaEngine:
    """A reference replica of map ``state`` as :func:`reference_of` makes it, from what
    :func:`planned` found (``plan``), with no check and no I/O until it is filled."""
    count, settings = plan
    return ReplicaEngine(log, topics, count, held, [state], settings, 0)  # 0: no room to append


def rebuild(ref: ReplicaEngine, p: int) -> int:
    """Load partition ``p`` of ``ref`` from the data topic alone, as a new replica's bootstrap
    does, and return the ops offset that the data covers (-1: none); the ops after it are
    left to :func:`replay`. Reads the data topic to its end, within the map's timeout; raises
    DataLossError as bootstrap does."""
    deadline = time.monotonic() + ref.settings.timeout
    machine = ref.machines[p]
    ref.bootstrap.load(machine, ref.log.start_offset(ref.topics.ops, p), deadline)
    return machine.flushed


def replay(ref: ReplicaEngine, p: int, stop: int, *, keys: bool = True) -> set[bytes]:
    """Apply the ops of ``ref``'s partition ``p`` from its applied position up to ``stop``
    (exclusive) and no further; return the record keys of the records applied (none with
    ``keys=False``: a caller that taps the changes spares their decoding).

    Stops early at a stall or where the log ends (then ``ref.positions()[p].applied <
    stop``); a read that finds nothing below the log's end offset is retried for up to the
    map's timeout. One read per 5000 ops.
    """
    machine, ops, log = ref.machines[p], ref.topics.ops, ref.log
    touched: set[bytes] = set()
    deadline = time.monotonic() + ref.settings.timeout
    while machine.applied < stop and p not in ref.stalled:
        position = machine.applied
        with gc_paused():  # as the engine's apply loop
            records, after = log.read_batch(ops, p, position, max_records=READ_BATCH)
            if records and (records[-1].offset or 0) >= stop:
                records = [r for r in records if (r.offset or 0) < stop]
                after = stop
            after = min(after, stop)
            if records:
                ref.apply_records(p, records, after)
                for r in records if keys else ():
                    touched.update(machine.keys_of(r))
            else:
                ref.step_over(p, after)  # offsets with nothing to apply
            del records
        if machine.applied > position or p in ref.stalled:
            continue
        # Nothing read: the end of the log, or a reader not caught up with it yet.
        if log.end_offset(ops, p) <= position or time.monotonic() > deadline:
            break
        time.sleep(STALL_RETRY)
    return touched


def state_at(ref: ReplicaEngine, p: int, stop: int) -> int:
    """Fill ``ref``'s store with partition ``p`` as it stands at ops offset ``stop`` (every op
    before it applied), and return the offset it reflects: :func:`rebuild`, then
    :func:`replay` up to ``stop``. That is ``stop``, or later where a flush past ``stop`` was
    written since (the data topic holds only the state at its last flush): then the state
    after that flush, which holds every op before ``stop`` too. What a replica opened now would
    hold, with none of its threads (no follower, sender or flusher to start and stop). Raises
    the partition's :class:`~kafkakv.errors.PartitionStalledError` when an op stops it, and
    DataLossError when the ops end before ``stop``."""
    rebuild(ref, p)
    replay(ref, p, stop, keys=False)
    if p in ref.stalled:
        raise ref.stalled[p]
    applied = ref.machines[p].applied
    if applied < stop:
        raise DataLossError(
            f"{ref.topics.ops}[{p}] ends at offset {applied}, short of {stop}: the ops "
            "were there when the read was planned"
        )
    return applied
