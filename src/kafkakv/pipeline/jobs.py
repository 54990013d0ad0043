"""Ctrl-C while Spark jobs run: cancel them, then stop with :class:`KeyboardInterrupt`.

PySpark's own SIGINT handler cancels the jobs from the interrupted thread, which is usually in
the middle of a Py4J call to the JVM: the cancel then fails and Py4J logs tracebacks.
:func:`cancel_on_interrupt` replaces it for the length of a block with a handler that only
notes the request; a thread of its own cancels every job of the session at once and again
every ``every`` seconds (an action started after the first cancel is cancelled too) until the
block ends. The running action then fails, and the block ends with ``KeyboardInterrupt``, its
cause the action's error. A second Ctrl-C raises ``KeyboardInterrupt`` at once.

Work already done by a cancelled job stays done: kafkakv's jobs are written so that a run
stopped this way is completed by the next one (:class:`~kafkakv.pipeline.IngestJob` moves its
position only after the rows are written).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Interruption", "cancel_on_interrupt"]

CANCEL_EVERY_S = 0.05
"""After Ctrl-C, the session's jobs are cancelled this often until the block ends."""

CANCELLING = "interrupted: cancelling the Spark jobs (Ctrl-C again to stop at once)"
"""What :func:`cancel_on_interrupt` reports through ``progress`` at the first Ctrl-C."""


class Interruption:
    """Whether Ctrl-C was pressed in a :func:`cancel_on_interrupt` block (read-only)."""

    __slots__ = ("_event",)

    def __init__(self, event: threading.Event) -> None:
        self._event = event

    @property
    def requested(self) -> bool:
        """True once Ctrl-C was pressed in the block: its jobs are being cancelled."""
        return self._event.is_set()


@contextmanager
def cancel_on_interrupt(
    spark: SparkSession,
    *,
    progress: Callable[[str], None] | None = None,
    every: float = CANCEL_EVERY_S,
) -> Iterator[Interruption]:
    """Run the block with Ctrl-C (SIGINT) cancelling ``spark``'s jobs (see the module doc).

    The first Ctrl-C calls ``progress`` with :data:`CANCELLING` (from another thread) and
    cancels every job of the session now and every ``every`` seconds until the block ends;
    the block then raises :class:`KeyboardInterrupt` whether its action failed (the failure
    is the cause) or had already finished. A second Ctrl-C raises ``KeyboardInterrupt`` in the
    block at once. The previous SIGINT handler is back when the block ends.

    Signals are handled in the main thread only: elsewhere the block runs without this
    handler. Costs nothing until Ctrl-C; then one call to the JVM per ``every`` seconds.
    """
    requested = threading.Event()
    done = threading.Event()
    interruption = Interruption(requested)
    if threading.current_thread() is not threading.main_thread():
        yield interruption
        return

    def cancel() -> None:
        if progress is not None:
            progress(CANCELLING)
        context = spark.sparkContext
        with suppress(Exception):  # a JVM that is gone has no job left to cancel
            while True:
                context.cancelAllJobs()
                if done.wait(every):
                    return

    canceller: list[threading.Thread] = []

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()
        thread = threading.Thread(target=cancel, name="kafkakv-cancel-spark", daemon=True)
        canceller.append(thread)
        thread.start()

    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield interruption
    except Exception as exc:
        if requested.is_set():  # the cancelled action's failure: Ctrl-C is the news
            raise KeyboardInterrupt from exc
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        done.set()
        for thread in canceller:
            thread.join()
    if requested.is_set():
        raise KeyboardInterrupt
