"""``kafkakv``: the command line. Each command group lives in its own module and only parses,
calls the public API and prints:

==================================  ==========================================================
``kafkakv log``                     :mod:`~kafkakv.cli.log_commands`: inspect and maintain an
                                    embedded log
``kafkakv map``                     :mod:`~kafkakv.cli.map_commands`: read, write and watch a map
``kafkakv directory``               :mod:`~kafkakv.cli.directory_commands`: load, dump and
                                    serve a topic as a directory
``kafkakv pipeline``                :mod:`~kafkakv.cli.pipeline_commands`: the Spark jobs
``kafkakv topics|init-existing``    :mod:`~kafkakv.cli.topics_commands`: a map's topics
``kafkakv dev-cluster``             :mod:`~kafkakv.cli.devcluster_commands`: a local Kafka
==================================  ==========================================================

The options the groups share (the log, the codecs, the request timeout) are defined once in
:mod:`kafkakv.cli.options`. Every :class:`~kafkakv.errors.KafkaKVError` a command lets through
is printed as ``error: <message>`` with exit code 2 (:class:`~kafkakv.cli.errors.CommandError`),
never as a traceback.
"""

from __future__ import annotations

from typing import Any

import click

from kafkakv import __version__
from kafkakv.cli.devcluster_commands import dev_cluster_group
from kafkakv.cli.devspark_commands import dev_spark_group
from kafkakv.cli.directory_commands import directory_group
from kafkakv.cli.errors import CommandError
from kafkakv.cli.log_commands import log_group
from kafkakv.cli.map_commands import map_group
from kafkakv.cli.pipeline_commands import pipeline_group
from kafkakv.cli.serve_command import serve_command
from kafkakv.cli.topics_commands import init_existing_command, topics_group
from kafkakv.errors import KafkaKVError

__all__ = ["main"]


class _TranslatingGroup(click.Group):
    """A group that turns every :class:`KafkaKVError` below it into a :class:`CommandError`."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KafkaKVError as exc:
            raise CommandError(str(exc)) from exc


@click.group(cls=_TranslatingGroup)
@click.version_option(__version__, "--version", prog_name="kafkakv")
def main() -> None:
    """kafkakv: a replicated key-value database on a partitioned log."""


main.add_command(log_group)
main.add_command(map_group)
main.add_command(directory_group)
main.add_command(pipeline_group)
main.add_command(serve_command)
main.add_command(topics_group)
main.add_command(init_existing_command)
main.add_command(dev_cluster_group)
main.add_command(dev_spark_group)
