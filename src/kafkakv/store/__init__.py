"""Where a replica keeps its state: :class:`Store` and its backends.

========================  =========  =======  ==========================================
store                     ordered    on disk  for
========================  =========  =======  ==========================================
:class:`DictStore`        no         no       the fastest reads; the default
:class:`SortedStore`      yes        no       range queries in memory
:class:`LmdbStore`        yes        yes      state larger than memory, fast restarts
========================  =========  =======  ==========================================
"""

from __future__ import annotations

import os

from kafkakv.errors import ConfigError
from kafkakv.store.base import OrderedStore, Positions, Store
from kafkakv.store.lmdb import LmdbStore
from kafkakv.store.memory import DictStore, SortedStore

__all__ = [
    "DictStore",
    "LmdbStore",
    "OrderedStore",
    "Positions",
    "SortedStore",
    "Store",
    "open_store",
]


def open_store(
    kind: str, *, path: str | os.PathLike[str] | None = None, **options: object
) -> Store:
    """Open a store by name: ``"dict"``, ``"sorted"`` or ``"lmdb"`` (needs ``path``; takes
    ``map_size``, ``sync`` and ``private``, see :class:`LmdbStore`).

    Raises ConfigError for an unknown kind or option, a path given to a memory store or an
    lmdb store without one; StoreError when the lmdb store cannot be opened.

    >>> open_store("sorted")  # doctest: +ELLIPSIS
    <kafkakv.store.memory.SortedStore object at ...>
    """
    if kind in ("dict", "sorted"):
        if path is not None or options:
            raise ConfigError(f"the {kind!r} store is in memory: it takes no path or options")
        return DictStore() if kind == "dict" else SortedStore()
    if kind != "lmdb":
        raise ConfigError(f"unknown store {kind!r}: use 'dict', 'sorted' or 'lmdb'")
    if path is None:
        raise ConfigError("the 'lmdb' store needs a path (a directory)")
    map_size = options.pop("map_size", 1 << 40)
    sync = options.pop("sync", True)
    private = options.pop("private", False)
    if options:
        raise ConfigError(f"unknown lmdb store options: {', '.join(sorted(options))}")
    if not isinstance(map_size, int) or isinstance(map_size, bool) or map_size <= 0:
        raise ConfigError(f"map_size is a positive int of bytes, not {map_size!r}")
    if not isinstance(sync, bool):
        raise ConfigError(f"sync is a bool, not {sync!r}")
    if not isinstance(private, bool):
        raise ConfigError(f"private is a bool, not {private!r}")
    return LmdbStore(path, map_size=map_size, sync=sync, private=private)
