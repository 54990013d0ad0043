"""Running the application: :func:`run` (the ``kafkakv serve`` command) and
:func:`serve_in_thread` (tests, or a program that serves its own database).

uvicorn runs the ASGI application with uvloop and httptools when they are installed. The first
SIGTERM or SIGINT drains (docs/serve.md, "Draining and restarts"): the :class:`~kafkakv.serve.
app.Gate` answers new requests ``503 draining`` and ends change streams, the requests in
flight finish (at most ``drain_timeout`` seconds), then uvicorn stops and the lifespan closes
the database, which drains the updates still queued to the log. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

from kafkakv.db import Database
from kafkakv.serve.app import create_app
from kafkakv.serve.config import ServeConfig
from kafkakv.serve.gate import Gate

__all__ = ["run", "serve_in_thread"]


def _uvicorn_config(config: ServeConfig, app: Any, **more: Any) -> uvicorn.Config:
    fast_loop = importlib.util.find_spec("uvloop") is not None
    fast_http = importlib.util.find_spec("httptools") is not None
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        loop="uvloop" if fast_loop else "asyncio",
        http="httptools" if fast_http else "h11",
        lifespan="on",
        log_level="warning",
        access_log=False,
        server_header=False,
        proxy_headers=False,  # no proxy to trust by default; it costs every request
        limit_concurrency=config.max_connections,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=int(config.drain_timeout) + 1,
        ssl_certfile=config.tls_cert,
        ssl_keyfile=config.tls_key,
        **more,
    )


class _DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain before it stops, and a line saying where it listens."""

    def __init__(
        self, config: uvicorn.Config, gate: Gate, serve: ServeConfig, announce: bool
    ) -> None:
        super().__init__(config)
        self.gate = gate
        self.settings = serve
        self.announce = announce
        self.loop: asyncio.AbstractEventLoop | None = None
        self.bound: tuple[str, int] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                self.bound = (host, port)
                break
        if self.announce and self.bound is not None and not self.should_exit:
            scheme = "https" if self.settings.tls_cert else "http"
            host = self.bound[0] if ":" not in self.bound[0] else f"[{self.bound[0]}]"
            print(
                f"kafkakv serve: {scheme}://{host}:{self.bound[1]}/ ({self.settings.target})",
                file=sys.stderr,
                flush=True,
            )

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.gate.draining.is_set() or self.loop is None:
            self.force_exit = True
            self.should_exit = True
            return
        self.loop.call_soon_threadsafe(self.drain)

    def drain(self) -> None:
        """Refuse new requests, let those in flight finish, then stop (on the loop)."""
        if self.gate.draining.is_set():
            return
        self.gate.drain()

        async def stop_when_idle() -> None:
            await self.gate.idle(self.settings.drain_timeout)
            self.should_exit = True

        assert self.loop is not None
        self.loop.create_task(stop_when_idle())


def run(config: ServeConfig, *, announce: bool = True) -> None:
    """Serve ``config`` until SIGTERM or SIGINT (drained as the module doc says). Raises
    ConfigError for an unsafe or impossible config, before binding."""
    gate = create_app(config)
    server = _DrainingServer(_uvicorn_config(config, gate), gate, config, announce)
    server.run()
    if not server.started:
        raise SystemExit(1)  # uvicorn said why (a port in use, the log unreachable)


@contextlib.contextmanager
def serve_in_thread(
    config: ServeConfig, db: Database | None = None, *, ready_timeout: float = 30.0
) -> Iterator[str]:
    """Serve ``config`` (``port=0`` picks a free port) from a thread of this process, and
    yield the base URL (``http://127.0.0.1:PORT``, ``https`` with TLS); stopping drains as :func:`run` does.
    With ``db``, the server uses that database and leaves it open."""
    gate = create_app(config, db)
    server = _DrainingServer(_uvicorn_config(config, gate), gate, config, announce=False)
    thread = threading.Thread(target=server.run, name="kafkakv-serve", daemon=True)
    thread.start()
    waited = 0.0
    while not server.started and thread.is_alive() and waited < ready_timeout:
        threading.Event().wait(0.01)
        waited += 0.01
    if not server.started:
        server.should_exit = True
        thread.join(5)
        raise RuntimeError("the server did not start: see its log output")
    assert server.bound is not None
    try:
        scheme = "https" if config.tls_cert else "http"
        yield f"{scheme}://{server.bound[0]}:{server.bound[1]}"
    finally:
        loop = server.loop
        if loop is not None and thread.is_alive():
            loop.call_soon_threadsafe(server.drain)
        thread.join(config.drain_timeout + 10)
