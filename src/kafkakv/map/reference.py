"""A reference replica: the state the log gives a map, built by the engine's own code.

:func:`reference` makes a second :class:`~kafkakv.map.engine.ReplicaEngine` over the same log,
topics and partitions as a running one, for one map with an empty store, and never starts it:
no threads, no updates of its own, no lock contention with the replica it mirrors.
:func:`rebuild` loads a partition of it from the data topic as a new replica's bootstrap
does; :func:`replay` then applies the ops after that, up to an offset and no further, through
the engine's apply step (store writes, taps, listeners), as the replica did. Its machines
keep none of the notes that only a replica's own reader uses: no dirty keys (it never
flushes), no values that do not read
(:meth:`~kafkakv.map.machine.PartitionMachine.as_reference`).

Two features read the log this way: :func:`~kafkakv.map.deepcheck.deep_check` compares the
result with the replica's store, and a change feed (:mod:`kafkakv.map.feed`) tells the changes
from a cursor behind the replica. Costs: what opening a fresh replica costs, the data topic and
the unflushed ops read once, and a copy of the map in memory while it lives. Close it after
use.

A reader with no replica open (a Spark task) plans once with :func:`planned`, from the log and
the map's topics alone; a task then makes its reference replica with :func:`reference_planned`
to replay changes, or loads a partition's state at an offset with :func:`partition_at`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

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
    "Plan",
    "partition_at",
    "planned",
    "rebuild",
    "reference",
    "reference_planned",
    "replay",
    "state_at",
]


class Plan(NamedTuple):
    """What :func:`planned` found for a reader's tasks: the map's partition count, and the
    reader's settings with the ones the map was created with."""

    partitions: int
    settings: MapSettings


def reference(engine: ReplicaEngine, state: MapState) -> ReplicaEngine:
    """A reference replica of map ``state`` (whose store should be empty) over ``engine``'s
    log, topics and partitions, never started. No I/O until it is filled."""
    return _as_reference(
        ReplicaEngine(
            engine.log,
            engine.topics,
            engine.partition_count,
            engine.held,
            [state],
            engine.settings,
            engine.max_record_bytes,
        )
    )


def planned(log: Log, topics: MapTopics, timeout: float) -> Plan:
    """The map's partition count, and the settings of a reader that appends nothing (calls
    bounded by ``timeout``) with the ones the map was created with (placement, versions,
    expiry): the topics and the map's settings checked as when a replica opens, creating
    nothing. What a reader plans with once and gives each of its tasks
    (:func:`reference_planned`, :func:`partition_at`). Costs a metadata round trip per
    topic and the read of the data topic's first record (with its whole batch: a flush of a
    million keys may be one). Raises :class:`~kafkakv.errors.UnknownMapError` for a missing
    topic, :class:`~kafkakv.errors.TopicMismatchError` for topics or settings that do not
    fit the map (see :func:`~kafkakv.map.topics.check_topics` and
    :func:`~kafkakv.map.topics.check_map_settings`)."""
    count = check_topics(log, topics, None, create=False).partitions
    settings = MapSettings(timeout=timeout, barriers="offset")  # no barrier records appended
    return Plan(count, settings_as_created(log, topics, settings))


def reference_planned(
    log: Log,
    topics: MapTopics,
    held: Sequence[int],
    state: MapState,
    plan: Plan,
) -> ReplicaEngine:
    """A reference replica of map ``state`` (whose store should be empty) holding partitions
    ``held`` of ``topics`` on ``log``, from what :func:`planned` found (``plan``), with no
    check and no I/O until it is filled. Never started, it appends nothing."""
    engine = ReplicaEngine(log, topics, plan.partitions, held, [state], plan.settings, 0)
    return _as_reference(engine)  # 0: no room to append


def _as_reference(ref: ReplicaEngine) -> ReplicaEngine:
    """``ref``, whose machines keep no notes that only a replica's own reader uses
    (:meth:`~kafkakv.map.machine.PartitionMachine.as_reference`)."""
    for machine in ref.machines.values():
        machine.as_reference()
    return ref


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


def partition_at(
    log: Log, topics: MapTopics, plan: Plan, state: MapState, p: int, at: int
) -> tuple[list[bytes], list[bytes], int]:
    """Partition ``p`` of the map as it stands at ops offset ``at``: its stored keys and values
    (the columns of ``state``'s store, which should be empty), and the offset they reflect.
    :func:`state_at` by a reference replica made from ``plan`` (:func:`reference_planned`),
    closed after (with the store). Raises as :func:`state_at` does."""
    ref = reference_planned(log, topics, [p], state, plan)
    try:
        reflected = state_at(ref, p, at)
        keys, values = state.store.columns()
        return keys, values, reflected
    finally:
        ref.close()
