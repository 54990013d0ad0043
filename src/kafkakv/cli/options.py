"""Options shared by the command groups of the ``kafkakv`` command."""

from __future__ import annotations

import click

__all__ = ["log_path_option", "request_timeout_option"]

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
