"""What map replicas report to Prometheus: one collector for every live replica of a process.

========================================  =========  ==========================================
metric                                    type       meaning (labels: map, topic, replica;
                                                     + partition where said)
========================================  =========  ==========================================
``kafkakv_map_updates_applied_total``     counter    + partition: update records applied since
                                                     the replica opened, whatever their outcome
                                                     (barriers and flush marks aside)
``kafkakv_map_apply_lag``                 gauge      + partition: ops offsets between the
                                                     applied position and the log's end offset
``kafkakv_map_end_offset_age_seconds``    gauge      + partition: how old the end offset behind
                                                     ``apply_lag`` is
``kafkakv_map_updates_in_flight``         gauge      this replica's updates not resolved yet
``kafkakv_map_flush_duration_seconds``    histogram  flushes this replica wrote, request to
                                                     commit
``kafkakv_map_errors_total``              counter    records noted in ``errors()``
``kafkakv_map_stalled``                   gauge      + partition, function: 1 while this replica
                                                     stopped applying it for want of
                                                     ``function`` (else 0, ``function=""``)
``kafkakv_map_applied_offset``            gauge      + partition: the next ops offset to apply
                                                     (while stalled: the record stalled at)
``kafkakv_map_flushed_offset``            gauge      + partition: the last ops offset a flush
                                                     covered
``kafkakv_map_unreadable_keys``           gauge      keys stored as written that this replica's
                                                     codecs cannot read (left out of iteration)
========================================  =========  ==========================================

``replica`` tells apart replicas of one map in one process (the engine's origin id, in hex).
Maps that share a topic set (``db.maps``) share one replica: their series other than
``unreadable_keys`` are the replica's, the same under each map's name. A child made by fork
reports only the replicas it opened.

Everything is read from the replicas when Prometheus scrapes (or
``prometheus_client.generate_latest`` runs), except what cannot be: the applier adds each
batch's update count to an integer, and a flush that wrote notes its duration. Only the end
offsets behind ``apply_lag`` take I/O: a scrape asks the log for them from a thread of its own
and waits for the answer at most ``SCRAPE_WAIT`` seconds in all, then reports the last end
offsets the log gave (a lower bound of the lag while it does not answer; the age says so).
A partition the log never answered for has no lag series yet. At most one such read per
replica is under way. The collector joins ``prometheus_client.REGISTRY`` when the first map
opens; serve it with :func:`kafkakv.metrics.serve`.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Protocol

from prometheus_client import REGISTRY
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kafkakv.log.base import Log

if TYPE_CHECKING:
    from kafkakv.errors import PartitionStalledError
    from kafkakv.map.hooks import Hooks
    from kafkakv.map.machine import ErrorLog, MapState, PartitionMachine
    from kafkakv.map.topics import MapTopics

__all__ = [
    "FLUSH_BUCKETS",
    "SCRAPE_WAIT",
    "FlushTimes",
    "Reported",
    "forget",
    "register",
    "track",
]

log = logging.getLogger("kafkakv.map")

#: A scrape waits at most this long, in all, for the logs' end offsets.
SCRAPE_WAIT = 1.0

#: Upper bounds of the flush duration buckets, in seconds (+Inf is added).
FLUSH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class FlushTimes:
    """A histogram of flush durations, observed by the engine and read by the collector. A
    flush is rare (one per ``flush_period`` updates): a lock and a bisect per observation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(FLUSH_BUCKETS) + 1)  # the last one: above every bound
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(FLUSH_BUCKETS, seconds)] += 1
            self._sum += seconds

    def buckets(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative ``(le, count)`` pairs, +Inf last, and the sum of the durations."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, count in zip([*map(str, FLUSH_BUCKETS), "+Inf"], counts, strict=True):
            running += count
            cumulative.append((bound, float(running)))
        return cumulative, total


class _EndOffsets:
    """The ops end offsets of one replica's partitions, as the log last gave them. They are
    read in a thread of their own, one read at a time, so a slow or unreachable log holds up
    no scrape for longer than it is willing to wait."""

    def __init__(self, log: Log, topic: str, partitions: Iterable[int]) -> None:
        self._log = log
        self._topic = topic
        self._partitions = tuple(partitions)
        #: The process the replica belongs to: a child made by fork does not report it.
        self.pid = os.getpid()
        #: partition: (end offset, time.monotonic() when the log gave it)
        self.seen: dict[int, tuple[int, float]] = {}
        self.done = threading.Event()
        self.done.set()
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Start reading the end offsets, unless a read is under way already."""
        with self._lock:
            if not self.done.is_set():
                return
            self.done.clear()
        thread = threading.Thread(
            target=self._read, name=f"kafkakv-{self._topic}-end-offsets", daemon=True
        )
        thread.start()

    def _read(self) -> None:
        try:
            for p in self._partitions:
                end = self._log.end_offset(self._topic, p)
                self.seen[p] = (end, time.monotonic())
        except Exception as exc:  # the log failed or closed: report what was seen before
            log.debug("metrics: no end offsets of %s for now: %s", self._topic, exc)
        finally:
            self.done.set()


class Reported(Protocol):
    """What the collector reads of a replica (the engine, kafkakv.map.engine, is one), each
    value whole and without the replica's lock."""

    @property
    def log(self) -> Log: ...

    @property
    def topics(self) -> MapTopics: ...

    @property
    def held(self) -> Sequence[int]: ...

    @property
    def origin(self) -> bytes: ...

    @property
    def maps(self) -> Sequence[MapState]: ...

    @property
    def machines(self) -> Mapping[int, PartitionMachine]: ...

    @property
    def stalled(self) -> Mapping[int, PartitionStalledError]: ...

    @property
    def errors(self) -> ErrorLog: ...

    @property
    def flush_times(self) -> FlushTimes: ...

    def pending_updates(self) -> Sized: ...


_engines: weakref.WeakKeyDictionary[Reported, _EndOffsets] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_registered = False


def register(engine: Reported, hooks: Hooks) -> None:
    """Report ``engine``'s maps once it is open (``hooks.started``) until it closes
    (``hooks.closing``)."""
    hooks.started.append(functools.partial(track, engine))
    hooks.closing.append(functools.partial(forget, engine))


def track(engine: Reported) -> None:
    """Report ``engine``'s maps until it closes (it is forgotten then)."""
    global _registered
    ends = _EndOffsets(engine.log, engine.topics.ops, engine.held)
    with _lock:
        _engines[engine] = ends
        if not _registered:
            REGISTRY.register(_MapCollector())
            _registered = True


def forget(engine: Reported) -> None:
    with _lock:
        _engines.pop(engine, None)


_BASE = ["map", "topic", "replica"]
_PART = [*_BASE, "partition"]


class _Families:
    """The metric families of one scrape, in the order of the module docstring."""

    def __init__(self) -> None:
        self.updates_applied = CounterMetricFamily(
            "kafkakv_map_updates_applied",
            "Update records the replica applied since it opened, whatever their outcome",
            labels=_PART,
        )
        self.lag = GaugeMetricFamily(
            "kafkakv_map_apply_lag",
            "Ops offsets between the replica's applied position and the log's end offset",
            labels=_PART,
        )
        self.age = GaugeMetricFamily(
            "kafkakv_map_end_offset_age_seconds",
            "Seconds since the log gave the end offset behind kafkakv_map_apply_lag",
            labels=_PART,
        )
        self.in_flight = GaugeMetricFamily(
            "kafkakv_map_updates_in_flight",
            "Updates of this replica not resolved yet",
            labels=_BASE,
        )
        self.flushes = HistogramMetricFamily(
            "kafkakv_map_flush_duration_seconds",
            "Flushes this replica wrote, from request to commit",
            labels=_BASE,
        )
        self.errors = CounterMetricFamily(
            "kafkakv_map_errors",
            "Records noted in errors() since the replica started",
            labels=_BASE,
        )
        self.stalled = GaugeMetricFamily(
            "kafkakv_map_stalled",
            "1 while the replica stopped applying the partition for want of function",
            labels=[*_PART, "function"],
        )
        self.applied = GaugeMetricFamily(
            "kafkakv_map_applied_offset", "Next ops offset the replica applies", labels=_PART
        )
        self.flushed = GaugeMetricFamily(
            "kafkakv_map_flushed_offset", "Last ops offset a flush covered", labels=_PART
        )
        self.unreadable = GaugeMetricFamily(
            "kafkakv_map_unreadable_keys",
            "Keys stored as written that this replica's codecs cannot read",
            labels=_BASE,
        )

    def __iter__(self) -> Iterator[Metric]:
        return iter(vars(self).values())


class _MapCollector(Collector):
    def describe(self) -> Iterator[Metric]:
        return iter(_Families())  # registering reads no replica

    def collect(self) -> Iterator[Metric]:
        f = _Families()
        pid = os.getpid()
        with _lock:
            engines = [(engine, ends) for engine, ends in _engines.items() if ends.pid == pid]
        for _, ends in engines:
            ends.refresh()
        deadline = time.monotonic() + SCRAPE_WAIT
        for _, ends in engines:
            ends.done.wait(max(0.0, deadline - time.monotonic()))
        now = time.monotonic()
        for engine, ends in engines:
            topic, replica = engine.topics.data, engine.origin.hex()
            count = len(engine.pending_updates())
            times = engine.flush_times.buckets()
            seen = dict(ends.seen)
            stalls = dict(engine.stalled)
            # Without the replica's lock, which appliers and listeners hold: each value is
            # read whole, and a scrape never waits for an apply.
            machines = list(engine.machines.items())
            for state in engine.maps:
                labels = [state.name, topic, replica]
                f.in_flight.add_metric(labels, count)
                f.flushes.add_metric(labels, *times)
                f.errors.add_metric(labels, engine.errors.total)
                f.unreadable.add_metric(labels, len(state.unreadable))
                for p, machine in machines:
                    at = [*labels, str(p)]
                    position = machine.applied
                    f.updates_applied.add_metric(at, machine.updates)
                    f.applied.add_metric(at, position)
                    f.flushed.add_metric(at, machine.flushed)
                    stall = stalls.get(p)
                    if stall is None:
                        f.stalled.add_metric([*at, ""], 0)
                    else:
                        f.stalled.add_metric([*at, stall.function or ""], 1)
                    if p in seen:
                        end, when = seen[p]
                        f.lag.add_metric(at, max(0, end - position))
                        f.age.add_metric(at, now - when)
        yield from f
