"""Functions for ``compute`` and ``merge``, registered by name on every replica.

Only a function's *name* and its arguments travel through the log; each replica looks the name
up here and runs its own code, once, in log order. Nothing that arrives through the log is ever
executed as code. Register the same functions under the same names in every process that opens
the map, before opening it.

A compute function is called as ``fn(key, old, *args)`` where ``old`` is the current value or
``None`` when the key is absent; it returns the new value, or ``None`` to remove the key.
A merge function is called as ``fn(old, value)`` only when the key is present. Both must be
deterministic (same inputs, same result on every machine) and must not change ``old`` in place.

>>> @register("add")
... def add(key, old, n):
...     return (old or 0) + n
>>> lookup("add")(b"k", 2, 3)
5
>>> unregister("add")
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

from kafkakv.errors import ConfigError, UnknownFunctionError

__all__ = ["lookup", "register", "registered", "unregister"]

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_registry: dict[str, Callable[..., Any]] = {}


def _reset_after_fork() -> None:
    """A thread of the parent may have held the lock while forking: a fresh one."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


@overload
def register(name: str) -> Callable[[F], F]: ...
@overload
def register(name: F) -> F: ...
def register(name: str | F) -> Callable[[F], F] | F:
    """Register a function under ``name`` (decorator form ``@register("name")``), or under its
    ``__qualname__`` (``@register``). Re-registering a name with another function raises
    :class:`~kafkakv.errors.ConfigError`: replicas running different code would diverge."""
    if callable(name):
        return _add(name.__qualname__, name)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a function name must be a non-empty str, not {name!r}")
    label = name

    def decorate(fn: F) -> F:
        return _add(label, fn)

    return decorate


def _add(name: str, fn: F) -> F:
    if not callable(fn):
        raise ConfigError(f"{fn!r} is not callable")
    with _lock:
        known = _registry.get(name)
        if known is not None and known is not fn:
            raise ConfigError(f"another function is already registered as {name!r}")
        _registry[name] = fn
    return fn


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
