"""``kafkakv topics create|verify`` and ``kafkakv init-existing``: a map's topics from the shell.

The log (``-p/--path`` or ``KAFKAKV_LOG``, as in every group; ``-t/--target`` and
``KAFKAKV_TARGET`` are aliases) is an embedded log directory or
``kafka://host:port[,host:port...]``; ``--request-timeout`` bounds each request to its
brokers. NAME is a map's name: its topics are NAME, NAME_ops and NAME_flush, created with the
settings the map's protocol needs (``docs/maps-operations.md``).

``verify`` and ``create`` check, on every existing topic: the cleanup policy and retention the
protocol needs, ``unclean.leader.election.enable=false``, ``min.insync.replicas`` at least 2
where the log gives topics three or more copies (else at least 1), equal partition counts, and
that no topic belongs to another map. ``create`` also refuses a data topic that holds records
but has no ops topic (another program wrote it: ``init-existing`` checks and adopts it). Every
check runs before anything is created, so a refusal creates nothing.

Exit codes: 0 success; 1 ``verify`` found a missing topic or a wrong setting; 2 a usage error or
an error kafkakv raised (``error: <message>``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from kafkakv.cli.options import log_option, request_timeout_option, require_log
from kafkakv.db import Database, connect
from kafkakv.errors import TopicMismatchError
from kafkakv.map.topics import MapTopics, adopt_existing, check_topics, ensure_topics

__all__ = ["init_existing_command", "topics_group"]

EXIT_MISMATCH = 1

# The settings worth showing: what the protocol requires of each topic.
_SHOWN = (
    "cleanup.policy",
    "retention.ms",
    "retention.bytes",
    "min.insync.replicas",
    "unclean.leader.election.enable",
    "min.compaction.lag.ms",
)


@contextmanager
def _database(path: str | None, timeout: float | None) -> Iterator[Database]:
    target = require_log(path)
    options: dict[str, Any]
    if "://" not in target:
        options = {"background_cleaner": False}
    else:
        options = {} if timeout is None else {"timeout": timeout}
    with connect(target, **options) as db:
        yield db


def _describe(db: Database, topics: MapTopics) -> None:
    table = Table(title=f"map {topics.data!r}")
    table.add_column("topic")
    table.add_column("partitions", justify="right")
    for name in _SHOWN:
        table.add_column(name)
    for topic in (topics.data, topics.ops, topics.flush):
        config = db.log.topic_config(topic)
        table.add_row(topic, str(db.log.partitions(topic)), *(config.get(n, "") for n in _SHOWN))
    Console(file=sys.stdout, width=200).print(table)


@click.group("topics")
def topics_group() -> None:
    """Create or verify the three topics of a map."""


@topics_group.command("create")
@log_option()
@request_timeout_option
@click.argument("name")
@click.option(
    "--partitions",
    "-n",
    type=click.IntRange(1, 100_000),
    default=None,
    help="Partition count (default: that of existing topics, else 1).",
)
def create_command(
    path: str | None, name: str, partitions: int | None, request_timeout: float | None
) -> None:
    """Check the existing topics of map NAME, then create those missing of NAME, NAME_ops and
    NAME_flush; a refusal (exit code 2) creates nothing."""
    topics = MapTopics.for_name(name)
    with _database(path, request_timeout) as db:
        ensure_topics(db.log, topics, partitions)
        _describe(db, topics)


@topics_group.command("verify")
@log_option()
@request_timeout_option
@click.argument("name")
def verify_command(path: str | None, name: str, request_timeout: float | None) -> None:
    """Check that NAME's topics exist with the settings a map needs (min.insync.replicas
    included); exit 1 when not. Creates nothing."""
    topics = MapTopics.for_name(name)
    with _database(path, request_timeout) as db:
        missing = [t for t in (topics.data, topics.ops, topics.flush) if t not in db.log.topics()]
        if missing:
            click.echo(f"missing: {', '.join(missing)}", err=True)
            sys.exit(EXIT_MISMATCH)
        try:
            count = check_topics(db.log, topics, None, create=False).partitions
        except TopicMismatchError as exc:
            click.echo(f"wrong: {exc}", err=True)
            sys.exit(EXIT_MISMATCH)
        _describe(db, topics)
        click.echo(f"ok: map {name!r} has sound topics ({count} partitions)")


@click.command("init-existing")
@log_option()
@request_timeout_option
@click.argument("topic")
def init_existing_command(path: str | None, topic: str, request_timeout: float | None) -> None:
    """Adopt the compacted TOPIC (written by another program) as the data topic of map TOPIC.

    Refuses when the ops topic has records, when partition counts differ, when records are
    not in the partition Kafka's default partitioner would choose, or when the topic holds a
    map's flush points (its ops topic is gone). Reads every record once to check that, with a
    progress line. Opening such a topic with db.map or kafkakv map put is refused: this command
    is the one way to adopt it.
    """
    topics = MapTopics.for_name(topic)
    with (
        _database(path, request_timeout) as db,
        Progress(
            SpinnerColumn(),
            TextColumn("checking {task.fields[topic]}: {task.completed:,} records"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as progress,
    ):
        task = progress.add_task("check", topic=topic, total=None)
        report = adopt_existing(db.log, topics, lambda n: progress.update(task, completed=n))
    total = sum(report.records.values())
    click.echo(
        f"adopted {topic!r}: {total:,} records in {len(report.records)} partitions; "
        f"created {topics.ops!r} and {topics.flush!r}. Open it with db.map({topic!r})."
    )
