"""What map replicas report to Prometheus: one collector for every live replica of a process.

===================================  =======  ===============================================
metric                               type     meaning (labels: map, topic, replica; + partition)
===================================  =======  ===============================================
``kafkakv_map_applied_offset``       gauge    + partition: the next ops offset to apply
``kafkakv_map_flushed_offset``       gauge    + partition: the last ops offset a flush covered
``kafkakv_map_stalled``              gauge    + partition: 1 while this replica stopped applying
                                              it (:class:`~kafkakv.errors.PartitionStalledError`)
``kafkakv_map_errors_total``         counter  records noted in ``errors()`` since the start
``kafkakv_map_unreadable_keys``      gauge    keys stored as written that this replica's codecs
                                              cannot read (left out of iteration)
``kafkakv_map_pending_updates``      gauge    this replica's updates not resolved yet
===================================  =======  ===============================================

``replica`` tells apart replicas of one map in one process (the engine's origin id, in hex).
The values are read from the replicas when Prometheus scrapes (or
``prometheus_client.generate_latest`` runs), so updating a map costs nothing more. The
collector joins ``prometheus_client.REGISTRY`` when the first map opens; serve it with
:func:`kafkakv.metrics.serve`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from kafkakv.map.engine import ReplicaEngine

__all__ = ["forget", "track"]

_engines: weakref.WeakSet[ReplicaEngine] = weakref.WeakSet()
_lock = threading.Lock()
_registered = False


def track(engine: ReplicaEngine) -> None:
    """Report ``engine``'s maps until it closes (it is forgotten then)."""
    global _registered
    with _lock:
        _engines.add(engine)
        if not _registered:
            REGISTRY.register(_MapCollector())
            _registered = True


def forget(engine: ReplicaEngine) -> None:
    _engines.discard(engine)


class _MapCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        base = ["map", "topic", "replica"]
        part = [*base, "partition"]
        applied = GaugeMetricFamily(
            "kafkakv_map_applied_offset", "Next ops offset the replica applies", labels=part
        )
        flushed = GaugeMetricFamily(
            "kafkakv_map_flushed_offset", "Last ops offset a flush covered", labels=part
        )
        stalled = GaugeMetricFamily(
            "kafkakv_map_stalled",
            "1 while the replica stopped applying the partition (see errors())",
            labels=part,
        )
        errors = CounterMetricFamily(
            "kafkakv_map_errors", "Records noted in errors() since the replica started", labels=base
        )
        unreadable = GaugeMetricFamily(
            "kafkakv_map_unreadable_keys",
            "Keys stored as written that this replica's codecs cannot read",
            labels=base,
        )
        pending = GaugeMetricFamily(
            "kafkakv_map_pending_updates", "Updates of this replica not resolved yet", labels=base
        )
        for engine in list(_engines):
            topic, replica = engine.topics.data, engine.origin.hex()
            count = len(engine.pending_updates())
            positions = engine.positions()
            for state in engine.maps:
                labels = [state.name, topic, replica]
                errors.add_metric(labels, engine.errors.total)
                unreadable.add_metric(labels, len(state.unreadable))
                pending.add_metric(labels, count)
                for p, at in positions.items():
                    applied.add_metric([*labels, str(p)], at.applied)
                    flushed.add_metric([*labels, str(p)], at.flushed)
                    stalled.add_metric([*labels, str(p)], 1 if p in engine.stalled else 0)
        yield from (applied, flushed, stalled, errors, unreadable, pending)
