"""``kafkakv.connect``: open a log and the maps on it.

>>> import tempfile, kafkakv
>>> with kafkakv.connect(tempfile.mkdtemp()) as db:
...     prices = db.map("prices")
...     prices["tea"] = 3
...     prices.compare_and_set("tea", 3, 4), prices["tea"]
(True, 4)
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, Literal, TypedDict, TypeVar, Unpack, overload

from prometheus_client import CollectorRegistry

from kafkakv.codecs import Codec, codec_for
from kafkakv.directory import Directory, Transform
from kafkakv.errors import ClosedError, ConfigError
from kafkakv.lifecycle import Closeable, ExitStage, at_exit
from kafkakv.log.base import Log
from kafkakv.log.embedded import EmbeddedLog
from kafkakv.log.memory import MemoryLog
from kafkakv.map.engine import ReplicaEngine
from kafkakv.map.keyspace import map_prefix
from kafkakv.map.machine import FLUSH_HEADERS_MAX, MapState
from kafkakv.map.replica import ReplicaMap, SortedReplicaMap
from kafkakv.map.settings import MapSettings
from kafkakv.map.topics import (
    MapTopics,
    check_ops_clock,
    check_topics,
    create_topics,
    settings_as_created,
)
from kafkakv.store import OrderedStore, Store, open_store

__all__ = ["Database", "check_target", "connect"]

K = TypeVar("K")
V = TypeVar("V")


def connect(target: str | os.PathLike[str] | Log, **log_options: Any) -> Database:
    """Open a database on ``target``:

    - a directory: the embedded log (created if missing); ``log_options`` go to
      :class:`~kafkakv.log.EmbeddedLog` (``fsync``, ``private``...; a map's LMDB store on a
      ``private=True`` log is created private too);
    - ``kafka://host:port[,host:port...][?setting=value&...]``: a Kafka cluster; the query
      holds librdkafka settings (``security.protocol``, ``sasl.mechanism``...), and
      ``log_options`` go to :class:`~kafkakv.log.kafka.KafkaLog` (``config`` for more
      settings, ``timeout``, ``replication_factor``...);
    - ``memory://name``: a :class:`~kafkakv.log.MemoryLog` handle on the log ``name`` of this
      process (kept after close, until ``MemoryLog.drop(name)``; every database opened on the
      same name shares it); ``memory://`` alone: a new log of this database's own;
    - a :class:`~kafkakv.log.Log` you opened yourself (not closed by :meth:`Database.close`).

    Raises :class:`~kafkakv.errors.ConfigError` for any other target :func:`check_target`
    refuses.
    """
    if isinstance(target, Log):
        if log_options:
            raise ConfigError("log options apply only when kafkakv opens the log itself")
        return Database(target, owns_log=False)
    text = os.fspath(target)
    if text.startswith(_MEMORY):
        name = text[len(_MEMORY) :] or None
        return Database(_construct(MemoryLog, name, **log_options), owns_log=True)
    check_target(text)
    if text.startswith("kafka://"):
        return Database(_kafka_log(text, log_options), owns_log=True)
    return Database(_construct(EmbeddedLog, text, **log_options), owns_log=True)


async def connect_async(target: str | os.PathLike[str] | Log, **log_options: Any) -> Database:
    """:func:`connect` without blocking the event loop (reaching Kafka takes round trips):
    it runs in a worker thread. ``async with await kafkakv.connect_async(...) as db`` is
    not needed: the database is an ordinary context manager, and
    :meth:`Database.close_async` closes it from a coroutine."""
    return await asyncio.to_thread(connect, target, **log_options)


_MEMORY = "memory://"

_BROKER = re.compile(r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}")
"""``host:port``, ``1.2.3.4:port`` or ``[::1]:port``: how a Kafka broker address looks."""


def check_target(text: str) -> None:
    """Refuse a target :func:`connect` would misread, before anything is opened or created.

    A URL other than ``kafka://...``; ``memory://...`` too, which :func:`connect` takes but
    which only the process holding it can reach (a command or a Spark job would get a log of
    its own, empty). And a bare broker list (``host:port[,host:port...]``) that is not an
    existing path: it would silently become a new log directory of that name, so the message
    suggests ``kafka://`` (``./host:9092`` still names a directory).

    >>> check_target("127.0.0.1:9092")
    Traceback (most recent call last):
    kafkakv.errors.ConfigError: '127.0.0.1:9092' looks like a Kafka broker address, not a log directory: did you mean kafka://127.0.0.1:9092? (For a directory of that name, write ./127.0.0.1:9092)
    >>> check_target("kafka://127.0.0.1:9092"), check_target("/var/lib/log")
    (None, None)
    """
    if text.startswith("kafka://"):
        return
    if text.startswith(_MEMORY):
        raise ConfigError(
            f"{text!r}: a memory log lives inside one Python process; open it there with "
            "kafkakv.connect (commands and Spark jobs need a directory or kafka://host:port)"
        )
    if "://" in text:
        raise ConfigError(
            f"unsupported target {text!r}: give a directory (embedded log) or kafka://host:port"
        )
    brokers = text.split(",")
    if all(_BROKER.fullmatch(b) for b in brokers) and not os.path.exists(text):
        raise ConfigError(
            f"{text!r} looks like a Kafka broker address, not a log directory: did you mean "
            f"kafka://{text}? (For a directory of that name, write ./{text})"
        )


def _kafka_log(url: str, options: dict[str, Any]) -> Log:
    try:
        from kafkakv.log.kafka import KafkaLog, parse_kafka_url
    except ImportError as exc:  # confluent-kafka is an optional dependency
        raise ConfigError(
            f"{url}: the Kafka backend needs confluent-kafka (pip install 'kafkakv[kafka]')"
        ) from exc
    bootstrap, settings = parse_kafka_url(url)
    config = {**settings, **options.pop("config", {})}
    return _construct(KafkaLog, bootstrap, config=config, **options)


def _construct(cls: type[Log], *args: Any, **options: Any) -> Log:
    """``cls(*args, **options)``, an option it does not take a ConfigError (not TypeError)."""
    try:
        inspect.signature(cls).bind(*args, **options)
    except TypeError as exc:
        known = [
            n for n, p in inspect.signature(cls).parameters.items() if p.kind == p.KEYWORD_ONLY
        ]
        raise ConfigError(
            f"{cls.__name__}: {exc}; its options are {', '.join(known) or 'none'}"
        ) from None
    return cls(*args, **options)


log = logging.getLogger("kafkakv")

#: Every database not closed yet, drained at interpreter exit and disowned by forked children.
_open_databases: weakref.WeakSet[Database] = weakref.WeakSet()


class Database(Closeable):
    """A log plus the map replicas opened on it. Context manager; :meth:`close` closes every
    map (draining their updates in flight) and, when it opened it, the log.

    A database belongs to the process that opened it. Still open at interpreter exit, it is
    closed then, which drains its maps' updates (a warning counts those that could not be
    delivered). In a child made by ``fork`` it and its maps raise
    :class:`~kafkakv.errors.ClosedError` on every use and never wait for a lock the parent's
    threads may have held: call :func:`connect` again in the child. Neither it nor its maps
    can be pickled or copied (``m.copy()`` is a dict snapshot of a map): each process opens
    its own.
    """

    def __init__(self, log: Log, *, owns_log: bool) -> None:
        self.log = log
        self._owns_log = owns_log
        self._engines: list[ReplicaEngine] = []
        self._directories: list[Directory[Any, Any]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        _open_databases.add(self)

    def _check_open(self) -> None:
        if self._pid != os.getpid():
            raise ClosedError(_inherited_message(self._pid))
        if self._closed:
            raise ClosedError("database is closed")

    # Typed by the codecs: a name that says the type (str, bytes, int) or a Codec[T] gives it;
    # any other name (json, msgpack...) gives Any. Every overload below is the same call.
    @overload
    def map(
        self, name: str, *, key_codec: _Str = ..., value_codec: _Str, **options: Unpack[_Options]
    ) -> ReplicaMap[str, str]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Str = ..., value_codec: _Bytes, **options: Unpack[_Options]
    ) -> ReplicaMap[str, bytes]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Str = ..., value_codec: _Int, **options: Unpack[_Options]
    ) -> ReplicaMap[str, int]: ...
    @overload
    def map(
        self,
        name: str,
        *,
        key_codec: _Str = ...,
        value_codec: Codec[V],
        **options: Unpack[_Options],
    ) -> ReplicaMap[str, V]: ...
    @overload
    def map(
        self,
        name: str,
        *,
        key_codec: _Str = ...,
        value_codec: str = ...,
        **options: Unpack[_Options],
    ) -> ReplicaMap[str, Any]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Bytes, value_codec: _Str, **options: Unpack[_Options]
    ) -> ReplicaMap[bytes, str]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Bytes, value_codec: _Bytes, **options: Unpack[_Options]
    ) -> ReplicaMap[bytes, bytes]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Bytes, value_codec: _Int, **options: Unpack[_Options]
    ) -> ReplicaMap[bytes, int]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Bytes, value_codec: Codec[V], **options: Unpack[_Options]
    ) -> ReplicaMap[bytes, V]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Bytes, value_codec: str = ..., **options: Unpack[_Options]
    ) -> ReplicaMap[bytes, Any]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Int, value_codec: _Str, **options: Unpack[_Options]
    ) -> ReplicaMap[int, str]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Int, value_codec: _Bytes, **options: Unpack[_Options]
    ) -> ReplicaMap[int, bytes]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Int, value_codec: _Int, **options: Unpack[_Options]
    ) -> ReplicaMap[int, int]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Int, value_codec: Codec[V], **options: Unpack[_Options]
    ) -> ReplicaMap[int, V]: ...
    @overload
    def map(
        self, name: str, *, key_codec: _Int, value_codec: str = ..., **options: Unpack[_Options]
    ) -> ReplicaMap[int, Any]: ...
    @overload
    def map(
        self, name: str, *, key_codec: Codec[K], value_codec: _Str, **options: Unpack[_Options]
    ) -> ReplicaMap[K, str]: ...
    @overload
    def map(
        self, name: str, *, key_codec: Codec[K], value_codec: _Bytes, **options: Unpack[_Options]
    ) -> ReplicaMap[K, bytes]: ...
    @overload
    def map(
        self, name: str, *, key_codec: Codec[K], value_codec: _Int, **options: Unpack[_Options]
    ) -> ReplicaMap[K, int]: ...
    @overload
    def map(
        self, name: str, *, key_codec: Codec[K], value_codec: Codec[V], **options: Unpack[_Options]
    ) -> ReplicaMap[K, V]: ...
    @overload
    def map(
        self, name: str, *, key_codec: Codec[K], value_codec: str = ..., **options: Unpack[_Options]
    ) -> ReplicaMap[K, Any]: ...
    @overload
    def map(
        self, name: str, *, key_codec: str, value_codec: _Str, **options: Unpack[_Options]
    ) -> ReplicaMap[Any, str]: ...
    @overload
    def map(
        self, name: str, *, key_codec: str, value_codec: _Bytes, **options: Unpack[_Options]
    ) -> ReplicaMap[Any, bytes]: ...
    @overload
    def map(
        self, name: str, *, key_codec: str, value_codec: _Int, **options: Unpack[_Options]
    ) -> ReplicaMap[Any, int]: ...
    @overload
    def map(
        self, name: str, *, key_codec: str, value_codec: Codec[V], **options: Unpack[_Options]
    ) -> ReplicaMap[Any, V]: ...
    @overload
    def map(
        self,
        name: str,
        *,
        key_codec: str | Codec[Any] = ...,
        value_codec: str | Codec[Any] = ...,
        **options: Unpack[_Options],
    ) -> ReplicaMap[Any, Any]: ...
    def map(
        self,
        name: str,
        *,
        partitions: int | None = None,
        key_codec: str | Codec[Any] = "str",
        value_codec: str | Codec[Any] = "json",
        store: str | Store = "dict",
        store_path: str | os.PathLike[str] | None = None,
        shard: Iterable[int] | None = None,
        consistency: str = "local",
        barriers: str = "auto",
        flush_period: int = 1000,
        timeout: float = 30.0,
        max_in_flight: int = 10_000,
        topics: str | None = None,
        create: bool = True,
        hash_tags: bool | None = None,
        versions: bool | None = None,
        expiry: bool | None = None,
    ) -> ReplicaMap[Any, Any]:
        """Open a replica of map ``name``, creating its topics if needed, and load it.

        Every option and every existing topic is checked before any topic is created, so a
        refusal leaves nothing behind. ``create=False`` opens only a map whose topics exist.
        An existing data topic that holds records is opened only with its ops topic: one that
        another program wrote is adopted with ``kafkakv init-existing`` (which checks where its
        records sit), never by opening it.

        ``partitions``: for new topics (default 1); checked against existing ones.
        ``store``: ``"dict"``, ``"sorted"``, ``"lmdb"`` (with ``store_path``, survives
        restarts) or a :class:`~kafkakv.store.Store`. ``shard``: the partitions this replica
        holds (default all). ``topics``: share the topics of that base name with other maps
        (the map's name then prefixes its record keys). ``hash_tags``: place keys by the
        part between ``{`` and ``}`` when they have one, so that keys sharing it share a
        partition (for :meth:`~kafkakv.map.ReplicaMap.transaction`); chosen when the map is
        created (None, the default: as created; False for a new map). ``versions``: every
        key carries the ops offset of its last change
        (:meth:`~kafkakv.map.ReplicaMap.get_versioned`), chosen when the map is created
        likewise. ``expiry``: keys may be put with a time to live (``put(k, v, ttl=s)``),
        likewise. A replica of a map with versions or expiry keeps them in memory: with a
        store on disk it reloads the data topic when it opens. Other options: see
        :class:`~kafkakv.map.MapSettings`.

        Returns a :class:`SortedReplicaMap` when the store is ordered. For type checkers the
        codecs give its type: ``value_codec="int"`` opens a ``ReplicaMap[str, int]``, a
        ``Codec[T]`` object gives ``T``, and ``json``, ``msgpack`` or a name known only at run
        time give ``Any``. Costs the bootstrap:
        reading the data topic and the ops after the last flush (or, for a persistent store,
        only the ops it has not applied). Raises
        :class:`~kafkakv.errors.TopicMismatchError` for existing topics with wrong settings or
        partition counts, topics of another map, or a data topic with records and no ops topic;
        :class:`~kafkakv.errors.UnknownMapError` with ``create=False`` when a topic is missing;
        :class:`~kafkakv.errors.ConfigError` for bad options.
        """
        settings = MapSettings(
            flush_period=flush_period,
            timeout=timeout,
            max_in_flight=max_in_flight,
            consistency=consistency,
            barriers=barriers,
            hash_tags=hash_tags,
            versions=versions,
            expiry=expiry,
        )
        spec = _MapSpec(name, key_codec, value_codec, store, store_path)
        maps = self._open(
            topics or name, [spec], partitions, shard, settings, shared=bool(topics), create=create
        )
        return maps[0]

    async def map_async(self, name: str, **options: Any) -> ReplicaMap[Any, Any]:
        """:meth:`map` without blocking the event loop: creating topics and loading the
        replica run in a worker thread. Takes the same options."""
        return await asyncio.to_thread(lambda: self.map(name, **options))

    async def sorted_map_async(self, name: str, **options: Any) -> SortedReplicaMap[Any, Any]:
        """:meth:`sorted_map` without blocking the event loop (see :meth:`map_async`)."""
        return await asyncio.to_thread(lambda: self.sorted_map(name, **options))

    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Str = ..., value_codec: _Str, **options: Unpack[_Options]
    ) -> SortedReplicaMap[str, str]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Str = ..., value_codec: _Bytes, **options: Unpack[_Options]
    ) -> SortedReplicaMap[str, bytes]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Str = ..., value_codec: _Int, **options: Unpack[_Options]
    ) -> SortedReplicaMap[str, int]: ...
    @overload
    def sorted_map(
        self,
        name: str,
        *,
        key_codec: _Str = ...,
        value_codec: Codec[V],
        **options: Unpack[_Options],
    ) -> SortedReplicaMap[str, V]: ...
    @overload
    def sorted_map(
        self,
        name: str,
        *,
        key_codec: _Str = ...,
        value_codec: str = ...,
        **options: Unpack[_Options],
    ) -> SortedReplicaMap[str, Any]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Bytes, value_codec: _Str, **options: Unpack[_Options]
    ) -> SortedReplicaMap[bytes, str]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Bytes, value_codec: _Bytes, **options: Unpack[_Options]
    ) -> SortedReplicaMap[bytes, bytes]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Bytes, value_codec: _Int, **options: Unpack[_Options]
    ) -> SortedReplicaMap[bytes, int]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Bytes, value_codec: Codec[V], **options: Unpack[_Options]
    ) -> SortedReplicaMap[bytes, V]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Bytes, value_codec: str = ..., **options: Unpack[_Options]
    ) -> SortedReplicaMap[bytes, Any]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Int, value_codec: _Str, **options: Unpack[_Options]
    ) -> SortedReplicaMap[int, str]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Int, value_codec: _Bytes, **options: Unpack[_Options]
    ) -> SortedReplicaMap[int, bytes]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Int, value_codec: _Int, **options: Unpack[_Options]
    ) -> SortedReplicaMap[int, int]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Int, value_codec: Codec[V], **options: Unpack[_Options]
    ) -> SortedReplicaMap[int, V]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: _Int, value_codec: str = ..., **options: Unpack[_Options]
    ) -> SortedReplicaMap[int, Any]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: Codec[K], value_codec: _Str, **options: Unpack[_Options]
    ) -> SortedReplicaMap[K, str]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: Codec[K], value_codec: _Bytes, **options: Unpack[_Options]
    ) -> SortedReplicaMap[K, bytes]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: Codec[K], value_codec: _Int, **options: Unpack[_Options]
    ) -> SortedReplicaMap[K, int]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: Codec[K], value_codec: Codec[V], **options: Unpack[_Options]
    ) -> SortedReplicaMap[K, V]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: Codec[K], value_codec: str = ..., **options: Unpack[_Options]
    ) -> SortedReplicaMap[K, Any]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: str, value_codec: _Str, **options: Unpack[_Options]
    ) -> SortedReplicaMap[Any, str]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: str, value_codec: _Bytes, **options: Unpack[_Options]
    ) -> SortedReplicaMap[Any, bytes]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: str, value_codec: _Int, **options: Unpack[_Options]
    ) -> SortedReplicaMap[Any, int]: ...
    @overload
    def sorted_map(
        self, name: str, *, key_codec: str, value_codec: Codec[V], **options: Unpack[_Options]
    ) -> SortedReplicaMap[Any, V]: ...
    @overload
    def sorted_map(
        self,
        name: str,
        *,
        key_codec: str | Codec[Any] = ...,
        value_codec: str | Codec[Any] = ...,
        **options: Unpack[_Options],
    ) -> SortedReplicaMap[Any, Any]: ...
    def sorted_map(self, name: str, **options: Any) -> SortedReplicaMap[Any, Any]:
        """:meth:`map` with a sorted store by default; needs an ordered key codec."""
        store = options.setdefault("store", "sorted")
        if not (store in ("sorted", "lmdb") or isinstance(store, OrderedStore)):
            raise ConfigError(
                f"a sorted map needs an ordered store ('sorted' or 'lmdb'), not {store!r}"
            )
        _require_ordered_keys(codec_for(options.get("key_codec", "str")))
        opened = self.map(name, **options)
        assert isinstance(opened, SortedReplicaMap)
        return opened

    def maps(
        self,
        topics: str,
        names: Sequence[str],
        *,
        partitions: int | None = None,
        shard: Iterable[int] | None = None,
        create: bool = True,
        **options: Any,
    ) -> dict[str, ReplicaMap[Any, Any]]:
        """Open several maps that share the topics ``topics`` in one replica (one follower,
        one flusher). Key/value codec and store options apply to each map; ``store_path`` is
        a directory holding one store per map. ``create`` and what is checked: see
        :meth:`map`."""
        settings = MapSettings(**{k: options.pop(k) for k in list(options) if k in _SETTING_NAMES})
        path = options.pop("store_path", None)
        specs = [
            _MapSpec(
                n,
                options.get("key_codec", "str"),
                options.get("value_codec", "json"),
                options.get("store", "dict"),
                None if path is None else os.path.join(os.fspath(path), n),
            )
            for n in names
        ]
        unknown = set(options) - {"key_codec", "value_codec", "store"}
        if unknown:
            raise ConfigError(f"unknown map options: {', '.join(sorted(unknown))}")
        opened = self._open(topics, specs, partitions, shard, settings, shared=True, create=create)
        return {m.name: m for m in opened}

    def _open(
        self,
        base: str,
        specs: Sequence[_MapSpec],
        partitions: int | None,
        shard: Iterable[int] | None,
        settings: MapSettings,
        *,
        shared: bool,
        create: bool,
    ) -> list[ReplicaMap[Any, Any]]:
        self._check_open()
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ConfigError(f"map names repeat: {names}")
        topics = MapTopics.for_name(base)
        plan = check_topics(self.log, topics, partitions, create=create)
        held = _held_partitions(shard, plan.partitions)
        count = create_topics(self.log, plan)  # only now: a refusal above leaves nothing behind
        if count != plan.partitions:  # another process created a topic meanwhile
            held = _held_partitions(shard, count)
        settings = settings_as_created(self.log, topics, settings)
        if settings.expiry:
            check_ops_clock(self.log, topics)
        states = [spec.state(shared, private=self.log.private) for spec in specs]
        # What one ops record may hold, so that the value it carries flushes too.
        max_bytes = min(
            self.log.record_room(topics.ops),
            self.log.record_room(topics.data) - FLUSH_HEADERS_MAX,
        )
        engine = ReplicaEngine(self.log, topics, count, held, states, settings, max_bytes)
        try:
            engine.start()
        except BaseException:
            engine.close()
            raise
        with self._lock:
            self._engines.append(engine)
        return [(SortedReplicaMap if _sorted(s) else ReplicaMap)(engine, s) for s in states]

    def directory(
        self,
        topic: str,
        *,
        key_codec: str | Codec[Any] = "str",
        value_codec: str | Codec[Any] = "json",
        transform: Transform | None = None,
        store: str | Store = "dict",
        store_path: str | os.PathLike[str] | None = None,
        partitions: Iterable[int] | None = None,
        name: str | None = None,
        metrics: CollectorRegistry | None = None,
        max_errors: int = 1000,
        start: bool = True,
        timeout: float = 60.0,
    ) -> Directory[Any, Any]:
        """Open a read-only replica of ``topic`` (written by anyone: a connector, a service,
        a map's flushes) and, unless ``start=False``, wait until it is ready.

        Ready means every record present when it started is loaded; it then follows the
        topic in the background. With ``start=False`` call :meth:`Directory.start` (returns
        at once) and :meth:`Directory.wait_ready` or check :attr:`Directory.ready`. Options:
        see :class:`~kafkakv.directory.Directory`. Closed with the database.

        Costs reading the topic (or, with a persistent store, what was added since it last
        ran). Raises :class:`~kafkakv.errors.UnknownTopicError` for a missing topic,
        :class:`~kafkakv.errors.ConfigError` for bad options, and
        :class:`~kafkakv.errors.OperationTimeoutError` when not ready within ``timeout``
        seconds (the directory is closed then).
        """
        with self._lock:
            self._check_open()
        directory: Directory[Any, Any] = Directory(
            self.log,
            topic,
            key_codec=key_codec,
            value_codec=value_codec,
            transform=transform,
            store=store,
            store_path=store_path,
            partitions=partitions,
            name=name,
            metrics=metrics,
            max_errors=max_errors,
        )
        with self._lock:
            self._directories.append(directory)
        directory._on_close.append(self._forget)
        if start:
            try:
                directory.start()
                directory.wait_ready(timeout)
            except BaseException:
                directory.close()
                raise
        return directory

    def _forget(self, directory: Directory[Any, Any]) -> None:
        # By identity: a directory is a Mapping, and == would compare every entry.
        with self._lock:
            self._directories = [d for d in self._directories if d is not directory]

    async def close_async(self, timeout: float | None = None) -> None:
        """:meth:`close` without blocking the event loop (draining runs in a worker thread)."""
        await asyncio.to_thread(self.close, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Close every map and directory opened here, then the log if this database opened
        it. Idempotent.

        Each map first drains its updates in flight, for at most ``timeout`` seconds (default:
        the map's timeout): async updates still queued are sent, and every update that
        reached the log resolves with its true result. One that could not, fails with
        :class:`~kafkakv.errors.ClosedError` saying whether it reached the log.
        """
        self._close(timeout)

    def __copy__(self) -> Database:
        raise TypeError(_NOT_COPIED.format("copied"))

    def __deepcopy__(self, memo: dict[int, Any]) -> Database:
        raise TypeError(_NOT_COPIED.format("copied"))

    def __getstate__(self) -> object:
        raise TypeError(_NOT_COPIED.format("pickled"))

    def _close(self, timeout: float | None) -> int:
        """close(); returns the number of updates that failed to drain."""
        if self._pid != os.getpid():  # inherited through fork: the parent's to close
            self._closed = True
            _open_databases.discard(self)
            return 0
        with self._lock:
            if self._closed:
                return 0
            self._closed = True
            engines, self._engines = self._engines, []
            directories, self._directories = self._directories, []
        _open_databases.discard(self)
        failed = 0
        for directory in directories:
            directory.close()
        for engine in engines:
            failed += engine.close(timeout)
        if self._owns_log:
            self.log.close()
        return failed

    def _inherited(self) -> None:
        """In a child made by fork: every map of this database refuses all use. Takes no
        lock (another thread of the parent may have held it while forking)."""
        message = _inherited_message(self._pid)
        for engine in list(self._engines):
            engine.disown(message)


_NOT_COPIED = (
    "a Database cannot be {}: it is this process's connection to its log, with the map "
    "replicas opened on it. Share the object within the process; in another process, call "
    "kafkakv.connect() with the same target and open the maps there"
)


def _inherited_message(pid: int) -> str:
    return (
        f"this database was opened in another process (pid {pid}) and inherited through "
        "fork: call kafkakv.connect() in this one"
    )


def _after_fork_in_child() -> None:
    for db in list(_open_databases):
        db._inherited()


def _close_at_exit() -> None:
    """Drain and close what the program left open, as a Kafka producer's close does."""
    for db in list(_open_databases):
        if db._pid != os.getpid() or db._closed:
            continue
        try:
            failed = db._close(None)
        except Exception as exc:
            log.warning("kafkakv: closing a database at exit failed: %s", exc)
            continue
        if failed:
            log.warning(
                "kafkakv: %d updates could not be delivered before exit (the database on %s "
                "was not closed; draining it failed or ran out of time)",
                failed,
                db.log,
            )


os.register_at_fork(after_in_child=_after_fork_in_child)
at_exit(ExitStage.DRAIN, _close_at_exit)


def _held_partitions(shard: Iterable[int] | None, count: int) -> list[int]:
    held = sorted(set(range(count) if shard is None else shard))
    bad = [p for p in held if not isinstance(p, int) or not 0 <= p < count]
    if bad or not held:
        raise ConfigError(f"shard must name partitions of 0..{count - 1}, not {bad or held}")
    return held


_SETTING_NAMES = {
    "flush_period",
    "timeout",
    "max_in_flight",
    "consistency",
    "barriers",
    "hash_tags",
    "versions",
    "expiry",
}


def _sorted(state: MapState) -> bool:
    """A map offers range queries when its store is ordered and its keys sort by their bytes."""
    return isinstance(state.store, OrderedStore) and state.keys.ordered


def _require_ordered_keys(keys: Codec[Any]) -> None:
    """Range queries follow the encoded bytes: with an unordered codec they would surprise."""
    if not keys.ordered:
        raise ConfigError(
            f"a sorted map needs an ordered key codec, whose bytes sort like its keys (str, "
            f"bytes, int), not {keys!r}"
        )


_Str = Literal["str"]
_Bytes = Literal["bytes"]
_Int = Literal["int"]


class _Options(TypedDict, total=False):
    """The options of :meth:`Database.map` besides the codecs, for its typed overloads
    (``tests/map/test_typing.py`` checks that the two agree)."""

    partitions: int | None
    store: str | Store
    store_path: str | os.PathLike[str] | None
    shard: Iterable[int] | None
    consistency: str
    barriers: str
    flush_period: int
    timeout: float
    max_in_flight: int
    topics: str | None
    create: bool
    hash_tags: bool | None
    versions: bool | None
    expiry: bool | None


class _MapSpec:
    def __init__(
        self,
        name: str,
        key_codec: str | Codec[Any],
        value_codec: str | Codec[Any],
        store: str | Store,
        store_path: str | os.PathLike[str] | None,
    ) -> None:
        if not isinstance(name, str) or not name or len(name.encode()) > 255:
            raise ConfigError(f"a map name is a non-empty str of at most 255 bytes: {name!r}")
        self.name = name
        self.keys = codec_for(key_codec)
        self.values = codec_for(value_codec)
        self.store = store
        self.store_path = store_path
        _validate_store(store, store_path)  # before any topic is created
        if store == "sorted":
            _require_ordered_keys(self.keys)  # before anything is opened

    def state(self, shared: bool, *, private: bool = False) -> MapState:
        """The map's state on its store; a store opened here by name on disk is created
        private (directory 0700, files 0600) when ``private`` (the log's setting)."""
        if isinstance(self.store, Store):
            store = self.store
        else:
            path = None if self.store_path is None else os.fspath(self.store_path)
            options = {"private": True} if private and self.store == "lmdb" else {}
            store = open_store(self.store, path=path, **options)
        prefix = map_prefix(self.name) if shared else b""
        return MapState(self.name, prefix, self.keys, self.values, store)


def _validate_store(store: str | Store, path: str | os.PathLike[str] | None) -> None:
    """What :func:`~kafkakv.store.open_store` would refuse, checked without opening it."""
    if isinstance(store, Store):
        if path is not None:
            raise ConfigError("store_path applies to a store opened by name, not a Store object")
    elif store in ("dict", "sorted"):
        if path is not None:
            raise ConfigError(f"the {store!r} store is in memory: it takes no store_path")
    elif store == "lmdb":
        if path is None:
            raise ConfigError("the 'lmdb' store needs store_path (a directory)")
    else:
        raise ConfigError(f"unknown store {store!r}: use 'dict', 'sorted', 'lmdb' or a Store")
