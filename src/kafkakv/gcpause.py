"""Pausing the cyclic garbage collector around batch work that allocates many short-lived
objects (decoding a read, applying a batch of ops).

Such objects cannot form cycles and die by reference counting, but each counts towards the
collector's allocation threshold: without the pause a batch of thousands triggers dozens of
collections, and every so often a full one scans every live object of the process (measured:
a third of read time, and ~120 ms pauses in a process holding a million objects). Collection
resumes when the batch ends. If the application disabled the collector, it stays disabled.

The collector is one per process, so the pause is too: it lasts while any thread is inside a
block, and ends when the last one leaves. (Each block switching it by itself let one thread's
exit turn it back on under another thread still in its batch, whose allocations then paid for
collections after all: an engine's follower, sender and flusher overlap all the time.)

Drop the references to a batch's objects inside the block (``del records``) rather than
after it: the allocations of the pause still count, so the first young collection after it
scans every object allocated meanwhile that is still referenced then. For a flush of a
million keys that scan was a third of the flush's time.

Two implementations with one behaviour: ``kafkakv._gcpause`` in C, built from ``_gcpause.c``
when kafkakv is installed where a C compiler is, and :class:`py_gc_paused` below, used when it
is not built or ``KAFKAKV_PURE_PYTHON=1`` is set (``tests/test_gcpause.py`` runs both). In C
the block's two methods are no Python calls: a replica's follower enters two blocks on every
wake-up, between another process's write and the listener. :data:`COMPILED` says which one
this process uses.
"""

from __future__ import annotations

import gc
import os
import threading
from typing import TYPE_CHECKING

from kafkakv._native import compiled

__all__ = ["COMPILED", "gc_paused", "py_gc_paused"]

_lock = threading.Lock()
_open = 0  # blocks open now, in every thread
_resume = False  # the collector was on when the first of them began: turn it on again
_mine = threading.local()  # .open: blocks open in this thread (what survives a fork)


class py_gc_paused:  # lower case: it is used like a function, ``with gc_paused():``
    """Disable the cyclic collector while any thread is in a ``with`` block (re-enable only
    what the first block disabled).

    A class rather than a generator-based context manager: it runs on every read and every
    applied batch, and costs a third as much.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        global _open, _resume
        with _lock:
            if _open == 0:
                _resume = gc.isenabled()
                if _resume:
                    gc.disable()
            _open += 1
            _mine.open = getattr(_mine, "open", 0) + 1

    def __exit__(self, *exc: object) -> None:
        global _open
        with _lock:  # counts stop at zero, as the C pause's do (a stray exit changes nothing)
            if _open > 0:
                _open -= 1
            mine = getattr(_mine, "open", 0)
            if mine > 0:
                _mine.open = mine - 1
            if _open == 0 and _resume:
                gc.enable()


def _after_fork_in_child() -> None:
    """A forked child has only the forking thread: the blocks other threads had open never
    end there. Keep this thread's own, forget theirs (and a lock one of them may have held)."""
    global _lock, _open
    _lock = threading.Lock()
    forgotten, _open = _open, getattr(_mine, "open", 0)
    if forgotten and _open == 0 and _resume:  # only what the pause turned off
        gc.enable()


os.register_at_fork(after_in_child=_after_fork_in_child)

_c = compiled("kafkakv._gcpause")
COMPILED = _c is not None
gc_paused = py_gc_paused
if not TYPE_CHECKING and _c is not None:
    gc_paused = _c.gc_paused
    os.register_at_fork(after_in_child=_c.after_fork_in_child)
