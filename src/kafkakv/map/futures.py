"""The future of one update: :class:`OpFuture`, and how the engine resolves it.

An async put makes one future per update, and most are completed before anyone looks at them.
A :class:`concurrent.futures.Future` builds a condition variable up front, which is most of its
cost; :class:`OpFuture` builds it when something first waits. That relies on how CPython's
``Future`` keeps its state in private attributes (``_condition``, ``_state``, ``_result``,
``_exception``, ``_waiters``, ``_done_callbacks``). :data:`LAZY` says whether this Python's
``Future`` looks as expected; when it does not, :class:`OpFuture` is a plain ``Future`` with the
same extra methods: slower, never wrong. ``tests/map/test_futures.py`` checks both.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

from kafkakv.errors import KafkaKVError, ResultDecodeError

if TYPE_CHECKING:
    from collections.abc import Generator

    # A default (PEP 696) lets the engine's bookkeeping say ``OpFuture`` for ``OpFuture[Any]``;
    # the checker knows typing_extensions without it being installed.
    from typing_extensions import TypeVar

    from kafkakv.map.machine import MapState
else:
    from typing import TypeVar

__all__ = ["LAZY", "BatchFuture", "BatchPart", "OpFuture", "PutGroup", "complete", "fail"]

if TYPE_CHECKING:
    T = TypeVar("T", default=Any)
else:
    T = TypeVar("T")

#: The attributes ``Future.__init__`` sets, all of which the lazy future takes over.
_INTERNALS = frozenset(
    {"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"}
)


def _internals_match() -> bool:
    """Whether this Python's ``Future`` keeps exactly the private state OpFuture takes over."""
    probe: Future[Any] = Future()  # not Future[Any](): that adds __orig_class__
    return set(vars(probe)) == _INTERNALS and probe._state == "PENDING"


#: True when :class:`OpFuture` creates its condition lazily (CPython 3.11 to 3.13 do).
LAZY = _internals_match()

_GUARD = threading.Lock()


def _reset_after_fork() -> None:
    """A thread of the parent may have held the guard while forking: a fresh one."""
    global _GUARD
    _GUARD = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


