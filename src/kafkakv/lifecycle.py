"""What every resource of kafkakv shares: ``close()`` and use as a context manager; and, for
the servers kafkakv starts for tests and development (Kafka brokers, PostgreSQL), a way to
make them die with the process that started them."""

from __future__ import annotations

import ctypes
import os
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import Self

__all__ = ["Closeable", "die_with_parent_hook"]

_PR_SET_PDEATHSIG = 1


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


def die_with_parent_hook(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that asks the kernel (Linux
    ``PR_SET_PDEATHSIG``) to send ``sig`` to the child when the thread that started it exits:
    also when this process is killed with SIGKILL, which no ``atexit`` or ``finally`` sees.

    ``libc`` is loaded here, in the parent: the hook runs between fork and exec, where only
    async-signal-safe work belongs. A parent that died before the hook ran is caught by
    comparing ``getppid()`` with the pid it had. Raises ``OSError`` where ``prctl`` is not
    available (not Linux).
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except AttributeError as exc:
        raise OSError(f"prctl(PR_SET_PDEATHSIG) is not available here: {exc}") from exc
    parent = os.getpid()

    def hook() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent:
            os._exit(126)

    return hook
