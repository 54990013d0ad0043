"""The collector's pause (``kafkakv.gcpause``) is one per process: it holds while any thread
is inside a block, and the collector comes back on when the last one leaves."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

import pytest

from kafkakv.gcpause import gc_paused
from tests.threads import inside_in_another_thread


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def another_thread_in_a_block() -> contextlib.AbstractContextManager[None]:
    """Another thread inside a ``gc_paused`` block for as long as the ``with`` lasts."""
    return inside_in_another_thread(gc_paused, timeout=10)


def test_the_pause_lasts_while_any_thread_is_inside_a_block() -> None:
    with contextlib.ExitStack() as other:
        with gc_paused():  # this thread pauses first, then another thread begins a batch
            other.enter_context(another_thread_in_a_block())
        # this thread left its block first: the other one is still in its batch
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_blocks_and_a_collector_the_application_turned_off() -> None:
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()  # off before the pause: it stays off


def test_a_forked_child_keeps_its_own_blocks_and_forgets_the_others() -> None:
    with another_thread_in_a_block(), gc_paused():
        pid = os.fork()
        if pid == 0:  # the child: the other thread's block does not exist here
            ok = not gc.isenabled()  # still in this thread's own block
            with gc_paused():
                pass
            ok = ok and not gc.isenabled()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert gc.isenabled()


def test_after_a_fork_outside_any_own_block_the_collector_is_on_in_the_child() -> None:
    with another_thread_in_a_block():
        assert not gc.isenabled()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if gc.isenabled() else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
