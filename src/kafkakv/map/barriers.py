"""Barriers shared by the readers of a partition: one barrier serves a whole group.

A linearizable read needs a barrier: a record appended to the ops topic, then applied up to.
Many readers of one partition at once need not append one each. A reader joins the partition's
next group; the first member free to lead (no barrier of the partition running) closes the
group and runs one barrier for all of its members; the others wait for it and share its
outcome. A reader that arrives while a barrier runs joins the next group, never the running
one, since that barrier may have been appended before the reader's call began.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from kafkakv.errors import OperationTimeoutError

__all__ = ["SharedBarriers"]


class _Group:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = False
        self.error: BaseException | None = None


class SharedBarriers:
    """The barrier groups of ``partitions``. Nothing blocks on I/O while holding the lock."""

    def __init__(self, partitions: Iterable[int]) -> None:
        self._cond = threading.Condition()
        self._next: dict[int, _Group | None] = dict.fromkeys(partitions)
        self._busy: dict[int, bool] = dict.fromkeys(self._next, False)

    def join(
        self,
        p: int,
        deadline: float,
        barrier: Callable[[], None],
        check: Callable[[], None],
        what: str,
    ) -> None:
        """Return once a barrier of partition ``p`` run after this call began has been
        applied: lead one (``barrier()``) or wait for the group's leader. ``check()`` is
        called on every wake-up and may raise (the replica closed). Raises the leader's
        error, or :class:`~kafkakv.errors.OperationTimeoutError` (naming ``what``) at
        ``deadline``."""
        cond = self._cond
        with cond:
            group = self._next[p]
            if group is None:
                group = self._next[p] = _Group()
            while not group.done:
                check()
                if not self._busy[p] and self._next[p] is group:
                    self._busy[p] = True
                    self._next[p] = None
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OperationTimeoutError(f"no barrier of {what} in time")
                cond.wait(remaining)
            else:
                if group.error is not None:
                    raise group.error
                return
        try:  # this thread leads the group
            barrier()
        except BaseException as exc:
            group.error = exc
            raise
        finally:
            with cond:
                group.done = True
                self._busy[p] = False
                cond.notify_all()

    def wake_all(self) -> None:
        """Wake every waiting member, so that each runs its ``check()`` (on close)."""
        with self._cond:
            self._cond.notify_all()
