"""Serving Prometheus metrics over HTTP: :func:`serve`.

Directories (and anything else that records into a ``prometheus_client`` registry) are
scraped from ``http://ADDR:PORT/metrics``. The server binds to 127.0.0.1 unless told
otherwise: metrics say what a service holds, so exposing them is a deliberate choice.

>>> from prometheus_client import CollectorRegistry, Counter
>>> import urllib.request
>>> registry = CollectorRegistry()
>>> Counter("doctest_things", "things", registry=registry).inc(3)
>>> with serve(registry=registry) as server:
...     body = urllib.request.urlopen(server.url, timeout=5).read().decode()
>>> "doctest_things_total 3.0" in body
True
"""

from __future__ import annotations

import socketserver
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app

from kafkakv.errors import ConfigError
from kafkakv.lifecycle import Closeable

__all__ = ["MetricsServer", "serve"]


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never keeps the process alive


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # no line per scrape on stderr
        pass


class MetricsServer(Closeable):
    """An HTTP server answering ``GET /metrics`` (any path, in fact) from a registry, on a
    daemon thread. :meth:`close` stops it and frees the port."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self._closed = False
        self.addr: str = str(server.server_address[0])
        self.port: int = server.server_address[1]

    @property
    def url(self) -> str:
        """``http://addr:port/metrics``."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving (waits for the serving thread, at most 5 s). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(
    port: int = 0, addr: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> MetricsServer:
    """Serve ``registry`` (default: prometheus_client's global one) on ``addr:port``; port 0
    picks a free port (read it from :attr:`MetricsServer.port`). Returns once listening.

    Raises :class:`~kafkakv.errors.ConfigError` for a port out of range or an address that
    cannot be bound (in use, not local).
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"a port is an int in 0..65535, not {port!r}")
    app = make_wsgi_app(REGISTRY if registry is None else registry)
    try:
        server = make_server(addr, port, app, _ThreadingServer, handler_class=_QuietHandler)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="kafkakv-metrics"
    )
    thread.daemon = True
    thread.start()
    return MetricsServer(server, thread)
