"""What every resource of kafkakv shares: ``close()`` and use as a context manager."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["Closeable"]


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