class OpFuture(Future[T]):
    """A :class:`concurrent.futures.Future` that asyncio code can also ``await``, and whose
    condition variable is created when first needed: a waiter, a callback,
    ``concurrent.futures.wait``. Creating it and completing without it share one lock, so a
    waiter that arrives during completion finds the future finished.

    Besides the result it carries the engine's bookkeeping of its update (fewer objects per
    update is less work for the cyclic garbage collector, which otherwise dominates when
    100,000 futures are alive): ``map_state``, the map whose codec decodes the result (None:
    keep the bytes); ``slot``, how many of the ``max_in_flight`` slots it holds (1 or 0; a
    :class:`PutGroup` one per update); ``partition``, where the update goes.

    It is generic in what it resolves to: ``OpFuture[int | None]`` from ``put_async`` on a
    map of ints, ``OpFuture[bool]`` from ``compare_and_set_async``. Typing costs nothing at
    run time: the parameter exists only for the type checker.
    """

    def __init__(self, state: MapState | None = None, slot: int = 0, partition: int = -1) -> None:
        # No Future.__init__: that would build the Condition now.
        self._cond: threading.Condition | None = None
        self._state = "PENDING"
        self._result = None
        self._exception = None
        # _waiters and _done_callbacks, the lists Future keeps, are made with the condition:
        # every use of them holds it.
        self.map_state = state
        self.slot = slot
        self.partition = partition

    @property
    def _condition(self) -> threading.Condition:
        cond = self._cond
        if cond is None:
            with _GUARD:
                cond = self._cond
                if cond is None:
                    self._waiters: list[Any] = []
                    self._done_callbacks: list[Callable[[Future[Any]], object]] = []
                    cond = self._cond = threading.Condition()
        return cond

    @_condition.setter
    def _condition(self, cond: threading.Condition) -> None:
        self._cond = cond

    def _complete_unobserved(self, result: Any, exception: BaseException | None) -> bool:
        """Finish without a Condition when nothing could be waiting; False otherwise."""
        with _GUARD:
            if self._cond is not None:
                return False
            if self._state != "PENDING":
                raise InvalidStateError(f"this future is {self._state.lower()} already")
            self._result, self._exception, self._state = result, exception, "FINISHED"
            return True

    def set_result(self, result: T) -> None:
        if not self._complete_unobserved(result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._complete_unobserved(None, exception):
            super().set_exception(exception)

    def resolve(self, result: Any = None, exception: BaseException | None = None) -> None:
        """Complete with ``result`` or ``exception`` unless the owner cancelled it already.
        (The applier's path: the unobserved case inline, one lock, no nested calls.)"""
        with _GUARD:
            if self._cond is None:
                if self._state == "PENDING":
                    self._result, self._exception, self._state = result, exception, "FINISHED"
                return
        try:
            if exception is None:
                super().set_result(result)
            else:
                super().set_exception(exception)
        except InvalidStateError:
            pass  # cancelled: the owner stopped caring

    # Once FINISHED a future never changes: answer without building the condition.
    def done(self) -> bool:
        return self._state == "FINISHED" or super().done()

    def result(self, timeout: float | None = None) -> T:
        if self._state == "FINISHED":
            if self._exception is not None:
                raise self._exception
            return self._result  # type: ignore[return-value]  # finished, no exception: a T
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == "FINISHED":
            return self._exception
        return super().exception(timeout)

    def __await__(self) -> Generator[Any, None, T]:
        import asyncio

        return asyncio.wrap_future(self).__await__()


class _EagerOpFuture(OpFuture[T]):
    """:class:`OpFuture` on a Python whose ``Future`` internals differ: every method is the
    plain ``Future``'s, the condition variable made up front."""

    def __init__(self, state: MapState | None = None, slot: int = 0, partition: int = -1) -> None:
        self._cond = None
        Future.__init__(self)
        self.map_state = state
        self.slot = slot
        self.partition = partition

    set_result = Future.set_result
    set_exception = Future.set_exception
    done = Future.done
    result = Future.result
    exception = Future.exception

    def resolve(self, result: Any = None, exception: BaseException | None = None) -> None:
        try:
            if exception is None:
                Future.set_result(self, result)
            else:
                Future.set_exception(self, exception)
        except InvalidStateError:
            pass  # cancelled: the owner stopped caring


if not LAZY:
    OpFuture = _EagerOpFuture  # type: ignore[misc]


def complete(future: OpFuture, result: Any) -> None:
    """Resolve ``future`` with the result its update was decided with: bytes are decoded
    with the map's value codec (a value that does not decode fails the future with
    :class:`~kafkakv.errors.ResultDecodeError`, which keeps the bytes)."""
    state = future.map_state
    if type(result) is bytes and state is not None:  # as _outcome, inline: every update
        try:
            result = state.values.decode(result)
        except KafkaKVError as exc:
            future.resolve(exception=_undecodable(exc, result))
            return
    future.resolve(result)


def _outcome(state: MapState | None, result: Any) -> tuple[Any, BaseException | None]:
    """What a future of map ``state`` resolves to for ``result``: see :func:`complete`."""
    if type(result) is not bytes or state is None:
        return result, None
    try:
        return state.values.decode(result), None
    except KafkaKVError as exc:
        return None, _undecodable(exc, result)


def _undecodable(exc: KafkaKVError, result: bytes) -> ResultDecodeError:
    message = f"the update was applied, but the value it returns does not decode: {exc}"
    return ResultDecodeError(message, result)


def fail(future: OpFuture, exc: BaseException) -> None:
    """Resolve ``future`` with ``exc``."""
    future.resolve(exception=exc)


class BatchFuture(OpFuture[int]):
    """The one future of a batch update (``put_all``, ``remove_all``), sent as several ops
    records (one per partition and size limit), each with a :class:`BatchPart` future of its
    own. Its result is the sum of theirs once all succeed; the first part to fail fails it (the
    parts before it may have been applied). Parts resolve under the engine's lock, one at a
    time, so the count needs no lock of its own."""

    def __init__(self, parts: int) -> None:
        super().__init__()
        self._left = parts
        self._total = 0

    def part_done(self, result: Any, exception: BaseException | None) -> None:
        if exception is not None:
            self.resolve(exception=exception)  # a no-op when a part failed it already
            return
        self._total += result
        self._left -= 1
        if self._left == 0:
            self.resolve(self._total)


class BatchPart(OpFuture[Any]):
    """The future of one ops record of a batch: resolving it tells its :class:`BatchFuture`
    how many of the record's keys had a value (its result is the value each pair found)."""

    def __init__(self, batch: BatchFuture, slot: bool, partition: int) -> None:
        super().__init__(None, slot, partition)
        self.batch = batch

    def resolve(self, result: Any = None, exception: BaseException | None = None) -> None:
        if self._state != "PENDING":  # told once
            return
        if exception is None:
            result = len(result) - result.count(None)
        super().resolve(result, exception)
        self.batch.part_done(result, exception)


class PutGroup(OpFuture[Any]):
    """The pending entry of one ``WRITE_MANY`` record into which the sender gathered
    consecutive ``put_async`` calls of one map: their futures, in the record's order, each
    holding a slot. Resolving it resolves each future with the value its pair found (decoded
    as :func:`complete` does), or all of them with the exception."""

    def __init__(self, futures: list[OpFuture], partition: int) -> None:
        super().__init__(None, 0, partition)
        self.futures = futures
        self.slot = len(futures)

    def resolve(self, result: Any = None, exception: BaseException | None = None) -> None:
        if self._state != "PENDING":  # told once
            return
        futures = self.futures
        if exception is None and (type(result) is not list or len(result) != len(futures)):
            exception = KafkaKVError(f"a batch of {len(futures)} puts was decided as {result!r}")
        super().resolve(None, exception)
        if exception is not None:
            for future in futures:
                future.resolve(exception=exception)
            return
        state = futures[0].map_state  # one map
        as_is = state is not None and state.values.decodes_as_is
        # As is: each value as found, with no exception (no (value, None) pair per future).
        outcomes = result if as_is else [_outcome(state, found) for found in result]
        if not LAZY:
            for future, outcome in zip(futures, outcomes, strict=True):
                future.resolve(outcome) if as_is else future.resolve(*outcome)
            return
        observed = []
        with _GUARD:  # once for the lot: as resolve() does for each future nobody waits for
            for future, outcome in zip(futures, outcomes, strict=True):
                if future._cond is not None:
                    observed.append((future, outcome))
                elif future._state == "PENDING":
                    if as_is:
                        future._result = outcome  # _exception stays None
                    else:
                        future._result, future._exception = outcome
                    future._state = "FINISHED"
        for future, outcome in observed:
            future.resolve(outcome) if as_is else future.resolve(*outcome)
