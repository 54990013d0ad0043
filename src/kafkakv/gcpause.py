"""Pausing the cyclic garbage collector around batch work that allocates many short-lived
objects (decoding a read, applying a batch of ops).

Such objects cannot form cycles and die by reference counting, but each counts towards the
collector's allocation threshold: without the pause a batch of thousands triggers dozens of
collections, and every so often a full one scans every live object of the process (measured:
a third of read time, and ~120 ms pauses in a process holding a million objects). Collection
resumes when the batch ends. If the application disabled the collector, it stays disabled.

Drop the references to a batch's objects inside the block (``del records``) rather than
after it: the allocations of the pause still count, so the first young collection after it
scans every object allocated meanwhile that is still referenced then. For a flush of a
million keys that scan was a third of the flush's time.
"""

from __future__ import annotations

import gc

__all__ = ["gc_paused"]


class gc_paused:  # lower case: it is used like a function, ``with gc_paused():``
    """Disable the cyclic collector for the ``with`` block (re-enable only what it disabled).

    A class rather than a generator-based context manager: it runs on every read and every
    applied batch, and costs a third as much.
    """

    __slots__ = ("_paused",)

    def __enter__(self) -> None:
        self._paused = gc.isenabled()
        if self._paused:
            gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._paused:
            gc.enable()
