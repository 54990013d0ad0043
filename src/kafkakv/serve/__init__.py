"""``kafkakv serve``: maps and directories over HTTP, change streams, a web console.

Needs the ``serve`` extra (``pip install 'kafkakv[serve]'``: Starlette and uvicorn). The API,
its security and its limits are in docs/serve.md. Modules: :mod:`~kafkakv.serve.config` (what
the server is told), :mod:`~kafkakv.serve.convert` (keys and values as JSON),
:mod:`~kafkakv.serve.errors` (error codes), :mod:`~kafkakv.serve.registry` (the open maps and
directories), :mod:`~kafkakv.serve.gate` (token, drain, fast path), :mod:`~kafkakv.serve.app` (routes), :mod:`~kafkakv.serve.openapi`,
:mod:`~kafkakv.serve.server` (running it, draining on SIGTERM).
"""

from __future__ import annotations

from kafkakv.serve.config import ServeConfig

__all__ = ["ServeConfig"]
