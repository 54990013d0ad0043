"""``cancel_on_interrupt``: Ctrl-C cancels the session's jobs, then the block stops with
KeyboardInterrupt and the previous SIGINT handler is back.

Most tests give it a stand-in session that only counts ``cancelAllJobs`` calls (the handler
and its thread are the logic under test); the last one cancels a running job of the real
session."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import pytest

from kafkakv.pipeline import Interruption, cancel_on_interrupt
from kafkakv.pipeline.jobs import CANCELLING
from tests.waiting import wait_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_QUICK_S = 0.005
"""How often the tests with the stand-in session cancel."""


class _Context:
    """The one call ``cancel_on_interrupt`` makes on a SparkContext, counted."""

    def __init__(self) -> None:
        self.cancels = 0
        self.first = threading.Event()

    def cancelAllJobs(self) -> None:
        self.cancels += 1
        self.first.set()


class _Session:
    def __init__(self) -> None:
        self.sparkContext = _Context()


@pytest.fixture
def session() -> _Session:
    return _Session()


@pytest.fixture
def handler() -> Iterator[Any]:
    """The SIGINT handler before the test, checked to be back after it."""
    before = signal.getsignal(signal.SIGINT)
    yield before
    assert signal.getsignal(signal.SIGINT) is before


def _guard(session: _Session, lines: list[str] | None = None) -> Any:
    return cancel_on_interrupt(
        cast("SparkSession", session),
        progress=None if lines is None else lines.append,
        every=_QUICK_S,
    )


def _cancels_stop(context: _Context) -> None:
    """The cancelling thread is gone: the count no longer moves."""
    count = context.cancels
    time.sleep(10 * _QUICK_S)
    assert context.cancels == count


def test_without_ctrl_c_the_block_runs_as_is(session: _Session, handler: Any) -> None:
    with _guard(session) as interruption:
        assert isinstance(interruption, Interruption)
        assert signal.getsignal(signal.SIGINT) is not handler
        assert not interruption.requested
    assert session.sparkContext.cancels == 0


def test_an_error_without_ctrl_c_passes_through(session: _Session, handler: Any) -> None:
    with pytest.raises(ValueError, match="boom"), _guard(session):
        raise ValueError("boom")
    assert session.sparkContext.cancels == 0


def test_ctrl_c_cancels_until_the_block_ends_then_raises(session: _Session, handler: Any) -> None:
    lines: list[str] = []
    context = session.sparkContext
    with pytest.raises(KeyboardInterrupt) as stopped, _guard(session, lines) as interruption:
        signal.raise_signal(signal.SIGINT)
        assert interruption.requested  # and the block goes on: the action fails, or ends
        assert context.first.wait(5)
        wait_for(lambda: context.cancels >= 3, 5, "a third cancel", interval=_QUICK_S)  # again
    assert stopped.value.__cause__ is None  # the block had finished
    assert lines == [CANCELLING]
    _cancels_stop(context)


def test_the_failure_of_the_cancelled_action_is_the_cause(session: _Session, handler: Any) -> None:
    with pytest.raises(KeyboardInterrupt) as stopped, _guard(session):
        signal.raise_signal(signal.SIGINT)
        assert session.sparkContext.first.wait(5)
        raise RuntimeError("job cancelled")
    assert isinstance(stopped.value.__cause__, RuntimeError)
    _cancels_stop(session.sparkContext)


def test_a_second_ctrl_c_raises_at_once(session: _Session, handler: Any) -> None:
    reached = False
    with pytest.raises(KeyboardInterrupt), _guard(session):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        reached = True
    assert not reached
    _cancels_stop(session.sparkContext)


def test_outside_the_main_thread_nothing_is_installed(session: _Session, handler: Any) -> None:
    seen: list[object] = []

    def run() -> None:
        with _guard(session) as interruption:
            seen.append(signal.getsignal(signal.SIGINT))
            seen.append(interruption.requested)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [handler, False]


def test_ctrl_c_cancels_a_running_spark_job(spark: Any, handler: Any) -> None:
    """A job whose tasks sleep a minute stops within seconds of Ctrl-C, and the session
    runs the next job."""
    tracker = spark.sparkContext.statusTracker()
    lines: list[str] = []

    def press_ctrl_c() -> None:  # once the job runs; to the main thread, as a terminal would
        deadline = time.monotonic() + 60
        while not tracker.getActiveJobsIds() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        main = threading.main_thread().ident
        assert main is not None
        signal.pthread_kill(main, signal.SIGINT)

    def slow(x: int) -> int:  # nested: pickled by value for the Python workers
        time.sleep(60)
        return x

    presser = threading.Thread(target=press_ctrl_c, daemon=True)
    began = time.monotonic()
    with (
        pytest.raises(KeyboardInterrupt) as stopped,
        cancel_on_interrupt(spark, progress=lines.append),
    ):
        presser.start()
        spark.sparkContext.parallelize(range(2), 2).map(slow).collect()
    presser.join()
    assert time.monotonic() - began < 45
    assert lines == [CANCELLING]
    cause = stopped.value.__cause__
    assert cause is not None and "cancel" in str(cause).lower(), cause
    assert spark.range(3).count() == 3
