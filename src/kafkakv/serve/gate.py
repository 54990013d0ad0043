"""What stands in front of the routes of ``kafkakv serve``: the :class:`Gate` (bearer token,
draining, requests in flight, the console's headers) and the :class:`FastPath` of the
commonest requests; and the pieces both share with the routes: :func:`read_json`, the only
body reader, and :class:`JSONResponse`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kafkakv.errors import KafkaKVError
from kafkakv.serve.convert import dumps
from kafkakv.serve.errors import ApiError, api_error

if TYPE_CHECKING:
    from kafkakv.serve.config import ServeConfig
    from kafkakv.serve.registry import Registry, ServedMap

__all__ = ["FastPath", "Gate", "JSONResponse", "PutRoutes", "error_response", "read_json"]

MISSING = object()
"""The default of a lookup that tells an absent key from any value."""

_PUBLIC_PATHS = ("/", "/v1/health", "/favicon.ico")
"""Paths served without a token: the console's page and assets (so it can ask for the
token), and the health check, which tells nothing about the data."""


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The answer to ``error``: its body, status and headers (and ``headers`` besides)."""
    both = {**error.headers, **(headers or {})}
    return JSONResponse(error.body(), status_code=error.status, headers=both or None)


class Gate:
    """ASGI middleware in front of every route: bearer token, draining, requests in flight.

    ``drain()`` makes every new request answer ``503 draining`` (``Retry-After: 1``,
    ``Connection: close``) and sets :attr:`draining`, which change streams watch;
    :meth:`idle` waits until the requests in flight have finished."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._token = None if token is None else f"Bearer {token}".encode()
        self.in_flight = 0
        self.draining = asyncio.Event()
        self._idle: asyncio.Event | None = None
        self.fast: Callable[[Scope, Receive, Send], Awaitable[bool]] | None = None
        """The fast path of the commonest requests (:class:`FastPath`): True when it
        answered, False to pass the request on to the routes."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.draining.is_set():
            error = ApiError(503, "draining", "the server is shutting down: retry shortly")
            headers = {"retry-after": "1", "connection": "close"}
            await error_response(error, headers)(scope, receive, send)
            return
        if self._token is not None and not self._authorized(scope):
            error = ApiError(401, "unauthorized", "a bearer token is required")
            headers = {"www-authenticate": 'Bearer realm="kafkakv"'}
            await error_response(error, headers)(scope, receive, send)
            return
        path: str = scope["path"]
        if path == "/" or path.startswith("/static/"):
            send = _with_page_headers(send)
        self.in_flight += 1
        try:
            if self.fast is None or not await self.fast(scope, receive, send):
                await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0 and self._idle is not None:
                self._idle.set()

    def _authorized(self, scope: Scope) -> bool:
        path: str = scope["path"]
        if path in _PUBLIC_PATHS or path.startswith("/static/"):
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self._token or b"")
        return False

    def drain(self) -> None:
        """Refuse new requests from now on and end change streams."""
        self.draining.set()

    async def idle(self, timeout: float) -> bool:
        """Wait until no request is in flight (change streams end by themselves once
        draining); False when ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        while self.in_flight > 0:
            self._idle = asyncio.Event()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._idle.wait()
        return True


_PAGE_HEADERS = [
    # The console loads nothing from elsewhere and is framed by nobody.
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),  # a new console.js after an upgrade, not a stale one
]


def _with_page_headers(send: Send) -> Send:
    """``send`` adding the console's security headers to the response it starts."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *_PAGE_HEADERS]}
        await send(message)

    return sending


# -- request helpers -----------------------------------------------------------------------


async def read_json(scope: Scope, receive: Receive, limit: int, timeout: float) -> Any:
    """The JSON body of ``scope``'s request from ``receive``: 413 ``body_too_large`` at once,
    reading nothing, when its ``Content-Length`` declares more than ``limit`` bytes, else once
    the bytes received pass ``limit`` (a chunked body); 408 ``body_timeout`` when it has not all
    arrived within ``timeout`` seconds, 400 ``invalid_json`` when it is empty or does not parse.
    Routes and the fast path both read bodies here."""
    if _declared_length(scope) > limit:
        raise ApiError(413, "body_too_large", f"the body is over {limit} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise ApiError(400, "bad_request", "the client left before its body ended")
                body += message.get("body", b"")
                if len(body) > limit:
                    raise ApiError(413, "body_too_large", f"the body is over {limit} bytes")
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise ApiError(408, "body_timeout", f"the body did not arrive within {timeout} s") from None
    if not body:
        raise ApiError(400, "invalid_json", "the body is empty: it must be a JSON document")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"the body is not JSON: {exc}") from None


def _declared_length(scope: Scope) -> int:
    """The request's ``Content-Length``; 0 when it has none (or one the HTTP parser let
    through that is not a number: the body's own length counts then)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


_JSON_HEADERS = [(b"content-type", b"application/json")]


class PutRoutes(Protocol):
    """What the fast path needs of the routes (kafkakv.serve.app's): the served maps, the
    limits of a request, and the write whose answer it shares."""

    @property
    def registry(self) -> Registry: ...

    @property
    def config(self) -> ServeConfig: ...

    async def put(self, served: ServedMap, key: Any, value: Any, ttl: float | None) -> Any: ...


class FastPath:
    """The commonest requests, answered without the router: ``GET`` and ``PUT`` of
    ``/v1/maps/{map}/keys/{key}`` with no query string, on a map already open.

    It answers exactly as the routes do (it calls the same code for a write and builds the
    same bodies); anything else, or anything unusual (a key that does not parse, an absent
    key, a map with versions), it passes on to the routes by returning False before it has
    read the request's body. Skipping Starlette's router, middleware stack and request object
    halves the server's own cost per request (docs/benchmarks.md, "kafkakv serve")."""

    def __init__(self, api: PutRoutes) -> None:
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> bool:
        path: str = scope["path"]
        if scope["query_string"] or not path.startswith("/v1/maps/"):
            return False
        name, sep, rest = path[9:].partition("/keys/")
        if not sep or "/" in name:
            return False
        served = self.api.registry.maps.get(name)
        if served is None or served.versions:
            return False
        if rest == "cas" or rest.endswith("/cas"):
            return False  # the compare-and-set resource: the routes say which methods
        method = scope["method"]
        if method == "GET":
            return await self._get(served, rest, send)
        if method == "PUT":
            await self._put(served, rest, scope, receive, send)
            return True
        return False

    async def _get(self, served: ServedMap, text: str, send: Send) -> bool:
        try:
            key = served.keys.parse(text)
            value = served.map.get(key, MISSING)
        except Exception:
            return False  # the route raises the typed error
        if value is MISSING:
            return False
        body = dumps({"key": served.keys.text(key), "value": served.values.json(value)})
        await _send_json(send, 200, body)
        return True

    async def _put(
        self, served: ServedMap, text: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        try:
            key = served.keys.parse(text)
            config = self.api.config
            doc = await read_json(scope, receive, config.max_body, config.request_timeout)
            answer = await self.api.put(served, key, served.values.parse(doc), None)
        except (ApiError, KafkaKVError, TimeoutError) as exc:
            error = api_error(exc)
            await _send_json(send, error.status, dumps(error.body()))
            return
        await _send_json(send, 200, dumps(answer))


async def _send_json(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
