"""What a C function leaves behind: for the leak tests of the C modules."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Growth:
    """Bytes still allocated after a second run of the work, and the reference counts of the
    watched objects before and after it."""

    allocated: int
    refs_before: list[int]
    refs_after: list[int]


def growth(work: Callable[[], None], watched: Sequence[object]) -> Growth:
    """Run ``work`` once to warm caches (interned strings, lazily built paths), then again
    under tracemalloc, with the cyclic garbage collected before each measurement."""
    work()
    gc.collect()
    before = [sys.getrefcount(x) for x in watched]
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        work()
        gc.collect()
        allocated = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    return Growth(allocated, before, [sys.getrefcount(x) for x in watched])
