"""Telling a map's taps (change feeds) and listeners of a change the replica applied.

The engine queues each change of a step as an event and runs the events in log order, with
the futures of the same step, under the replica lock: a listener sees the map as of its
change or later, never earlier. Taps (:mod:`kafkakv.map.feed`) get the encoded key and values;
listeners decoded ones. A bulk batch's changes come as one run (:func:`tell_run`). A listener that raises is logged and the others still run; a change the
map's codecs cannot read is skipped for listeners (logged), never for taps.
"""

from __future__ import annotations

import logging

from kafkakv.errors import KafkaKVError
from kafkakv.map.machine import ChangeRun, MapState

__all__ = ["ChangeEvent", "tell", "tell_run"]

log = logging.getLogger("kafkakv.map")

ChangeEvent = tuple[bytes, bytes | None, bytes | None, bool, int]
"""A change as a step's event carries it: store key, old value, new value, whether this
replica made it, ops offset."""


def tell(state: MapState, p: int, change: ChangeEvent) -> None:
    """Call every tap and listener of map ``state`` with ``change`` of partition ``p``."""
    key, old, new, mine, offset = change
    for tap in list(state.taps):  # a feed may detach itself meanwhile
        tap(p, offset, key, old, new)
    if not state.listeners:
        return
    try:
        k = state.keys.decode(key)
        o = None if old is None else state.values.decode(old)
        n = None if new is None else state.values.decode(new)
    except KafkaKVError as exc:
        log.warning("listener of %s skipped a change it cannot decode: %s", state.name, exc)
        return
    for listener in list(state.listeners):
        try:
            listener(k, o, n, mine)
        except Exception:
            log.exception("a listener of map %s raised", state.name)


def tell_run(state: MapState, p: int, run: ChangeRun) -> None:
    """Give every tap of map ``state`` the changes ``run`` of partition ``p``: in one call to
    a tap's ``take_run`` where it has one, else one call per change. (A map with listeners
    has no runs: its batches take the record loop.)"""
    for tap in list(state.taps):
        take_run = getattr(tap, "take_run", None)
        if take_run is not None:
            take_run(p, run)
            continue
        for offset, key, old, new in zip(*run, strict=True):
            tap(p, offset, key, old, new)
