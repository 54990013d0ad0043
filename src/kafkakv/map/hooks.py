"""The engine's one extension point: where a feature that watches or extends the apply step
registers, instead of adding branches to the engine.

A feature is a module of its own (expiry's :mod:`kafkakv.map.reaper`, :mod:`kafkakv.map.metrics`)
whose builder (``reaper_of``, ``metrics.register``) the engine calls with itself and its hooks,
and which registers callables here when the map's settings ask for it:

* ``steps``: ``observer(p, step)`` after each :class:`~kafkakv.map.machine.Step` of partition
  ``p`` is written to the stores and its position published, before futures resolve and
  listeners hear of it; replica lock held, in log order per partition. This is the hot path:
  an observer returns at once when the step says nothing for it;
* ``deadlines_loaded``: the ``(deadline, record key)`` pairs a bootstrap read from the data
  topic's headers;
* ``flush_deadlines``: the deadline of each key of a flush batch (one feature may give it);
* ``started``: after every held partition is bootstrapped, before the threads start;
* ``threads``: ``(name, loop)`` pairs, each run in a daemon thread of the replica;
* ``closing``: when ``close()`` begins (no more updates are taken; what is in flight drains);
* ``stopped``: once nothing more is applied (a loop in ``threads`` must end then).

Changes reach the change feed and the listeners through each map's own lists
(``MapState.taps``, ``MapState.listeners``; see :mod:`kafkakv.map.listeners`), in log order with
the futures of the same step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kafkakv.map.machine import Step

__all__ = ["Hooks", "StepObserver"]

StepObserver = Callable[[int, Step], None]
"""Told each applied step of a partition: ``observer(p, step)``."""


@dataclass(eq=False)
class Hooks:
    """The callables features registered with one engine; see the module docstring."""

    steps: list[StepObserver] = field(default_factory=list)
    deadlines_loaded: list[Callable[[Sequence[tuple[int, bytes]]], None]] = field(
        default_factory=list
    )
    flush_deadlines: Callable[[Sequence[bytes]], list[int | None]] | None = None
    started: list[Callable[[], None]] = field(default_factory=list)
    threads: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    closing: list[Callable[[], None]] = field(default_factory=list)
    stopped: list[Callable[[], None]] = field(default_factory=list)

    def loaded(self, expiring: Sequence[tuple[int, bytes]]) -> None:
        """Tell every ``deadlines_loaded`` hook of ``expiring``."""
        for hook in self.deadlines_loaded:
            hook(expiring)

    @staticmethod
    def run(hooks: Sequence[Callable[[], None]]) -> None:
        """Call each of ``hooks`` (``started``, ``closing``, ``stopped``), in order."""
        for hook in hooks:
            hook()
