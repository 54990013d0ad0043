"""Options shared by the command groups of the ``kafkakv`` command."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

__all__ = ["CODEC_NAMES", "codec_options", "log_path_option", "request_timeout_option"]

_F = TypeVar("_F", bound=Callable[..., Any])

CODEC_NAMES = ("str", "bytes", "int", "json", "msgpack")
"""The codecs a command can name (:func:`kafkakv.codecs.codec_for`); pickle is left out, as
decoding it would run code that came through the log."""

log_path_option = click.option(
    "--path",
    "-p",
    envvar="KAFKAKV_LOG",
    show_envvar=True,
    type=click.Path(file_okay=False, dir_okay=True),
    help="Directory of the embedded log (map commands also take kafka://host:port,...).",
)
"""``--path/-p DIR`` (or ``KAFKAKV_LOG``): the log a command works on."""

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
