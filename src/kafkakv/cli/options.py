"""Options shared by the command groups of the ``kafkakv`` command, each defined once: the log
(``-p/--path`` or ``$KAFKAKV_LOG`` in every group), the codecs and the request timeout."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

__all__ = [
    "CODEC_NAMES",
    "LOG_ENVVAR",
    "codec_options",
    "log_option",
    "request_timeout_option",
    "require_log",
]

_F = TypeVar("_F", bound=Callable[..., Any])

CODEC_NAMES = ("str", "bytes", "int", "json", "msgpack")
"""The codecs a command can name (:func:`kafkakv.codecs.codec_for`); pickle is left out, as
decoding it would run code that came through the log."""

LOG_ENVVAR = "KAFKAKV_LOG"
"""The environment variable that names the log when ``--path`` is not given."""

_ALIAS_ENVVAR = "KAFKAKV_TARGET"
"""The older name of ``KAFKAKV_LOG`` (``kafkakv topics`` and ``init-existing`` used it); read
when ``KAFKAKV_LOG`` is not set."""


class _LogOption(click.Option):
    """``-p/--path``, listed so in ``--help``; its aliases work but only its help names them."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        return None if record is None else (f"-p, --path {self.metavar}", record[1])


def log_option(*, kafka: bool = True) -> Callable[[_F], _F]:
    """``-p/--path LOG`` (or ``$KAFKAKV_LOG``): the log a command works on, passed as ``path``
    (None when not given: :func:`require_log` says what to pass).

    Every command group names its log with this one option. ``-t/--target`` and
    ``$KAFKAKV_TARGET`` are kept as aliases of it (``kafkakv topics`` and ``init-existing``
    spelled it so); ``$KAFKAKV_LOG`` wins when both variables are set. ``kafka``: the group
    also takes a ``kafka://`` URL (every group but ``log``).
    """
    what = (
        "The log: an embedded log's directory, or kafka://host:port[,host:port...]."
        if kafka
        else "The embedded log's directory."
    )
    return click.option(
        "-p",
        "--path",
        "-t",
        "--target",
        "path",
        cls=_LogOption,
        envvar=[LOG_ENVVAR, _ALIAS_ENVVAR],
        show_envvar=True,
        metavar="LOG",
        type=click.Path(file_okay=False, dir_okay=True),
        help=f"{what} -t/--target and KAFKAKV_TARGET are aliases.",
    )


def require_log(path: str | None, *, kafka: bool = True) -> str:
    """``path`` when the user gave one; else a :class:`click.UsageError` that says how
    (``kafka``: mention that a ``kafka://`` URL is accepted too)."""
    if path is None:
        what = "no log: pass --path/-p (a directory or kafka://host:port)"
        raise click.UsageError(
            f"{what if kafka else 'no log directory: pass --path/-p'} or set {LOG_ENVVAR}",
            ctx=click.get_current_context(silent=True),
        )
    return path


request_timeout_option = click.option(
    "--request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="How long a request to Kafka brokers, or a map update, may take before the command "
    "fails  [default: 30].",
)
"""``--request-timeout SECONDS``: passed as ``timeout`` to the Kafka log (and to maps); None
keeps their defaults."""


def codec_options(
    *, keys: Sequence[str] = CODEC_NAMES, values: Sequence[str] | None = CODEC_NAMES
) -> Callable[[_F], _F]:
    """``--key-codec`` (default ``str``, one of ``keys``) and ``--value-codec`` (default
    ``json``, one of ``values``), passed to the command as ``key_codec`` and ``value_codec``.

    ``values=None`` leaves ``--value-codec`` out, for commands whose values are always JSON.
    """
    key_option = click.option(
        "--key-codec",
        type=click.Choice(tuple(keys)),
        default="str",
        show_default=True,
        help="Codec of the keys in the log"
        + (" (values are JSON objects)." if values is None else "."),
    )
    if values is None:
        return key_option
    value_option = click.option(
        "--value-codec",
        type=click.Choice(tuple(values)),
        default="json",
        show_default=True,
        help="Codec of the values in the log.",
    )

    def decorate(fn: _F) -> _F:
        return key_option(value_option(fn))  # --key-codec listed first in --help

    return decorate
