"""``kafkakv pipeline ingest|snapshot|reconcile``: the Spark jobs of :mod:`kafkakv.pipeline`
from the shell.

``ingest`` reads the rows of a PostgreSQL table that are new since its last run into a map or
a compacted topic (:class:`~kafkakv.pipeline.IngestJob`); ``snapshot`` writes a map's or a
topic's current entries to Parquet (ORC, JSON, Delta) files (:func:`~kafkakv.pipeline.snapshot`);
``reconcile`` compares a table with the map or topic fed from it
(:func:`~kafkakv.pipeline.reconcile`). Each command parses its options into the pipeline's
settings (:class:`~kafkakv.pipeline.SourceOptions`, :class:`~kafkakv.pipeline.TableMapping`,
:class:`~kafkakv.pipeline.PostgresConnection`), calls the job and prints what it returned;
progress goes to stderr, results to stdout.

The target is ``-p/--path`` (or ``KAFKAKV_LOG``): an embedded log's directory or
``kafka://host:port,...``, with exactly one of ``--map NAME`` and ``--topic NAME``. The table's
server is ``--postgres-url`` or ``$KAFKAKV_POSTGRES_URL``. Spark runs in the command's process
(``--master``, default ``local[2]``; starting it costs a few seconds); a session that is
already running in the process is used as it is and left running. Ctrl-C cancels the running
Spark jobs and exits; an ingest stopped so is completed by the next run, as its position moves
only after the rows are written.

``snapshot`` refuses an OUTPUT_PATH that exists unless ``--mode`` says otherwise (the API's
default, ``overwrite``, would delete whatever directory a mistyped path names).

Exit codes: 0 success (``reconcile``: also when the two differ, unless ``--fail-on-diff``);
1 ``reconcile --fail-on-diff`` found differences; 2 a usage error or an error kafkakv raised
(``error: <message>``, never a traceback); 130 stopped by Ctrl-C.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kafkakv.cli.errors import CommandError
from kafkakv.cli.options import codec_options, log_option, require_log
from kafkakv.pipeline import (
    IngestJob,
    IngestResult,
    Position,
    PostgresConnection,
    ReconcileReport,
    SnapshotResult,
    SourceOptions,
    TableMapping,
    TableSource,
    cancel_on_interrupt,
    postgres_from_env,
    reconcile,
    snapshot,
    spark_action,
    spark_session,
)
from kafkakv.pipeline.options import SPARK_CODECS
from kafkakv.pipeline.snapshot import FORMATS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "ingest_summary",
    "parse_columns",
    "pipeline_group",
    "reconcile_lines",
    "snapshot_summary",
]

EXIT_DIFFERENT = 1
EXIT_INTERRUPTED = 130

KEY_CODECS = ("str", "int")
"""Key codecs of the jobs that map table rows (ingest, reconcile)."""

_KINDS = (
    ("missing", "in the table, not in the target"),
    ("extra", "in the target, not in the table (or inactive there)"),
    ("different", "on both sides with different values"),
)

_MODES = ("error", "overwrite", "append")

_F = TypeVar("_F", bound=Callable[..., Any])


# -- pure parsing and formatting -------------------------------------------------------------


def parse_columns(text: str | None) -> tuple[str, ...] | None:
    """``"a, b,c"`` → ``("a", "b", "c")``; ``None`` → every column.

    >>> parse_columns("terminal_id, acquirer"), parse_columns(None)
    (('terminal_id', 'acquirer'), None)
    """
    if text is None:
        return None
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise click.BadParameter("name at least one column", param_hint="'--columns'")
    return names


def _position_text(position: Position | None) -> str:
    return "the start" if position is None else f"{position.timestamp} / {position.id}"


def ingest_summary(result: IngestResult, table: str, target: str) -> str:
    """The line ``ingest`` prints once the job is done.

    >>> p = Position("2026-01-02 03:04:05+00", 7)
    >>> print(ingest_summary(IngestResult("j", 3, 1, None, p, 1.5), "t", "map 'm'"))
    ingested 3 rows (1 deletes) from t into map 'm': position the start -> 2026-01-02 03:04:05+00 / 7 (1.50 s)
    >>> print(ingest_summary(IngestResult("j", 0, 0, p, p, 0.25), "t", "map 'm'"))
    no new rows in t: nothing written to map 'm'; position stays at 2026-01-02 03:04:05+00 / 7 (0.25 s)
    """
    if result.rows == 0:
        return (
            f"no new rows in {table}: nothing written to {target}; position stays at "
            f"{_position_text(result.after)} ({result.seconds:.2f} s)"
        )
    return (
        f"ingested {result.rows} rows ({result.deletes} deletes) from {table} into {target}: "
        f"position {_position_text(result.before)} -> {_position_text(result.after)} "
        f"({result.seconds:.2f} s)"
    )


def snapshot_summary(result: SnapshotResult, target: str, *, appended: bool) -> str:
    """The line ``snapshot`` prints (after an append, the count covers every file there).

    >>> print(snapshot_summary(SnapshotResult("/s", "parquet", 5, 2.0), "map 'm'", appended=False))
    wrote 5 rows of map 'm' to /s (parquet) in 2.00 s
    """
    if appended:
        return (
            f"appended a snapshot of {target} to {result.path} ({result.format}), which now "
            f"holds {result.rows} rows, in {result.seconds:.2f} s"
        )
    return (
        f"wrote {result.rows} rows of {target} to {result.path} ({result.format}) "
        f"in {result.seconds:.2f} s"
    )


def reconcile_lines(report: ReconcileReport, table: str, target: str) -> list[str]:
    """What ``reconcile`` prints: the summary, then each kind of difference with its count
    and sample keys (one per line, indented).

    >>> r = ReconcileReport(2, 2, 0, 0, 1, {"different": ["k1"]}, 0.5)
    >>> print("\\n".join(reconcile_lines(r, "t", "map 'm'")))
    t vs map 'm': 2 active rows, 2 keys: they differ (0 missing, 0 extra, 1 different) in 0.50 s
    different: 1 key on both sides with different values
      k1
    """
    lines = [f"{table} vs {target}: {report.summary()} in {report.seconds:.2f} s"]
    for kind, meaning in _KINDS:
        count = getattr(report, kind)
        if not count:
            continue
        lines.append(f"{kind}: {count} key{'' if count == 1 else 's'} {meaning}")
        keys = report.samples.get(kind, [])
        lines.extend(f"  {key}" for key in keys)
        if count > len(keys):
            lines.append(f"  ... and {count - len(keys)} more")
    return lines


def _report_json(report: ReconcileReport, table: str, target: str) -> dict[str, Any]:
    return {"table": table, "target": target, "matches": report.matches, **asdict(report)}


# -- options ---------------------------------------------------------------------------------


def _apply(fn: _F, decorators: Sequence[Callable[[Any], Any]]) -> _F:
    for decorator in reversed(decorators):
        fn = decorator(fn)
    return fn


def _target_options(*, any_codec: bool) -> Callable[[_F], _F]:
    """``--map``/``--topic``/``--topics`` and the codecs: every codec the data source carries
    when ``any_codec`` (snapshot), else str or int keys and JSON values (jobs that map rows)."""
    options = [
        click.option("--map", "map_name", metavar="NAME", help="A replicated map."),
        click.option(
            "--topic", metavar="NAME", help="A plain compacted topic (a directory's topic)."
        ),
        click.option(
            "--topics",
            metavar="BASE",
            help="The topic set the map shares with other maps (default: the map's own).",
        ),
        codec_options(keys=SPARK_CODECS, values=SPARK_CODECS)
        if any_codec
        else codec_options(keys=KEY_CODECS, values=None),
    ]

    def decorate(fn: _F) -> _F:
        return _apply(fn, options)

    return decorate


_SPARK_OPTIONS = (
    click.option(
        "--master",
        default="local[2]",
        show_default=True,
        metavar="URL",
        help="Spark master to run the job on.",
    ),
    click.option(
        "--jar",
        "jars",
        multiple=True,
        type=click.Path(dir_okay=False),
        help="A jar for Spark's class path (repeatable). Default for ingest and reconcile: the "
        "PostgreSQL JDBC driver, fetched with Maven on first use and cached.",
    ),
)

_TABLE_OPTIONS = (
    click.option(
        "--table",
        required=True,
        metavar="NAME",
        help="The PostgreSQL table (or schema.table) to read.",
    ),
    click.option(
        "--key", "key_column", required=True, metavar="COL", help="Its unique key column."
    ),
    click.option(
        "--postgres-url",
        metavar="URL",
        default=None,
        help="postgresql://user:password@host:port/database (default: $KAFKAKV_POSTGRES_URL, "
        "which keeps the password off the command line).",
    ),
)

_MAPPING_OPTIONS = (
    click.option(
        "--active-column",
        metavar="COL",
        default=None,
        help="A boolean column: a row where it is false deletes its key.",
    ),
    click.option("--camel-case", is_flag=True, help="Name value members in camelCase."),
    click.option(
        "--columns",
        metavar="A,B,...",
        default=None,
        help="The columns in each value (default: all of them).",
    ),
    click.option(
        "--timestamp-format",
        default=TableMapping.timestamp_format,
        show_default=True,
        metavar="PATTERN",
        help="Spark datetime pattern of timestamp columns (in UTC).",
    ),
    click.option(
        "--date-format",
        default=TableMapping.date_format,
        show_default=True,
        metavar="PATTERN",
        help="Spark datetime pattern of date columns.",
    ),
)


def _spark_options(fn: _F) -> _F:
    """``--master`` and ``--jar``."""
    return _apply(fn, _SPARK_OPTIONS)


def _table_options(fn: _F) -> _F:
    """``--table``, ``--key`` and ``--postgres-url``."""
    return _apply(fn, _TABLE_OPTIONS)


def _mapping_options(fn: _F) -> _F:
    """How rows map to values: ``--active-column``, ``--columns``, ``--camel-case``..."""
    return _apply(fn, _MAPPING_OPTIONS)


# -- building the job's settings -------------------------------------------------------------


def _progress(line: str) -> None:
    click.echo(line, err=True)


def _target(
    path: str | None,
    map_name: str | None,
    topic: str | None,
    topics: str | None,
    key_codec: str,
    value_codec: str = "json",
    *,
    must_exist: bool,
) -> SourceOptions:
    ctx = click.get_current_context(silent=True)
    path = require_log(path)
    if (map_name is None) == (topic is None):
        raise click.UsageError("give exactly one of --map NAME and --topic NAME", ctx=ctx)
    if topics is not None and map_name is None:
        raise click.UsageError("--topics (a shared topic set) applies to --map only", ctx=ctx)
    if "://" not in path:
        if must_exist and not os.path.isdir(path):
            raise CommandError(f"no log at {path}: the directory does not exist")
        path = os.path.abspath(path)  # Spark's Python workers open it too
    return SourceOptions(
        target=path,
        map=map_name,
        topic=topic,
        topics=topics,
        key_codec=key_codec,
        value_codec=value_codec,
    )


def _postgres(url: str | None) -> PostgresConnection:
    connection = PostgresConnection.from_url(url) if url else postgres_from_env()
    if connection is None:
        raise click.UsageError(
            "no PostgreSQL server: pass --postgres-url postgresql://user:password@host:port/db "
            "or set KAFKAKV_POSTGRES_URL",
            ctx=click.get_current_context(silent=True),
        )
    return connection


def _mapping(options: dict[str, Any]) -> TableMapping:
    return TableMapping(
        key=options["key_column"],
        columns=parse_columns(options["columns"]),
        camel_case=options["camel_case"],
        timestamp_format=options["timestamp_format"],
        date_format=options["date_format"],
        active_column=options["active_column"],
    )


def _active_session() -> SparkSession | None:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None  # spark_session() explains what to install
    return SparkSession.getActiveSession()


def _interrupted() -> click.exceptions.Exit:
    click.echo("interrupted", err=True)
    return click.exceptions.Exit(EXIT_INTERRUPTED)


@contextmanager
def _spark(master: str, jars: Sequence[str], *, jdbc: bool) -> Iterator[SparkSession]:
    """The Spark session for one command: the running one if there is one (left running),
    else a new one, stopped on the way out. ``jdbc``: put the PostgreSQL driver on the class
    path when no ``--jar`` is given.

    Ctrl-C (before or while the jobs run) ends the command with exit code 130, whether the
    job then fails (cancelled: :func:`~kafkakv.pipeline.cancel_on_interrupt`) or had already
    finished."""
    from kafkakv.pipeline.jdbc_driver import postgres_jdbc_jar

    try:
        running = _active_session()
        paths: list[str | os.PathLike[str]] = list(jars)
        if jdbc and not paths:
            paths.append(postgres_jdbc_jar(progress=_progress))
        if running is None:
            _progress(f"starting Spark ({master})")
        spark: SparkSession = spark_action(
            lambda: spark_session(master=master, jars=paths), "starting"
        )
    except KeyboardInterrupt:
        raise _interrupted() from None
    try:
        with cancel_on_interrupt(spark, progress=_progress):
            yield spark
    except KeyboardInterrupt:
        raise _interrupted() from None
    finally:
        if running is None:
            spark.stop()


# -- the commands ----------------------------------------------------------------------------


@click.group("pipeline")
@log_option()
@click.pass_context
def pipeline_group(ctx: click.Context, path: str | None) -> None:
    """Spark jobs between PostgreSQL tables and maps or topics: ingest, snapshot, reconcile.

    The target is -p/--path with exactly one of --map NAME and --topic NAME. Progress goes to
    stderr, results to stdout.

    \b
    Exit codes:
      0    success (reconcile: also when they differ, without --fail-on-diff)
      1    reconcile --fail-on-diff found differences
      2    a usage error or an error kafkakv raised (error: <message>)
      130  stopped by Ctrl-C
    """
    ctx.obj = path


@pipeline_group.command("ingest")
@_target_options(any_codec=False)
@_table_options
@click.option(
    "--timestamp-column",
    required=True,
    metavar="COL",
    help="The column that orders the rows (a timestamp set on insert and update).",
)
@click.option(
    "--id-column", required=True, metavar="COL", help="The column that breaks timestamp ties."
)
@_mapping_options
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    default=0.0,
    show_default=True,
    help="Seconds a row must be old before it is read (lets open transactions commit).",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    metavar="N",
    default=None,
    help="Partitions of the target's topics when this run creates them.",
)
@click.option(
    "--job", default=None, metavar="NAME", help="The job's name, which keys its position."
)
@_spark_options
@click.pass_obj
def ingest_command(
    path: str | None,
    /,
    map_name: str | None,
    topic: str | None,
    topics: str | None,
    key_codec: str,
    timestamp_column: str,
    id_column: str,
    delay: float,
    partitions: int | None,
    job: str | None,
    master: str,
    jars: tuple[str, ...],
    **options: Any,
) -> None:
    """Ingest the rows of --table that are new since the last run (by --timestamp-column,
    then --id-column) into the map or topic; rows where --active-column is false delete their
    key. A missing map or topic is created (a topic compacted).

    The job's position is kept on the target log itself (map kafkakv-ingest, key --job,
    default "TABLE -> map 'NAME'"): a run that finds nothing new writes nothing."""
    target = _target(path, map_name, topic, topics, key_codec, must_exist=False)
    source = TableSource(_postgres(options["postgres_url"]), options["table"])
    mapping = _mapping(options)
    with _spark(master, jars, jdbc=True) as spark:
        ingest = IngestJob(
            spark,
            source,
            target,
            mapping,
            timestamp_column=timestamp_column,
            id_column=id_column,
            delay=delay,
            partitions=partitions,
            name=job,
            progress=_progress,
        )
        result: IngestResult = spark_action(ingest.run, f"ingesting {source.table}")
    click.echo(ingest_summary(result, source.table, target.what))


@pipeline_group.command("snapshot")
@click.argument("output_path", type=click.Path(dir_okay=True, file_okay=False))
@_target_options(any_codec=True)
@click.option(
    "--format",
    "file_format",
    type=click.Choice(FORMATS),
    default="parquet",
    show_default=True,
    help="File format (delta needs the delta-spark package on the session).",
)
@click.option(
    "--mode",
    type=click.Choice(_MODES),
    default="error",
    show_default=True,
    help="When OUTPUT_PATH exists: fail, overwrite it (replacing everything in it) or add "
    "the snapshot's files to it.",
)
@_spark_options
@click.pass_obj
def snapshot_command(
    path: str | None,
    /,
    output_path: str,
    map_name: str | None,
    topic: str | None,
    topics: str | None,
    key_codec: str,
    value_codec: str,
    file_format: str,
    mode: str,
    master: str,
    jars: tuple[str, ...],
) -> None:
    """Write the map's or topic's current entries (columns key, value, partition, offset) to
    files at OUTPUT_PATH, and print how many rows they hold. Reads only: a missing map or
    topic is an error."""
    target = _target(path, map_name, topic, topics, key_codec, value_codec, must_exist=True)
    with _spark(master, jars, jdbc=False) as spark:
        result = spark_action(
            lambda: snapshot(
                spark, target, output_path, file_format=file_format, mode=mode, progress=_progress
            ),
            f"writing the snapshot of {target.what}",
        )
    click.echo(snapshot_summary(result, target.what, appended=mode == "append"))


@pipeline_group.command("reconcile")
@_target_options(any_codec=False)
@_table_options
@_mapping_options
@click.option(
    "--samples",
    type=click.IntRange(min=0),
    metavar="N",
    default=10,
    show_default=True,
    help="Keys shown of each kind of difference.",
)
@click.option(
    "--fail-on-diff", is_flag=True, help="Exit with code 1 when the table and target differ."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@_spark_options
@click.pass_obj
def reconcile_command(
    path: str | None,
    /,
    map_name: str | None,
    topic: str | None,
    topics: str | None,
    key_codec: str,
    samples: int,
    fail_on_diff: bool,
    as_json: bool,
    master: str,
    jars: tuple[str, ...],
    **options: Any,
) -> None:
    """Compare the active rows of --table, mapped as ingest maps them, with the map's or
    topic's entries: keys missing from the target, extra in it, or with different values.
    Values compare as JSON objects (member order and number spelling do not count)."""
    target = _target(path, map_name, topic, topics, key_codec, must_exist=True)
    source = TableSource(_postgres(options["postgres_url"]), options["table"])
    mapping = _mapping(options)
    with _spark(master, jars, jdbc=True) as spark:
        report: ReconcileReport = spark_action(
            lambda: reconcile(spark, source, mapping, target, samples=samples, progress=_progress),
            f"reconciling {source.table} with {target.what}",
        )
    if as_json:
        click.echo(json.dumps(_report_json(report, source.table, target.what)))
    else:
        for line in reconcile_lines(report, source.table, target.what):
            click.echo(line)
    if fail_on_diff and not report.matches:
        raise click.exceptions.Exit(EXIT_DIFFERENT)
