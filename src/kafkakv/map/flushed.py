"""A map's partition read straight from its last flush, as columns, with no replica.

A reader that plans with :func:`~kafkakv.map.reference.planned` (a Spark task) gets a
partition's state at an ops offset from :func:`~kafkakv.map.reference.partition_at`: a
reference replica loads the data topic into a store, then applies the ops after its flush
point. When the last flush covers every op before that offset (a flushed map: the common case
of a snapshot), the data topic alone is the state, and :func:`flushed_columns` reads it as
:class:`~kafkakv.log.columns.Columns` (:meth:`Log.latest_columns
<kafkakv.log.base.Log.latest_columns>`): no store, no dict, no bytes object per key. It gives the
same rows and the same offset as ``partition_at`` would, and raises as it does when the data
topic or the ops topic has lost what the state needs; where it cannot answer alone it says so
(None), and the reader takes ``partition_at``.

It answers for a plain map only (one map on its topics, no record prefix: record key = map
key) with neither versions nor expiry: those read the data records' headers, which the columns
do not keep.
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

from kafkakv.errors import DecodeError
from kafkakv.log.base import Log, patiently
from kafkakv.log.columns import Allocate, Columns
from kafkakv.map.dedup import AppliedIds
from kafkakv.map.keyspace import FLUSH_POINT_KEY, RESERVED_KEYS
from kafkakv.map.machine import changes_state, read_flush_point_ids, start_point
from kafkakv.map.reference import Plan
from kafkakv.map.topics import MapTopics

__all__ = ["FlushedColumns", "flushed_columns"]

_FEW_OPS = 64
"""The most ops after the flush point that :func:`flushed_columns` looks through for one that
changes the state (a flush is followed by its mark, which does not); more go to a replica."""


class FlushedColumns(NamedTuple):
    """A partition's keys and values, and the ops offset they reflect (as
    :func:`~kafkakv.map.reference.partition_at` returns it)."""

    columns: Columns
    reflected: int


def flushed_columns(
    log: Log,
    topics: MapTopics,
    plan: Plan,
    p: int,
    at: int,
    prefix: bytes = b"",
    allocate: Allocate | None = None,
) -> FlushedColumns | None:
    """Partition ``p`` of the map on ``topics`` (as planned: ``plan``) as it stands at ops
    offset ``at``, read from the data topic alone; None when that does not give it: ops
    after the last flush and before ``at``, a record ``prefix`` (several maps per topic set),
    versions or expiry. Reads the data topic once, and the few ops after its flush point (its
    ``FLUSHED`` mark), within the plan's timeout. Raises
    :class:`~kafkakv.errors.DataLossError` when retention removed ops that no flush covered,
    and :class:`~kafkakv.errors.DecodeError` for a flush point that does not decode, as a
    replica's bootstrap does. The columns are written into what ``allocate`` gives (see
    :data:`~kafkakv.log.columns.Allocate`)."""
    settings = plan.settings
    if prefix or settings.versions or settings.expiry:
        return None
    deadline = time.monotonic() + settings.timeout
    data = topics.data
    start = log.start_offset(data, p)
    columns = patiently(
        deadline,
        functools.partial(
            log.latest_columns, data, p, start, apart=RESERVED_KEYS, allocate=allocate
        ),
    )
    flushed, ids = -1, None
    if FLUSH_POINT_KEY in columns.apart:
        flushed, ids = read_flush_point_ids(columns.apart[FLUSH_POINT_KEY])
    try:
        AppliedIds.restore(p, plan.partitions, ids)
    except ValueError as exc:
        raise DecodeError(
            f"the flush point of {data}[{p}] holds no table of update ids: {exc}"
        ) from None
    where = f"{topics.ops}[{p}]"
    applied = start_point(log.start_offset(topics.ops, p), None, flushed, where).applied
    if applied >= at:
        return FlushedColumns(columns, applied)
    if at - applied > _FEW_OPS:
        return None  # ops to apply: a reference replica's work
    # A flush is followed by its FLUSHED mark in the ops (and maybe barriers): records that
    # change no state, after which the state is still the flush's.
    position = applied
    while position < at:
        read = functools.partial(log.read_entries, topics.ops, p, position, max_records=_FEW_OPS)
        entries, after = patiently(deadline, read)
        if after <= position:
            return None  # the ops end before ``at``: the replica says how (DataLossError)
        if any(changes_state(key) for key, _, offset in entries if offset < at):
            return None
        position = after  # (past offsets that hold no record too: Kafka's transaction markers)
    return FlushedColumns(columns, at)
