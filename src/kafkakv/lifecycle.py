"""What every resource of kafkakv shares: ``close()`` and use as a context manager; and what
runs at the interpreter's exit for the resources a program left open."""

from __future__ import annotations

import atexit
import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import Self

__all__ = ["Closeable", "ExitStage", "at_exit"]


class ExitStage(enum.IntEnum):
    """When an :func:`at_exit` function runs: every ``DRAIN`` one before any ``RELEASE`` one."""

    DRAIN = 0  #: deliver what the program left pending (a database's updates)
    RELEASE = 1  #: then close what delivers it (a Kafka log's clients)


_at_exit: dict[ExitStage, list[Callable[[], None]]] = {stage: [] for stage in ExitStage}


def at_exit(stage: ExitStage, function: Callable[[], None]) -> None:
    """Run ``function`` at the interpreter's exit, in ``stage``. One ``atexit`` hook runs
    them all, stage by stage, whatever order the modules that ask were imported in (an
    optional backend is imported late, and ``atexit`` runs the last registered first)."""
    _at_exit[stage].append(function)


def _run_at_exit() -> None:
    for stage in ExitStage:
        for function in _at_exit[stage]:
            function()


atexit.register(_run_at_exit)


class Closeable(ABC):
    """A resource released by :meth:`close`; ``with`` closes it on the way out."""

    @abstractmethod
    def close(self) -> None:
        """Release every resource. Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
