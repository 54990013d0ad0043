"""``kafkakv serve``: the HTTP API and web console of a log's maps and directories.

Parses its options into a :class:`~kafkakv.serve.ServeConfig` and runs
:func:`kafkakv.serve.server.run`; everything else is in :mod:`kafkakv.serve` and docs/serve.md.
It prints the address it serves on to stderr once it listens (``--bind HOST:0`` picks a free
port), serves until SIGTERM or Ctrl-C, drains and exits 0. Exit codes: 0 stopped cleanly; 1 the
server could not start (a port in use: uvicorn says why); 2 a usage error or an unsafe setting
(``error: <message>``), such as binding beyond loopback without ``--token-file``.
"""

from __future__ import annotations

import importlib.util

import click

from kafkakv.cli.errors import CommandError
from kafkakv.cli.options import log_option, require_log
from kafkakv.db import check_target
from kafkakv.errors import ConfigError

__all__ = ["parse_codec", "serve_command"]

_CODECS = ("str", "int", "bytes", "json", "msgpack")


def parse_codec(text: str) -> tuple[str, tuple[str, str]]:
    """``NAME=KEY:VALUE`` as ``(NAME, (KEY, VALUE))``.

    >>> parse_codec("users=str:msgpack")
    ('users', ('str', 'msgpack'))
    """
    name, sep, codecs = text.partition("=")
    keys, colon, values = codecs.partition(":")
    if not (sep and colon and name) or keys not in _CODECS or values not in _CODECS:
        raise click.BadParameter(
            f"{text!r} is not NAME=KEY:VALUE with codecs among {', '.join(_CODECS)}",
            param_hint="--codec",
        )
    return name, (keys, values)


@click.command("serve")
@log_option()
@click.option(
    "--bind",
    default="127.0.0.1:8765",
    show_default=True,
    metavar="HOST:PORT",
    help="Where to listen. Any address but loopback needs --token-file.",
)
@click.option(
    "--token-file",
    envvar="KAFKAKV_SERVE_TOKEN_FILE",
    show_envvar=True,
    type=click.Path(dir_okay=False),
    help="A file holding the bearer token every request must carry (16+ characters).",
)
@click.option("--key-codec", type=click.Choice(_CODECS), default="str", show_default=True)
@click.option("--value-codec", type=click.Choice(_CODECS), default="json", show_default=True)
@click.option(
    "--codec",
    "codecs",
    multiple=True,
    metavar="NAME=KEY:VALUE",
    help="Codecs of one map or directory (repeatable).",
)
@click.option(
    "--directory",
    "directories",
    multiple=True,
    metavar="TOPIC",
    help="A topic to open as a directory at start (repeatable); others open on first use.",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How long a request may wait for the log before it answers 504.",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="How long SIGTERM lets requests in flight finish.",
)
@click.option(
    "--max-body",
    type=click.IntRange(min=1),
    default=1 << 20,
    show_default=True,
    metavar="BYTES",
    help="The largest request body accepted (413 beyond).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Connections served at once (503 beyond).",
)
@click.option(
    "--fsync",
    type=click.Choice(("always", "interval", "never")),
    default="interval",
    show_default=True,
    help="The embedded log's fsync policy: always answers a write once it is on disk.",
)
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), help="PEM certificate.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), help="PEM private key.")
def serve_command(
    path: str | None,
    bind: str,
    token_file: str | None,
    key_codec: str,
    value_codec: str,
    codecs: tuple[str, ...],
    directories: tuple[str, ...],
    request_timeout: float,
    drain_timeout: float,
    max_body: int,
    max_connections: int,
    fsync: str,
    tls_cert: str | None,
    tls_key: str | None,
) -> None:
    """Serve the maps and directories of a log over HTTP, with a web console at /.

    \b
    Examples:
      kafkakv serve -p ./data
      curl -X PUT --data '{"n": 1}' http://127.0.0.1:8765/v1/maps/users/keys/ada
      curl http://127.0.0.1:8765/v1/maps/users/keys/ada
    """
    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        raise CommandError("kafkakv serve needs its extra: pip install 'kafkakv[serve]'")
    from kafkakv.serve.config import ServeConfig, parse_bind, read_token
    from kafkakv.serve.server import run

    target = require_log(path)
    try:
        check_target(target)
        host, port = parse_bind(bind)
        config = ServeConfig(
            target=target,
            host=host,
            port=port,
            token=None if token_file is None else read_token(token_file),
            max_body=max_body,
            request_timeout=request_timeout,
            drain_timeout=drain_timeout,
            max_connections=max_connections,
            key_codec=key_codec,
            value_codec=value_codec,
            codecs=dict(parse_codec(c) for c in codecs),
            directories=directories,
            fsync=fsync,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
        config.check()
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    run(config)
