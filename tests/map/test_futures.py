"""OpFuture keeps every promise of concurrent.futures.Future while creating its condition
variable only when something waits. It takes over CPython's private Future internals; every
test runs on the lazy class and on the plain fallback a Python with other internals gets."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from kafkakv.codecs import codec_for
from kafkakv.errors import KafkaKVError, ResultDecodeError
from kafkakv.map import futures
from kafkakv.map.futures import OpFuture
from kafkakv.map.machine import MapState
from kafkakv.store.memory import DictStore


@pytest.fixture(params=["lazy", "eager"])
def make(request: pytest.FixtureRequest) -> type[OpFuture]:
    """The future class: the lazy one, or the plain fallback (futures._EagerOpFuture)."""
    return OpFuture if request.param == "lazy" else futures._EagerOpFuture


def test_this_python_keeps_the_internals_the_lazy_future_takes_over() -> None:
    """CPython 3.11-3.13 do: the fast path must not silently fall back there. On a Python
    where this fails, OpFuture is the plain fallback (correct, slower) until the lazy class
    learns the new internals."""
    probe: concurrent.futures.Future[object] = concurrent.futures.Future()
    assert set(vars(probe)) == futures._INTERNALS
    assert futures.LAZY and OpFuture is not futures._EagerOpFuture
    lazy = OpFuture()
    assert lazy._cond is None  # nothing built until something waits
    lazy.result(timeout=0) if lazy.done() else lazy.add_done_callback(lambda _: None)
    assert lazy._cond is not None


def test_completed_before_anyone_looks(make: type[OpFuture]) -> None:
    f = make()
    f.set_result(3)
    assert f.done() and f.result(timeout=0) == 3 and f.exception() is None
    g = make()
    g.set_exception(KeyError("k"))
    with pytest.raises(KeyError):
        g.result(timeout=0)
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(4)


def test_a_waiting_thread_is_woken(make: type[OpFuture]) -> None:
    f = make()
    threading.Timer(0.05, f.set_result, args=("late",)).start()
    start = time.monotonic()
    assert f.result(timeout=5) == "late" and time.monotonic() - start < 4
    g = make()
    with pytest.raises(concurrent.futures.TimeoutError):
        g.result(timeout=0.05)


def test_callbacks_wait_and_as_completed(make: type[OpFuture]) -> None:
    futures = [make() for _ in range(5)]
    seen: list[object] = []
    futures[0].add_done_callback(lambda f: seen.append(f.result()))
    for i, f in enumerate(futures):
        threading.Timer(0.01 * i, f.set_result, args=(i,)).start()
    done, pending = concurrent.futures.wait(futures, timeout=5)
    assert len(done) == 5 and not pending
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures)) == [0, 1, 2, 3, 4]
    assert seen == [0]


def test_resolve_ignores_a_cancelled_future_and_asyncio_awaits(make: type[OpFuture]) -> None:
    f = make()
    assert f.cancel() and f.cancelled()
    f.resolve("ignored")  # no error: the owner gave up on it
    g = make()

    async def main() -> object:
        asyncio.get_running_loop().call_later(0.01, g.resolve, "awaited")
        return await g

    assert asyncio.run(main()) == "awaited"


def test_many_threads_race_completion_and_waiting(make: type[OpFuture]) -> None:
    for _ in range(200):
        f = make()
        got: list[object] = []
        waiter = threading.Thread(target=lambda f=f, got=got: got.append(f.result(timeout=5)))
        waiter.start()
        f.resolve(1)
        waiter.join(5)
        assert got == [1]


def _gathered(
    lazy: bool, codec: str, n: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[OpFuture], list[object]]:
    """``n`` futures of puts to a map of ``codec`` values, of the lazy class or the plain
    fallback: the second with a callback noting its result (in the list returned), the third
    cancelled."""
    monkeypatch.setattr(futures, "LAZY", lazy)
    make = OpFuture if lazy else futures._EagerOpFuture
    state = MapState("m", b"", codec_for("str"), codec_for(codec), DictStore())
    fs = [make(state, 1, 0) for _ in range(n)]
    called: list[object] = []
    fs[1].add_done_callback(lambda f: called.append(f.result(timeout=0)))
    assert fs[2].cancel()
    return fs, called


@pytest.mark.parametrize("lazy", [True, False])
def test_a_put_group_resolves_each_future_as_complete_would(
    lazy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PutGroup resolves the futures of gathered puts at once: each with its own pair's
    previous value decoded by the map's codec, a value that does not decode as
    ResultDecodeError, a cancelled future left cancelled, a waiter's future through its
    condition (woken, its callback run)."""
    fs, called = _gathered(lazy, "json", 5, monkeypatch)
    group = futures.PutGroup(fs, 0)
    assert group.slot == 5 and group.partition == 0
    group.resolve([None, b'"a"', b'"b"', b"{bad", b"[1]"])
    assert group.done()
    assert fs[0].result(timeout=0) is None
    assert fs[1].result(timeout=0) == "a" and called == ["a"]
    assert fs[2].cancelled()
    error = fs[3].exception(timeout=0)
    assert isinstance(error, ResultDecodeError) and error.raw == b"{bad"
    assert fs[4].result(timeout=0) == [1]
    group.resolve([b'"again"'] * 5)  # told once
    assert fs[1].result(timeout=0) == "a"


@pytest.mark.parametrize("lazy", [True, False])
def test_a_put_group_of_a_map_of_bytes_gives_each_future_the_bytes_its_pair_found(
    lazy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values that decode as they are (the bytes codec) take the group's short path: each
    future gets its pair's bytes as they were found, with no exception, and a cancelled or
    awaited future is treated as in the decoding path."""
    fs, called = _gathered(lazy, "bytes", 4, monkeypatch)
    futures.PutGroup(fs, 0).resolve([None, b"a", b"b", b""])
    assert fs[0].result(timeout=0) is None and fs[0].exception(timeout=0) is None
    assert fs[1].result(timeout=0) == b"a" and called == [b"a"]
    assert fs[2].cancelled()
    assert fs[3].result(timeout=0) == b"" and fs[3].done()


@pytest.mark.parametrize("outcome", ["exception", "wrong length"])
def test_a_put_group_that_fails_fails_every_future(outcome: str) -> None:
    fs = [OpFuture(None, 1, 0) for _ in range(3)]
    group = futures.PutGroup(fs, 0)
    if outcome == "exception":
        group.resolve(exception=ValueError("no"))
        assert all(isinstance(f.exception(timeout=0), ValueError) for f in fs)
    else:
        group.resolve([None, None])  # a result that is not one per future
        assert all(isinstance(f.exception(timeout=0), KafkaKVError) for f in fs)
