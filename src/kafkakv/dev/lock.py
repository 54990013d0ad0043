"""An exclusive ``flock`` on a file, held for a ``with`` block (released if the process dies)."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path

from kafkakv.dev.errors import ClusterError

__all__ = ["exclusive_lock"]

_RETRY_S = 0.25


@contextlib.contextmanager
def exclusive_lock(path: Path, timeout: float, busy: ClusterError) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the ``with`` block.

    Waits up to ``timeout`` seconds for another holder (``0``: tries once) and then raises
    ``busy``. Raises :class:`~kafkakv.dev.errors.ClusterError` when the file cannot be opened.
    """
    try:
        handle = open(path, "a+b")  # noqa: SIM115 - closed in the finally below
    except OSError as exc:
        raise ClusterError(f"cannot open the lock file {path}: {exc}") from exc
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise busy from None
                time.sleep(_RETRY_S)
        yield
    finally:
        handle.close()  # closing the descriptor releases the lock
