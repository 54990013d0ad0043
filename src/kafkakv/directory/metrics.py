"""What a directory reports to Prometheus.

==========================================  ======  ==========================================
metric                                      type    labels, meaning
==========================================  ======  ==========================================
``kafkakv_directory_ready``                 gauge   directory, topic: 1 once ready, else 0
``kafkakv_directory_ready_seconds``         gauge   directory, topic: start to ready
``kafkakv_directory_entries``               gauge   directory, topic: keys held
``kafkakv_directory_records_total``         counter directory, topic: records applied
``kafkakv_directory_errors_total``          counter directory, topic: records skipped as errors
``kafkakv_directory_position``              gauge   + partition: next offset to read
``kafkakv_directory_end_offset``            gauge   + partition: end offset last seen
``kafkakv_directory_lag``                   gauge   + partition: end offset - position (>= 0)
==========================================  ======  ==========================================

Each registry gets one set of these metric families, shared by every directory that reports
to it; a directory's series carry its name, and two live directories may not share a name in
one registry (:class:`~kafkakv.errors.ConfigError`). Closing a directory removes its series.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from kafkakv.errors import ConfigError

__all__ = ["DirectoryMetrics"]

_BASE = ("directory", "topic")
_PART = ("directory", "topic", "partition")


class _Families:
    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = _BASE) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        self.ready = gauge("kafkakv_directory_ready", "1 once the directory is ready, else 0")
        self.ready_seconds = gauge(
            "kafkakv_directory_ready_seconds", "Seconds from start to ready (loaded)"
        )
        self.entries = gauge("kafkakv_directory_entries", "Keys the directory holds")
        self.records = Counter(
            "kafkakv_directory_records", "Records applied", _BASE, registry=registry
        )
        self.errors = Counter(
            "kafkakv_directory_errors",
            "Records skipped because they failed to decode or transform",
            _BASE,
            registry=registry,
        )
        self.position = gauge("kafkakv_directory_position", "Next offset to read", _PART)
        self.end_offset = gauge("kafkakv_directory_end_offset", "End offset last seen", _PART)
        self.lag = gauge("kafkakv_directory_lag", "End offset minus position", _PART)
        self.names: set[str] = set()


_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class DirectoryMetrics:
    """The series of one directory (``name``) on ``topic`` for ``partitions``, in
    ``registry`` (default: prometheus_client's global one). Cheap to update: a few dict
    lookups per call; the directory updates them once per batch, not per record."""

    def __init__(
        self,
        name: str,
        topic: str,
        partitions: Iterable[int],
        registry: CollectorRegistry | None = None,
    ) -> None:
        registry = REGISTRY if registry is None else registry
        with _LOCK:
            families = _FAMILIES.get(registry)
            if families is None:
                families = _FAMILIES[registry] = _Families(registry)
            if name in families.names:
                raise ConfigError(
                    f"a directory named {name!r} already reports to this metrics registry: "
                    "give this one another name (name=...)"
                )
            families.names.add(name)
        self._families = families
        self.name = name
        self.topic = topic
        self._base = (name, topic)
        self._closed = False
        f = families
        self.records = f.records.labels(name, topic)
        self.errors = f.errors.labels(name, topic)
        self.entries = f.entries.labels(name, topic)
        self._ready = f.ready.labels(name, topic)
        self._ready_seconds = f.ready_seconds.labels(name, topic)
        self._ready.set(0)
        self._parts = {
            p: (
                f.position.labels(name, topic, str(p)),
                f.end_offset.labels(name, topic, str(p)),
                f.lag.labels(name, topic, str(p)),
            )
            for p in partitions
        }
        self._ends = dict.fromkeys(self._parts, 0)
        self._positions = dict.fromkeys(self._parts, 0)

    def set_ready(self, seconds: float) -> None:
        self._ready.set(1)
        self._ready_seconds.set(seconds)

    def set_position(self, partition: int, offset: int) -> None:
        self._positions[partition] = offset
        self._ends[partition] = end = max(self._ends[partition], offset)
        position, end_offset, lag = self._parts[partition]
        position.set(offset)
        end_offset.set(end)
        lag.set(end - offset)

    def set_end(self, partition: int, end: int) -> None:
        self._ends[partition] = end = max(end, self._positions[partition])
        _, end_offset, lag = self._parts[partition]
        end_offset.set(end)
        lag.set(end - self._positions[partition])

    def close(self) -> None:
        """Remove this directory's series and free its name. Idempotent."""
        with _LOCK:
            if self._closed:
                return
            self._closed = True
            f = self._families
            for family in (f.records, f.errors, f.entries, f.ready, f.ready_seconds):
                family.remove(*self._base)
            for p in self._parts:
                for family in (f.position, f.end_offset, f.lag):
                    family.remove(*self._base, str(p))
            f.names.discard(self.name)
