"""Functions for ``compute`` and ``merge``, registered by name on every replica.

Only a function's *name* and its arguments travel through the log; each replica looks the name
up here and runs its own code, once, in log order. Nothing that arrives through the log is ever
executed as code. Register the same functions under the same names in every process that opens
the map, before opening it.

A compute function is called as ``fn(key, old, *args)`` where ``old`` is the current value or
``None`` when the key is absent; it returns the new value, or ``None`` to remove the key.
A merge function is called as ``fn(old, value)`` only when the key is present. Both must be
deterministic (same inputs, same result on every machine) and must not change ``old`` in place.

``register`` returns a :class:`RegisteredFunction`: it calls the function, and ``compute``
and ``merge`` take it in place of the name, typed (a plain callable, a lambda say, is refused
by the type checker, since nothing would run it on the other replicas).

>>> @register("add")
... def add(key, old, n):
...     return (old or 0) + n
>>> add, add.name, add(b"k", 2, 3), lookup("add")(b"k", 2, 3)
(RegisteredFunction('add'), 'add', 5, 5)
>>> unregister("add")
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

from kafkakv.errors import ConfigError, UnknownFunctionError

__all__ = ["RegisteredFunction", "lookup", "register", "registered", "unregister"]

P = ParamSpec("P")
R = TypeVar("R", covariant=True)

_lock = threading.Lock()
_registry: dict[str, Callable[..., Any]] = {}


def _reset_after_fork() -> None:
    """A thread of the parent may have held the lock while forking: a fresh one."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


class RegisteredFunction(Generic[P, R]):
    """A function registered under :attr:`name`, as :func:`register` returns it.

    Calling it calls the function. ``ReplicaMap.compute`` and ``merge`` take it where they
    take a name, and only the name travels: a compute function given as
    ``RegisteredFunction[..., V | None]`` is checked against the map's value type ``V``. It
    pickles as its name and module, and unpickles as the function registered under that name
    in the process that reads it, which imports the module first if the name is not
    registered there yet."""

    def __init__(self, name: str, function: Callable[P, R]) -> None:
        functools.update_wrapper(self, function)  # __name__, __doc__, __wrapped__...
        self.name = name
        self.function = function

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return _registered_as, (self.name, self.__module__)


def _registered_as(name: str, module: str) -> RegisteredFunction[..., Any]:
    """The function registered as ``name``, how a pickled RegisteredFunction comes back.
    When the name is not registered yet, ``module`` (where the function was defined, which
    registers it on import as a rule) is imported first, as unpickling a plain function
    would import it."""
    if name not in _registry:
        importlib.import_module(module)
    return RegisteredFunction(name, lookup(name))


@overload
def register(name: str) -> Callable[[Callable[P, R]], RegisteredFunction[P, R]]: ...
@overload
def register(name: Callable[P, R]) -> RegisteredFunction[P, R]: ...
def register(
    name: str | Callable[P, R],
) -> Callable[[Callable[P, R]], RegisteredFunction[P, R]] | RegisteredFunction[P, R]:
    """Register a function under ``name`` (decorator form ``@register("name")``), or under its
    ``__qualname__`` (``@register``); returns it as a :class:`RegisteredFunction`.
    Registering a RegisteredFunction registers the function it holds. Re-registering a name
    with another function raises :class:`~kafkakv.errors.ConfigError`: replicas running
    different code would diverge."""
    if callable(name):
        return _add(name.__qualname__, name)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a function name must be a non-empty str, not {name!r}")
    label = name

    def decorate(fn: Callable[P, R]) -> RegisteredFunction[P, R]:
        return _add(label, fn)

    return decorate


def _add(name: str, fn: Callable[P, R]) -> RegisteredFunction[P, R]:
    if not callable(fn):
        raise ConfigError(f"{fn!r} is not callable")
    if isinstance(fn, RegisteredFunction):  # the registry holds plain functions
        fn = fn.function
    with _lock:
        known = _registry.get(name)
        if known is not None and known is not fn:
            raise ConfigError(f"another function is already registered as {name!r}")
        _registry[name] = fn
    return RegisteredFunction(name, fn)


def unregister(name: str) -> None:
    """Forget ``name`` (mostly for tests). Unknown names are ignored."""
    with _lock:
        _registry.pop(name, None)


def lookup(name: str) -> Callable[..., Any]:
    """The function registered as ``name``; raises
    :class:`~kafkakv.errors.UnknownFunctionError`."""
    try:
        return _registry[name]
    except KeyError:
        raise UnknownFunctionError(name) from None


def registered() -> list[str]:
    """Every registered name, sorted."""
    with _lock:
        return sorted(_registry)
