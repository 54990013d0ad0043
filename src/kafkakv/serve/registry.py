"""The maps and directories a server holds: opened on the first request that names them, kept
open until the server stops, one replica each.

Opening reads a map's data topic or a directory's topic, which takes as long as the topic is
large, so it runs in a worker thread; requests that arrive meanwhile wait for the same opening
(within their timeout), and one that gives up does not cancel it: the next request finds the
map open.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kafkakv.db import Database
from kafkakv.directory import Directory
from kafkakv.errors import ConfigError, UnknownMapError, UnknownTopicError
from kafkakv.map import ReplicaMap, SortedReplicaMap
from kafkakv.map.topics import MapTopics, check_map_settings, check_topics
from kafkakv.serve.config import ServeConfig
from kafkakv.serve.convert import KeyForm, ValueForm
from kafkakv.serve.errors import ApiError

__all__ = ["Registry", "ServedDirectory", "ServedMap"]

_ORDERED_KEYS = frozenset({"str", "bytes", "int"})
"""Key codecs whose encoded bytes sort as their keys do: such maps get a sorted store, and a
range scan is a walk of it."""

_T = TypeVar("_T")


@dataclass(eq=False)
class ServedMap:
    """One open map with the JSON forms of its keys and values, and the settings fixed at its
    creation that requests look at (read once here: ``map.creation_options`` builds a dict on
    every call)."""

    name: str
    map: ReplicaMap[Any, Any]
    keys: KeyForm
    values: ValueForm
    versions: bool = field(init=False)
    """Whether the map keeps a version per key (``versions=True`` at its creation)."""
    expiry: bool = field(init=False)
    """Whether the map's keys may expire (``expiry=True`` at its creation)."""

    def __post_init__(self) -> None:
        options = self.map.creation_options
        self.versions = options["versions"]
        self.expiry = options["expiry"]

    @property
    def sorted(self) -> bool:
        return isinstance(self.map, SortedReplicaMap)


@dataclass(eq=False)
class ServedDirectory:
    """One open directory with the JSON forms of its keys and values."""

    name: str
    directory: Directory[Any, Any]
    keys: KeyForm
    values: ValueForm


class Registry:
    """Opens and holds the maps and directories of one server, on one database."""

    def __init__(self, config: ServeConfig, db: Database) -> None:
        self.config = config
        self.db = db
        self.maps: dict[str, ServedMap] = {}
        self.directories: dict[str, ServedDirectory] = {}
        self._opening: dict[tuple[str, str], asyncio.Future[Any]] = {}
        self._lock = threading.Lock()  # the worker threads' side of the two dicts

    # -- what the log holds -----------------------------------------------------------------

    def topic_names(self, topics: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
        """``(maps, other topics)`` among ``topics`` (None: the log's): a map is a topic
        ``NAME`` with ``NAME_ops`` and ``NAME_flush`` beside it; the other topics (not a
        map's, not internal) can be opened as directories. Blocking: one metadata request on
        Kafka."""
        topics = set(self.db.log.topics() if topics is None else topics)
        maps = sorted(t for t in topics if f"{t}_ops" in topics and f"{t}_flush" in topics)
        taken = {name for m in maps for name in MapTopics(m, f"{m}_ops", f"{m}_flush").names}
        others = sorted(t for t in topics - taken if not t.startswith("__"))
        return maps, others

    # -- opening ----------------------------------------------------------------------------

    async def map(self, name: str) -> ServedMap:
        """The map ``name``, opened now if it is not yet; 404 ``map_not_found`` when the log
        has no such map."""
        served = self.maps.get(name)
        if served is not None:
            return served
        return await self._open(("map", name), lambda: self._open_map(name))

    async def directory(self, name: str) -> ServedDirectory:
        """The directory of topic ``name``, opened (and started, not awaited) now if it is
        not yet; 404 ``directory_not_found`` when there is no such topic."""
        served = self.directories.get(name)
        if served is not None:
            return served
        return await self._open(("directory", name), lambda: self._open_directory(name))

    async def _open(self, what: tuple[str, str], open_it: Callable[[], _T]) -> _T:
        future = self._opening.get(what)
        if future is None:
            future = asyncio.ensure_future(asyncio.to_thread(open_it))
            self._opening[what] = future
            future.add_done_callback(lambda _: self._opening.pop(what, None))
        async with asyncio.timeout(self.config.request_timeout):
            result: _T = await asyncio.shield(future)
        return result

    def _open_map(self, name: str) -> ServedMap:
        with self._lock:
            if name in self.maps:
                return self.maps[name]
        key_codec, value_codec = self.config.codecs_of(name)
        options: dict[str, Any] = {
            "key_codec": key_codec,
            "value_codec": value_codec,
            "create": False,
            "timeout": self.config.request_timeout,
        }
        try:
            if key_codec in _ORDERED_KEYS:
                opened: ReplicaMap[Any, Any] = self.db.sorted_map(name, store="sorted", **options)
            else:
                opened = self.db.map(name, **options)
        except (UnknownMapError, UnknownTopicError):
            raise ApiError(404, "map_not_found", f"there is no map {name!r}") from None
        except ConfigError as exc:
            if _bad_name(name):
                raise ApiError(404, "map_not_found", f"there is no map {name!r}") from None
            raise ApiError(409, "settings_mismatch", str(exc)) from exc
        served = ServedMap(name, opened, KeyForm(key_codec), ValueForm(value_codec))
        with self._lock:
            self.maps[name] = served
        return served

    def _open_directory(self, name: str) -> ServedDirectory:
        with self._lock:
            if name in self.directories:
                return self.directories[name]
        key_codec, value_codec = self.config.codecs_of(name)
        if _bad_name(name):
            raise ApiError(404, "directory_not_found", f"there is no topic {name!r}")
        try:
            opened: Directory[Any, Any] = self.db.directory(
                name, key_codec=key_codec, value_codec=value_codec, start=False
            )
        except UnknownTopicError:
            raise ApiError(404, "directory_not_found", f"there is no topic {name!r}") from None
        opened.start()
        served = ServedDirectory(name, opened, KeyForm(key_codec), ValueForm(value_codec))
        with self._lock:
            self.directories[name] = served
        return served

    def create_map(self, name: str, partitions: int | None, settings: dict[str, bool]) -> bool:
        """Create map ``name`` unless it exists; True when this call created it. Blocking.
        An existing map is only checked, not loaded: another partition count or other
        settings raise 409 ``settings_mismatch``."""
        if _bad_name(name):
            raise ApiError(400, "bad_request", f"{name!r} is not a valid map name")
        topics = MapTopics.for_name(name)
        log, timeout = self.db.log, self.config.request_timeout
        try:
            if name in self.topic_names()[0]:
                check_topics(log, topics, partitions, create=False)
                check_map_settings(
                    log,
                    topics,
                    hash_tags=settings.get("hash_tags"),
                    versions=settings.get("versions"),
                    expiry=settings.get("expiry"),
                    timeout=timeout,
                )
                return False
            key_codec, value_codec = self.config.codecs_of(name)
            self.db.map(
                name,
                partitions=partitions,
                key_codec=key_codec,
                value_codec=value_codec,
                timeout=timeout,
                hash_tags=settings.get("hash_tags"),
                versions=settings.get("versions"),
                expiry=settings.get("expiry"),
            ).close()  # new, so empty: opening it costs next to nothing
        except ConfigError as exc:
            raise ApiError(409, "settings_mismatch", str(exc)) from exc
        return True


def _bad_name(name: str) -> bool:
    try:
        MapTopics.for_name(name)
    except ConfigError:
        return True
    return False
