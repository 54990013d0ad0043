"""The ASGI application of ``kafkakv serve``: :func:`create_app`.

Routes are thin: each parses its input into the map's key and value objects
(:mod:`kafkakv.serve.convert`), makes one call of the :class:`~kafkakv.ReplicaMap` or
:class:`~kafkakv.Directory` API, and writes the answer as JSON. Local reads are dictionary
lookups made on the event loop; writes use the maps' ``*_async`` calls, whose futures the loop
awaits, so many writes of many connections are in flight at once and one slow write holds up
no other request. Anything that may block on the log (opening a map, end offsets, a scrape)
runs in a worker thread. Every wait is bounded by the request timeout.

In front of the routes stand the :class:`~kafkakv.serve.gate.Gate` (bearer token, draining,
requests in flight) and the :class:`~kafkakv.serve.gate.FastPath` of single-key reads and
writes (:mod:`kafkakv.serve.gate`). The API is described in docs/serve.md and in
:mod:`kafkakv.serve.openapi`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from importlib import resources
from typing import Any

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from kafkakv.db import Database, connect
from kafkakv.errors import (
    CrossPartitionError,
    KafkaKVError,
    OperationTimeoutError,
)
from kafkakv.map.feed import Change, ChangeFeed, Cursor
from kafkakv.serve.config import ServeConfig
from kafkakv.serve.convert import dumps
from kafkakv.serve.errors import ApiError, api_error
from kafkakv.serve.gate import MISSING, FastPath, Gate, JSONResponse, error_response, read_json
from kafkakv.serve.openapi import openapi_document
from kafkakv.serve.registry import Registry, ServedDirectory, ServedMap
from kafkakv.serve.waiting import UpdateWaiter

__all__ = ["create_app"]

MAX_BATCH = 1000
"""Keys in one batch get, and items in one page of a range scan."""

MAX_PARTITIONS = 256
"""The most partitions a map created over HTTP may have (create larger ones from Python)."""


def _object(doc: Any, fields: dict[str, bool]) -> dict[str, Any]:
    """``doc`` checked to be a JSON object whose fields are among ``fields`` (name →
    required)."""
    if not isinstance(doc, dict):
        raise ApiError(400, "bad_request", "the body must be a JSON object")
    unknown = set(doc) - set(fields)
    if unknown:
        raise ApiError(400, "bad_request", f"unknown fields: {', '.join(sorted(unknown))}")
    missing = [name for name, required in fields.items() if required and name not in doc]
    if missing:
        raise ApiError(400, "bad_request", f"missing fields: {', '.join(missing)}")
    return doc


def _flag(request: Request, name: str, default: bool = False) -> bool:
    text = request.query_params.get(name)
    if text is None:
        return default
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise ApiError(400, "bad_request", f"?{name}= takes true or false, not {text!r}")


def _linearizable(request: Request) -> bool:
    consistency = request.query_params.get("consistency")
    if consistency is None or consistency == "local":
        return False
    if consistency == "linearizable":
        return True
    raise ApiError(400, "bad_request", f"consistency is local or linearizable, not {consistency!r}")


def _limit(request: Request) -> int:
    text = request.query_params.get("limit", "100")
    if not text.isdigit() or not 1 <= int(text) <= MAX_BATCH:
        raise ApiError(400, "bad_request", f"limit is 1 to {MAX_BATCH}, not {text!r}")
    return int(text)


# -- the application ----------------------------------------------------------------------


def create_app(config: ServeConfig, db: Database | None = None) -> Gate:
    """The ASGI application serving ``config``'s log: the :class:`Gate` in front of the
    routes. With ``db`` it serves that database (and leaves it open on shutdown); without,
    it connects to ``config.target`` at startup and closes the database at shutdown,
    draining its updates."""
    config.check()
    api = _Api(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        owned = db is None
        database = db if db is not None else await asyncio.to_thread(_connect, config)
        api.registry = Registry(config, database)
        api.waiter = UpdateWaiter(asyncio.get_running_loop(), config.request_timeout)
        try:
            for name in config.directories:
                await asyncio.to_thread(api.registry._open_directory, name)
            yield
        finally:
            if owned:
                await asyncio.to_thread(database.close, config.drain_timeout)

    static = resources.files("kafkakv.serve") / "static"
    routes = [
        Route("/", api.console),
        Mount("/static", app=StaticFiles(directory=str(static)), name="static"),
        Route("/v1/health", api.health),
        Route("/v1/openapi.json", api.openapi),
        Route("/metrics", api.metrics),
        Route("/v1/maps", api.list_maps),
        api.route("/v1/maps/{map}", GET=api.map_status, PUT=api.create_map),
        Route("/v1/maps/{map}/keys", api.map_scan),
        Route("/v1/maps/{map}/get", api.map_batch_get, methods=["POST"]),
        Route("/v1/maps/{map}/put", api.map_batch_put, methods=["POST"]),
        Route("/v1/maps/{map}/transaction", api.transaction, methods=["POST"]),
        Route("/v1/maps/{map}/changes", api.changes),
        Route("/v1/maps/{map}/keys/{key:path}/cas", api.cas, methods=["POST"]),
        api.route(
            "/v1/maps/{map}/keys/{key:path}",
            GET=api.get_key,
            PUT=api.put_key,
            DELETE=api.delete_key,
        ),
        Route("/v1/directories", api.list_directories),
        Route("/v1/directories/{name}", api.directory_status),
        Route("/v1/directories/{name}/keys", api.directory_scan),
        Route("/v1/directories/{name}/get", api.directory_batch_get, methods=["POST"]),
        Route("/v1/directories/{name}/keys/{key:path}", api.directory_get),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ApiError: _on_api_error,
            HTTPException: _on_http_error,
            KafkaKVError: _on_kafkakv_error,
            TimeoutError: _on_kafkakv_error,
        },
    )
    gate = Gate(app, config.token)
    gate.fast = FastPath(api)
    api.gate = gate
    return gate


def _connect(config: ServeConfig) -> Database:
    if "://" in config.target:
        return connect(config.target)
    return connect(config.target, background_cleaner=True, fsync=config.fsync)


async def _on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _on_kafkakv_error(request: Request, exc: Exception) -> Response:
    missing = "directory_not_found" if request.url.path.startswith("/v1/dir") else "map_not_found"
    return error_response(api_error(exc, missing=missing))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        error = ApiError(405, "method_not_allowed", f"{request.method} is not allowed here")
        return error_response(error, dict(exc.headers or {}))
    if exc.status_code == 404:
        return error_response(ApiError(404, "not_found", f"no route {request.url.path}"))
    return JSONResponse(
        {"error": {"code": "bad_request", "message": str(exc.detail)}},
        status_code=exc.status_code,
    )


class _Api:
    """The route handlers, sharing the config, the registry (set at startup) and the gate."""

    registry: Registry
    gate: Gate
    waiter: UpdateWaiter

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.timeout = config.request_timeout

    async def _body(self, request: Request) -> Any:
        return await read_json(request.scope, request.receive, self.config.max_body, self.timeout)

    def route(self, path: str, **handlers: Callable[[Request], Awaitable[Response]]) -> Route:
        """One route for several methods (``GET=...``), so that a 405 lists them all in
        ``Allow``. A key path ending in ``/cas`` is the compare-and-set resource (``POST``
        only): its other methods answer 405 rather than take ``/cas`` as part of the key."""

        async def endpoint(request: Request) -> Response:
            key = request.path_params.get("key")
            if key is not None and (key == "cas" or key.endswith("/cas")):
                raise ApiError(
                    405,
                    "method_not_allowed",
                    f"{request.method} is not allowed on a compare-and-set",
                    headers={"allow": "POST"},
                )
            method = "GET" if request.method == "HEAD" else request.method
            return await handlers[method](request)

        return Route(path, endpoint, methods=list(handlers))

    async def _outcome(self, update: Future[Any]) -> Any:
        """What an update's future resolves to, waited for at most the request timeout
        (then 504: the update may still be applied)."""
        try:
            return await self.waiter.wait(update)
        except TimeoutError:
            raise ApiError(
                504,
                "timeout",
                f"no answer from the log within {self.timeout} s: the update may or may not "
                "be applied",
            ) from None

    # -- plain routes -------------------------------------------------------------------

    async def console(self, request: Request) -> Response:
        page = resources.files("kafkakv.serve") / "static" / "index.html"
        return FileResponse(str(page), media_type="text/html")

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document())

    async def metrics(self, request: Request) -> Response:
        text = await asyncio.to_thread(generate_latest, REGISTRY)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    # -- maps ---------------------------------------------------------------------------

    async def _map(self, request: Request) -> ServedMap:
        return await self.registry.map(request.path_params["map"])

    async def list_maps(self, request: Request) -> Response:
        registry = self.registry

        def listing() -> list[dict[str, Any]]:
            # One listing gives names and partition counts: a map deleted meanwhile is
            # either whole in it or absent.
            counts = registry.db.log.topic_partitions()
            maps, _ = registry.topic_names(counts)
            return [
                {"name": name, "partitions": counts[name], "open": name in registry.maps}
                for name in maps
            ]

        return JSONResponse({"maps": await asyncio.to_thread(listing)})

    async def create_map(self, request: Request) -> Response:
        name = request.path_params["map"]
        doc = _object(
            await self._body(request),
            {"partitions": False, "versions": False, "expiry": False, "hash_tags": False},
        )
        partitions = doc.get("partitions")
        if isinstance(partitions, float) and partitions.is_integer():
            partitions = int(partitions)  # 2.0 is an integer to JSON
        if partitions is not None and (
            not isinstance(partitions, int)
            or isinstance(partitions, bool)
            or not 1 <= partitions <= MAX_PARTITIONS
        ):
            raise ApiError(
                400, "bad_request", f"partitions is an integer from 1 to {MAX_PARTITIONS}"
            )
        settings: dict[str, bool] = {}
        for option in ("versions", "expiry", "hash_tags"):
            if option in doc:
                if not isinstance(doc[option], bool):
                    raise ApiError(400, "bad_request", f"{option} must be true or false")
                settings[option] = doc[option]
        created = await asyncio.to_thread(self.registry.create_map, name, partitions, settings)
        return JSONResponse({"name": name, "created": created}, status_code=201 if created else 200)

    async def map_status(self, request: Request) -> Response:
        served = await self._map(request)
        m = served.map

        def status() -> dict[str, Any]:
            applied = m.applied_offsets()
            ends = m.end_offsets()
            return {
                "name": served.name,
                "partitions": m.partition_count,
                "held": list(m.partitions),
                "codecs": dict(zip(("key", "value"), m.codec_names, strict=True)),
                "settings": m.creation_options,
                "size": len(m),
                "positions": applied,
                "flushed": m.flushed_offsets(),
                "end_offsets": ends,
                "lag": {p: max(0, ends[p] - applied[p]) for p in applied},
                "cursor": str(m.cursor()),
                "errors": [
                    {
                        "partition": e.partition,
                        "offset": e.offset,
                        "topic": e.topic,
                        "error": e.error,
                    }
                    for e in m.errors()[-20:]
                ],
                "stalled": {p: str(e) for p, e in m.stalled().items()},
            }

        return JSONResponse(await asyncio.to_thread(status))

    async def get_key(self, request: Request) -> Response:
        served = await self._map(request)
        key = served.keys.parse(request.path_params["key"])
        if _linearizable(request):
            await served.map.sync_async(self.timeout)
        m = served.map
        if served.versions:
            found = m.get_versioned(key)
            if found is None:
                raise _absent(served, key)
            value, version = found
            doc = {"key": served.keys.text(key), "value": served.values.json(value)}
            doc["version"] = version
            return JSONResponse(doc)
        value = m.get(key, MISSING)
        if value is MISSING:
            raise _absent(served, key)
        return JSONResponse({"key": served.keys.text(key), "value": served.values.json(value)})

    async def put_key(self, request: Request) -> Response:
        served = await self._map(request)
        key = served.keys.parse(request.path_params["key"])
        value = served.values.parse(await self._body(request))
        ttl_text = request.query_params.get("ttl")
        ttl = None
        if ttl_text is not None:
            try:
                ttl = float(ttl_text)
            except ValueError:
                raise ApiError(400, "bad_request", f"ttl is seconds, not {ttl_text!r}") from None
        if ttl is not None and not served.expiry:
            raise ApiError(
                409,
                "settings_mismatch",
                f"map {served.name!r} was created without expiry: a ttl needs expiry=true",
            )
        if _flag(request, "if_absent"):
            if ttl is not None:
                raise ApiError(400, "bad_request", "ttl does not go with if_absent")
            return JSONResponse(await self.put_if_absent(served, key, value))
        return JSONResponse(await self.put(served, key, value, ttl))

    async def put(self, served: ServedMap, key: Any, value: Any, ttl: float | None) -> Any:
        """Write ``key``; the answer's body (the fast path shares it)."""
        previous = await self._outcome(served.map.put_async(key, value, ttl))
        return {"key": served.keys.text(key), "previous": served.values.json(previous)}

    async def put_if_absent(self, served: ServedMap, key: Any, value: Any) -> Any:
        current = await self._outcome(served.map.put_if_absent_async(key, value))
        text = served.keys.text(key)
        if current is not None:
            raise ApiError(
                409,
                "key_exists",
                f"key {text!r} already holds a value",
                {"current": served.values.json(current)},
            )
        return {"key": text, "previous": None}

    async def delete_key(self, request: Request) -> Response:
        served = await self._map(request)
        key = served.keys.parse(request.path_params["key"])
        previous = await self._outcome(served.map.remove_async(key))
        if previous is None:
            raise _absent(served, key)
        text = served.keys.text(key)
        return JSONResponse({"key": text, "previous": served.values.json(previous)})

    async def cas(self, request: Request) -> Response:
        served = await self._map(request)
        key = served.keys.parse(request.path_params["key"])
        doc = _object(await self._body(request), {"expected": True, "value": True})
        expected = served.values.parse_optional(doc["expected"], "expected value")
        value = served.values.parse(doc["value"])
        done = await self._outcome(served.map.compare_and_set_async(key, expected, value))
        text = served.keys.text(key)
        if not done:
            current = served.map.get(key)
            raise ApiError(
                409,
                "cas_failed",
                f"key {text!r} does not hold the expected value",
                {"current": served.values.json(current)},
            )
        return JSONResponse({"key": text, "value": doc["value"]})

    async def transaction(self, request: Request) -> Response:
        served = await self._map(request)
        doc = _object(
            await self._body(request),
            {"expect": False, "expect_version": False, "put": False, "remove": False},
        )
        keys, values = served.keys, served.values
        expect = {
            keys.parse(k): values.parse_optional(v, "expected value")
            for k, v in _mapping(doc, "expect").items()
        }
        if doc.get("expect_version") and not served.versions:
            raise ApiError(
                409,
                "settings_mismatch",
                f"map {served.name!r} was created without versions: expect_version needs them",
            )
        versions: dict[Any, int | None] = {}
        for k, v in _mapping(doc, "expect_version").items():
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise ApiError(400, "bad_request", "expect_version values are integers or null")
            versions[keys.parse(k)] = v
        put = {keys.parse(k): values.parse(v) for k, v in _mapping(doc, "put").items()}
        remove = doc.get("remove", [])
        if not isinstance(remove, list):
            raise ApiError(400, "bad_request", "remove is a list of keys")
        removed = [keys.parse_json(k) for k in remove]
        try:
            future = served.map.transaction_async(
                expect, put, removed, expect_version=versions or None
            )
        except CrossPartitionError as exc:
            partitions = {str(p): [keys.text(k) for k in ks] for p, ks in exc.partitions.items()}
            raise ApiError(400, "cross_partition", str(exc), {"partitions": partitions}) from exc
        if not await self._outcome(future):
            raise ApiError(
                409, "transaction_failed", "an expectation did not hold: nothing changed"
            )
        return JSONResponse({"committed": True})

    async def map_batch_get(self, request: Request) -> Response:
        served = await self._map(request)
        keys = _key_list(await self._body(request), served.keys.parse_json)
        if _linearizable(request):
            await served.map.sync_async(self.timeout)
        return JSONResponse(_batch(served.map, keys, served))

    async def map_batch_put(self, request: Request) -> Response:
        served = await self._map(request)
        doc = _object(await self._body(request), {"items": True})
        items = doc["items"]
        keys, values = served.keys, served.values
        if isinstance(items, dict):
            pairs = [(keys.parse(k), values.parse(v)) for k, v in items.items()]
        elif isinstance(items, list) and all(isinstance(p, list) and len(p) == 2 for p in items):
            pairs = [(keys.parse_json(k), values.parse(v)) for k, v in items]
        else:
            raise ApiError(400, "bad_request", "items is an object or a list of [key, value]")
        if pairs:
            await self._outcome(served.map.put_all_async(pairs))
        return JSONResponse({"count": len(pairs)})

    async def map_scan(self, request: Request) -> Response:
        served = await self._map(request)
        if _linearizable(request):
            await served.map.sync_async(self.timeout)
        page = _Page(request, served.keys)
        m = served.map
        if served.sorted and page.bounds_ok:
            start = page.lower()
            rows = m.range(start, page.upper(), inclusive=(page.lower_inclusive(), False))  # type: ignore[attr-defined]
            return JSONResponse(page.answer(rows, served.values))
        pairs = sorted(((served.keys.text(k), k) for k in m), key=lambda t: t[0])
        rows = ((k, m.get(k)) for _, k in pairs if page.wants(served.keys.text(k)))
        return JSONResponse(page.answer((r for r in rows if r[1] is not None), served.values))

    async def changes(self, request: Request) -> Response:
        served = await self._map(request)
        since = request.headers.get("last-event-id") or request.query_params.get("since")
        try:
            cursor = None if not since else Cursor.parse(since)
            feed = served.map.changes(cursor, timeout=0)  # _next_change sets each step's wait
        except KafkaKVError as exc:
            raise api_error(exc) from exc
        return StreamingResponse(
            self._events(served, feed),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def _events(self, served: ServedMap, feed: ChangeFeed[Any, Any]) -> AsyncIterator[bytes]:
        keys, values = served.keys, served.values
        wait = min(1.0, self.config.heartbeat)  # between looks at the heartbeat
        drained = asyncio.ensure_future(self.gate.draining.wait())
        try:
            cursor = str(feed.cursor)
            yield _frame("cursor", cursor, {"cursor": cursor})
            quiet_since = time.monotonic()
            while not self.gate.draining.is_set():
                try:
                    change = await _next_change(feed, wait, drained)
                except StopAsyncIteration:
                    if time.monotonic() - quiet_since >= self.config.heartbeat:
                        quiet_since = time.monotonic()
                        yield b": keep-alive\n\n"
                    continue
                except KafkaKVError as exc:
                    error = api_error(exc)
                    yield _frame("error", None, error.body())
                    return
                quiet_since = time.monotonic()
                data = {
                    "key": keys.text(change.key),
                    "old": values.json(change.old),
                    "new": values.json(change.new),
                    "partition": change.partition,
                    "offset": change.offset,
                }
                yield _frame("change", str(change.cursor), data)
        finally:
            drained.cancel()
            feed.close()

    # -- directories --------------------------------------------------------------------

    async def _directory(self, request: Request) -> ServedDirectory:
        if _linearizable(request):
            raise ApiError(
                400,
                "bad_request",
                "a directory follows a topic others write: it serves local reads only",
            )
        return await self.registry.directory(request.path_params["name"])

    async def list_directories(self, request: Request) -> Response:
        registry = self.registry

        def listing() -> list[dict[str, Any]]:
            _, others = registry.topic_names()
            names = sorted(set(others) | set(registry.directories))
            rows = []
            for name in names:
                served = registry.directories.get(name)
                rows.append(
                    {
                        "name": name,
                        "open": served is not None,
                        "ready": served is not None and served.directory.ready,
                    }
                )
            return rows

        return JSONResponse({"directories": await asyncio.to_thread(listing)})

    async def directory_status(self, request: Request) -> Response:
        served = await self._directory(request)
        d, log = served.directory, self.registry.db.log

        def status() -> dict[str, Any]:
            positions = d.positions()
            partitions = log.partitions(served.name)
            ends = {p: log.end_offset(served.name, p) for p in range(partitions)}
            return {
                "name": served.name,
                "state": d.state.value,
                "ready": d.ready,
                "ready_seconds": d.ready_seconds,
                "partitions": partitions,
                "size": len(d),
                "positions": positions,
                "end_offsets": ends,
                "lag": {p: max(0, ends[p] - positions.get(p, 0)) for p in ends},
                "errors": [
                    {"partition": e.partition, "offset": e.offset, "error": e.error}
                    for e in d.errors()[-20:]
                ],
            }

        return JSONResponse(await asyncio.to_thread(status))

    async def directory_get(self, request: Request) -> Response:
        served = await self._directory(request)
        await _ready(served, self.timeout)
        key = served.keys.parse(request.path_params["key"])
        value = served.directory.get(key, MISSING)
        if value is MISSING:
            raise ApiError(
                404, "key_not_found", f"{served.name!r} holds no key {served.keys.text(key)!r}"
            )
        return JSONResponse({"key": served.keys.text(key), "value": served.values.json(value)})

    async def directory_batch_get(self, request: Request) -> Response:
        served = await self._directory(request)
        await _ready(served, self.timeout)
        keys = _key_list(await self._body(request), served.keys.parse_json)
        return JSONResponse(_batch(served.directory, keys, served))

    async def directory_scan(self, request: Request) -> Response:
        served = await self._directory(request)
        await _ready(served, self.timeout)
        page = _Page(request, served.keys)
        d = served.directory
        texts = sorted(((served.keys.text(k), k) for k in list(d)), key=lambda t: t[0])
        rows = ((k, d.get(k)) for t, k in texts if page.wants(t))
        return JSONResponse(page.answer((r for r in rows if r[1] is not None), served.values))


async def _next_change(
    feed: ChangeFeed[Any, Any], wait: float, drained: asyncio.Future[Any]
) -> Change[Any, Any]:
    """The feed's next change, waited for at most ``wait`` seconds and only until ``drained``
    is done; StopAsyncIteration when none came.

    A change already there is taken by a plain step of the feed; only a step that has to wait
    runs as a task, raced against ``drained`` and cancelled when that comes first. So a drain
    ends an idle change stream at once, not after the rest of its wait, and a busy stream
    pays no task per change."""
    feed.timeout = 0
    try:
        return await feed.__anext__()
    except StopAsyncIteration:
        if drained.done():
            raise
    feed.timeout = wait
    step = asyncio.ensure_future(feed.__anext__())
    try:
        await asyncio.wait((step, drained), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not step.done():  # drained, or the client left: end the feed's wait
            step.cancel()
            await asyncio.wait((step,))
    if step.cancelled():
        raise StopAsyncIteration
    return step.result()


def _frame(kind: str, id: str | None, data: Any) -> bytes:
    """One server-sent event: ``event: kind``, ``id: id`` (a cursor the client may resume from
    with ``Last-Event-ID``; none when None) and ``data`` as one line of JSON.

    >>> _frame("cursor", "0:5", {"cursor": "0:5"})
    b'event: cursor\\nid: 0:5\\ndata: {"cursor":"0:5"}\\n\\n'
    >>> _frame("error", None, {"error": {"code": "timeout"}})
    b'event: error\\ndata: {"error":{"code":"timeout"}}\\n\\n'
    """
    head = f"event: {kind}\n" if id is None else f"event: {kind}\nid: {id}\n"
    return head.encode() + b"data: " + dumps(data) + b"\n\n"


def _absent(served: ServedMap, key: Any) -> ApiError:
    return ApiError(
        404, "key_not_found", f"map {served.name!r} holds no key {served.keys.text(key)!r}"
    )


async def _ready(served: ServedDirectory, timeout: float) -> None:
    """Return once the directory is ready (at once, almost always), waiting for it at most
    ``timeout`` seconds: a directory opened by this request loads first; 503 ``not_ready``
    when it still loads then."""
    directory = served.directory
    if directory.ready:
        return
    try:
        await asyncio.to_thread(directory.wait_ready, timeout)
    except OperationTimeoutError:
        raise ApiError(
            503,
            "not_ready",
            f"directory {served.name!r} is still loading: retry shortly",
            headers={"retry-after": "1"},
        ) from None


def _mapping(doc: dict[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise ApiError(400, "bad_request", f"{name} is an object of key: value")
    return value


def _key_list(doc: Any, parse: Callable[[object], Any]) -> list[Any]:
    doc = _object(doc, {"keys": True})
    keys = doc["keys"]
    if not isinstance(keys, list) or len(keys) > MAX_BATCH:
        raise ApiError(400, "bad_request", f"keys is a list of at most {MAX_BATCH} keys")
    return [parse(k) for k in keys]


def _batch(
    source: Any, keys: list[Any], served: ServedMap | ServedDirectory
) -> dict[str, list[Any]]:
    items, missing = [], []
    for key in keys:
        value = source.get(key, MISSING)
        if value is MISSING:
            missing.append(served.keys.text(key))
        else:
            items.append({"key": served.keys.text(key), "value": served.values.json(value)})
    return {"items": items, "missing": missing}


class _Page:
    """One page of a range scan: what ``prefix``, ``start``, ``end``, ``cursor``, ``limit``
    and ``values`` ask for. Bounds compare keys' text forms, which sort as their encoded
    bytes for ``str`` and ``bytes`` keys (and are used as such by sorted maps)."""

    def __init__(self, request: Request, keys: Any) -> None:
        params = request.query_params
        self.keys = keys
        self.limit = _limit(request)
        self.values = _flag(request, "values", default=True)
        self.prefix = params.get("prefix") or None
        self.start = params.get("start") or None
        self.end = params.get("end") or None
        self.cursor = params.get("cursor") or None
        # A walk of a sorted store needs key objects for its bounds; text bounds on int keys
        # compare as numbers there, so only prefixes need text-ordered keys.
        self.bounds_ok = self.prefix is None or keys.ordered_text
        if self.prefix is not None and not keys.ordered_text and keys.codec == "int":
            raise ApiError(400, "bad_request", "prefix needs str or bytes keys")

    def _key(self, text: str | None) -> Any:
        return None if text is None else self.keys.parse(text)

    def lower(self) -> Any:
        candidates = [t for t in (self.start, self.prefix, self.cursor) if t is not None]
        if not candidates:
            return None
        if self.keys.codec == "int":
            return max(self._key(t) for t in candidates)
        return self._key(max(candidates))

    def lower_inclusive(self) -> bool:
        if self.cursor is None:
            return True
        return bool(self.lower() != self._key(self.cursor))

    def upper(self) -> Any:
        return self._key(self.end)

    def wants(self, text: str) -> bool:
        """Whether the key of text form ``text`` is in the page's range (unsorted scans)."""
        if self.prefix is not None and not text.startswith(self.prefix):
            return False
        if self.start is not None and text < self.start:
            return False
        if self.end is not None and text >= self.end:
            return False
        return not (self.cursor is not None and text <= self.cursor)

    def answer(self, rows: Any, values: Any) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        more = False
        for key, value in rows:
            text = self.keys.text(key)
            if self.prefix is not None and not text.startswith(self.prefix):
                if self.keys.ordered_text and text > self.prefix:
                    break
                continue
            if len(items) == self.limit:
                more = True
                break
            item: dict[str, Any] = {"key": text}
            if self.values:
                item["value"] = values.json(value)
            items.append(item)
        return {"items": items, "next": items[-1]["key"] if more else None}
