"""The error every ``kafkakv`` command reports the same way, and the exit codes it shares.

A command raises :class:`CommandError` for a failure of its own (a log directory that does not
exist, an argument that does not parse); :mod:`kafkakv.cli.main` turns every
:class:`~kafkakv.errors.KafkaKVError` raised below it into one. Either way the user sees
``error: <message>`` on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

from typing import IO, Any

import click

__all__ = ["EXIT_ERROR", "CommandError"]

EXIT_ERROR = 2
"""A usage error or an error kafkakv raised."""


class CommandError(click.ClickException):
    """A command failed; shown as ``error: <message>`` on stderr, exit code 2."""

    exit_code = EXIT_ERROR

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", file=file, err=file is None)
