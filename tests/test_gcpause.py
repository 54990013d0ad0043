"""The collector's pause (``kafkakv.gcpause``) is one per process: it holds while any thread
is inside a block, and the collector comes back on when the last one leaves. Each case runs on
both implementations: the compiled one (``_gcpause.c``, where built) and the Python one."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kafkakv import gcpause
from kafkakv._native import PURE_PYTHON
from tests.threads import inside_in_another_thread

Pause = Callable[[], contextlib.AbstractContextManager[Any]]


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.fixture(
    params=[
        pytest.param(
            "compiled",
            marks=pytest.mark.skipif(
                not gcpause.COMPILED, reason="the C module is not built (or KAFKAKV_PURE_PYTHON=1)"
            ),
        ),
        "python",
    ]
)
def gc_paused(request: pytest.FixtureRequest) -> Pause:
    return gcpause.gc_paused if request.param == "compiled" else gcpause.py_gc_paused


def another_thread_in_a_block(gc_paused: Pause) -> contextlib.AbstractContextManager[None]:
    """Another thread inside a ``gc_paused`` block for as long as the ``with`` lasts."""
    return inside_in_another_thread(gc_paused, timeout=10)


def test_the_compiled_pause_is_the_one_in_use_where_it_is_built() -> None:
    if not PURE_PYTHON:
        try:
            compiled = importlib.import_module("kafkakv._gcpause")
        except ImportError:
            return  # not built: the Python one is in use
        assert gcpause.gc_paused is compiled.gc_paused
    else:
        assert gcpause.gc_paused is gcpause.py_gc_paused


def test_the_pause_lasts_while_any_thread_is_inside_a_block(gc_paused: Pause) -> None:
    with contextlib.ExitStack() as other:
        with gc_paused():  # this thread pauses first, then another thread begins a batch
            other.enter_context(another_thread_in_a_block(gc_paused))
        # this thread left its block first: the other one is still in its batch
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_blocks_and_a_collector_the_application_turned_off(gc_paused: Pause) -> None:
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()  # off before the pause: it stays off


def test_an_exit_without_its_enter_does_not_unbalance_later_blocks(gc_paused: Pause) -> None:
    """Both twins count open blocks down to zero, not below: a stray ``__exit__`` (a block
    entered through the other twin, say) leaves the next block pausing as it should."""
    gc_paused().__exit__(None, None, None)
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_exception_leaves_the_block_and_passes(gc_paused: Pause) -> None:
    with pytest.raises(KeyError, match="inside"), gc_paused():
        raise KeyError("inside")
    assert gc.isenabled()


def test_a_forked_child_keeps_its_own_blocks_and_forgets_the_others(gc_paused: Pause) -> None:
    with another_thread_in_a_block(gc_paused), gc_paused():
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


def test_after_a_fork_outside_any_own_block_the_collector_is_on_in_the_child(
    gc_paused: Pause,
) -> None:
    with another_thread_in_a_block(gc_paused):
        assert not gc.isenabled()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if gc.isenabled() else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_a_fork_outside_every_block_leaves_the_applications_choice_in_the_child(
    gc_paused: Pause,
) -> None:
    """A pause that ended before the application turned the collector off has no say in a
    child forked later (it used to turn it back on there)."""
    with gc_paused():
        pass
    gc.disable()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if not gc.isenabled() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
