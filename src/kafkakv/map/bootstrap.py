"""Bootstrap: how a replica's partition gets its state before it applies ops.

A persistent store that holds the positions of every map of the replica resumes there: the
ops between its flush point and its applied position are read once more only to learn which
keys are dirty and which update ids were applied. Otherwise the partition loads the data topic
to its end (what the flushes wrote, with the flush point and the table of update ids recorded
there) into the stores. Either way the machine is started at the point found
(:func:`~kafkakv.map.machine.start_point`); the engine then applies the ops from there.

Costs: one read of the data topic (up to ``_LOAD_BYTES`` per read; a plain map reads it as one
dict per ``_LATEST_BYTES``), or one read of the ops since the store's flush point. The
decisions are the machine's (:func:`~kafkakv.map.machine.load_batch`, ``load_latest``,
``load_headers``); this module does the reads and the store writes.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from kafkakv.errors import DecodeError
from kafkakv.gcpause import gc_paused
from kafkakv.log.base import Entry, Log, Record, patiently
from kafkakv.map.dedup import AppliedIds
from kafkakv.map.keyspace import KeySpace
from kafkakv.map.machine import (
    ErrorLog,
    Loaded,
    MapState,
    MapTable,
    PartitionMachine,
    load_batch,
    load_headers,
    load_latest,
    start_point,
)
from kafkakv.map.topics import MapTopics
from kafkakv.store.base import Positions

__all__ = ["Bootstrap"]

READ_BATCH = 5000  # ops records read at once
_LOAD_BYTES = 32 << 20  # bytes of data records read at once while bootstrapping
_LATEST_BYTES = 1 << 20
"""Bytes of data records a plain map's bootstrap reads as one dict, in whole batches (as many
records as they hold): the dict stays in cache while it is built, and no batch is split."""

#: Told the ``(deadline, record key)`` pairs the data topic's headers gave keys (expiry).
DeadlinesLoaded = Callable[[Sequence[tuple[int, bytes]]], None]


class Bootstrap:
    """Loads the partitions of the maps in ``table`` (``maps``, in the replica's order) from
    ``topics``. With ``headers`` (versions or expiry) the data records' headers are read and
    the deadlines they give told to ``deadlines_loaded``; a resume is refused then (versions
    and deadlines live in memory: a store on disk reloads to learn them again). What does not
    load goes to ``errors``."""

    def __init__(
        self,
        log: Log,
        topics: MapTopics,
        table: MapTable,
        maps: Sequence[MapState],
        keyspace: KeySpace,
        errors: ErrorLog,
        headers: bool = False,
        deadlines_loaded: DeadlinesLoaded | None = None,
    ) -> None:
        self.log, self.topics, self.table, self.maps = log, topics, table, maps
        self._keyspace, self._errors = keyspace, errors
        self._headers, self._deadlines_loaded = headers, deadlines_loaded
        #: The log reads entries without building records (the embedded log does).
        self._reads_entries = type(log).read_entries is not Log.read_entries

    def start(self, machine: PartitionMachine, deadline: float) -> None:
        """Give ``machine``'s partition its state: resume a persistent store, or load the
        data topic. Ops after the point it starts at are left to apply."""
        p = machine.partition
        start = self.log.start_offset(self.topics.ops, p)
        resumed = self._resume_point(p)
        if resumed is not None and resumed.applied >= start:
            machine.start_at(start_point(start, resumed))
            self._collect_dirty(machine, max(resumed.flushed + 1, start), resumed.applied, deadline)
        else:
            self.load(machine, start, deadline)

    def load(self, machine: PartitionMachine, start: int, deadline: float) -> None:
        """Load ``machine``'s partition from the data topic and take its flush point as the
        position (ops from there on are still to apply). Raises DataLossError when the ops
        topic, starting at ``start``, no longer holds the ops after that point."""
        p = machine.partition
        loaded, ids = self._load_data(p, deadline)
        where = f"{self.topics.ops}[{p}]"
        try:
            table = AppliedIds.restore(p, self._keyspace.count, ids)
        except ValueError as exc:
            raise DecodeError(
                f"the flush point of {self.topics.data}[{p}] holds no table of update ids: {exc}"
            ) from None
        machine.start_at(start_point(start, None, loaded, where), table)

    def _resume_point(self, p: int) -> Positions | None:
        if self._headers or not all(state.store.persistent for state in self.maps):
            return None
        seen = [state.store.positions().get(p) for state in self.maps]
        first = seen[0]
        if first is None or any(s != first for s in seen):
            return None
        return first

    def _collect_dirty(
        self, machine: PartitionMachine, start: int, stop: int, deadline: float
    ) -> None:
        """Mark every key of an op in ``[start, stop)`` dirty, and learn the update ids
        applied up to ``stop`` (see note_resumed)."""
        position = start
        replay = machine.resume_replay()
        while position < stop:
            read = functools.partial(self.log.read, self.topics.ops, machine.partition, position)
            records = patiently(deadline, functools.partial(read, max_records=READ_BATCH))
            if not records or machine.note_resumed(records, stop, replay):
                break
            position = (records[-1].offset or 0) + 1
        machine.ids = replay.table()

    def _load_data(self, p: int, deadline: float) -> tuple[int, Any]:
        """Read the data topic of ``p`` to its end into the stores; return the flush point
        and the update ids its flush wrote (None: none)."""
        data = self.topics.data
        for state in self.maps:
            if state.store.persistent:
                state.store.drop_partition(p, self._keys_of(state, p))
        flushed, ids = -1, None
        position = self.log.start_offset(data, p)
        plain = self.table.plain and not self._headers  # (headers: versions, expiry deadlines)
        load = self._load_latest if plain else self._load_entries
        # One tuple per record, none of them garbage (see gcpause). Paused for the whole load,
        # not per read: a read that stops inside a batch keeps its rows decoded for the next,
        # and the collections between two reads scanned them (one flush of 1M keys is one
        # batch: 17 % of its load).
        with gc_paused():
            while True:
                loaded, position = patiently(deadline, functools.partial(load, p, position))
                if loaded is None:  # stop on an empty read, not at an offset: gaps cannot stall it
                    return flushed, ids
                if loaded.errors:
                    self._errors.extend(loaded.errors)
                for state in self.maps:
                    if id(state) in loaded.changes:
                        state.store.write(loaded.changes[id(state)], {})
                if loaded.flush_point > flushed:
                    flushed, ids = loaded.flush_point, loaded.ids
                del loaded  # before collection resumes: see gcpause

    def _load_latest(self, p: int, position: int) -> tuple[Loaded | None, int]:
        """The next stretch of the data topic of ``p`` for a plain map, read as the last value
        per key (a dict built by the log); None at the end. Read again as entries when a key or
        value does not read, for their offsets (see load_latest)."""
        latest, after = self.log.read_latest(
            self.topics.data, p, position, max_records=sys.maxsize, max_bytes=_LATEST_BYTES
        )
        if not latest:
            return None, after
        loaded = load_latest(self.table, p, latest)
        if loaded is None:
            loaded = load_batch(self.table, p, self._entries(p, position, after), self.topics.data)
        return loaded, after

    def _load_entries(self, p: int, position: int) -> tuple[Loaded | None, int]:
        """The next stretch of the data topic of ``p``, read record by record; None at the
        end."""
        data = self.topics.data
        entries: list[Entry] | list[Record]
        if self._reads_entries and not self._headers:
            entries, position = self.log.read_entries(
                data, p, position, max_records=READ_BATCH * 5, max_bytes=_LOAD_BYTES
            )
        else:  # records as they come: building entries from them would cost a pass
            entries, position = self.log.read_batch(
                data, p, position, max_records=READ_BATCH * 5, max_bytes=_LOAD_BYTES
            )
        if not entries:
            return None, position
        loaded = load_batch(self.table, p, entries, data)
        if self._headers:
            expiring = load_headers(self.table, cast("list[Record]", entries))
            if expiring and self._deadlines_loaded is not None:
                self._deadlines_loaded(expiring)
        return loaded, position

    def _entries(self, p: int, start: int, stop: int) -> list[Entry]:
        """The entries of the data topic of ``p`` at offsets ``start`` to ``stop`` (excluded)."""
        entries: list[Entry] = []
        position = start
        while position < stop:
            got, position = self.log.read_entries(
                self.topics.data, p, position, max_records=READ_BATCH * 5, max_bytes=_LOAD_BYTES
            )
            if not got:
                break
            entries.extend(e for e in got if e[2] < stop)
        return entries

    def _keys_of(self, state: MapState, p: int) -> Iterable[bytes]:
        prefix, partition_of = state.prefix, self._keyspace.partition_of
        return [k for k in state.store if partition_of(prefix + k) == p]
