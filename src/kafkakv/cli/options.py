"""Options shared by the command groups of the ``kafkakv`` command."""

from __future__ import annotations

import click

__all__ = ["log_path_option"]

log_path_option = click.option(
    "--path",
    "-p",
    envvar="KAFKAKV_LOG",
    show_envvar=True,
    type=click.Path(file_okay=False, dir_okay=True),
    help="Directory of the embedded log (map commands also take kafka://host:port,...).",
)
"""``--path/-p DIR`` (or ``KAFKAKV_LOG``): the log a command works on."""
