"""``kafkakv log ...``: inspect and maintain an embedded log from the shell.

Every command parses its arguments, calls the public :class:`~kafkakv.log.EmbeddedLog` API and
prints the answer; nothing here knows more about the log than that API tells it.

The log directory comes from ``--path/-p`` or the ``KAFKAKV_LOG`` environment variable. A
bare ``host:port`` there (no ``kafka://``) that is not an existing directory is refused with
a hint, never created as a directory (:func:`kafkakv.db.check_target`). Every command opens
the log with the background cleaner off and closes it before exiting.

Exit codes: 0 success; 1 ``check`` found problems; 2 a usage error or an error kafkakv raised on
purpose (:class:`~kafkakv.errors.KafkaKVError`, printed as ``error: <message>``, never as a
traceback); 130 ``tail`` stopped by Ctrl-C.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import click
from rich.console import Console
from rich.table import Table

from kafkakv.cli.errors import CommandError
from kafkakv.cli.options import log_option, require_log
from kafkakv.db import check_target
from kafkakv.errors import LogError
from kafkakv.log import CleanResult, EmbeddedLog, Record
from kafkakv.log.follow import Follower

__all__ = [
    "bytes_to_json",
    "bytes_to_text",
    "log_group",
    "parse_config_pairs",
    "record_to_json",
    "record_to_text",
    "timestamp_to_text",
]

_READ_BATCH = 500
"""Records asked for per ``read`` call."""

EXIT_PROBLEMS = 1
EXIT_INTERRUPTED = 130


# -- pure formatting ------------------------------------------------------------------------


def bytes_to_json(data: bytes | None) -> str | dict[str, str] | None:
    """``data`` for a JSON document: UTF-8 text when it decodes, else ``{"base64": ...}``.

    >>> bytes_to_json(b"hi"), bytes_to_json(b"\\xff"), bytes_to_json(None)
    ('hi', {'base64': '/w=='}, None)
    """
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def bytes_to_text(data: bytes | None) -> str:
    """``data`` for a line of text: a quoted, escaped string when UTF-8, else a bytes literal.

    >>> print(bytes_to_text(b"a\\nb"), bytes_to_text(b"\\xff"), bytes_to_text(None))
    'a\\nb' b'\\xff' null
    """
    if data is None:
        return "null"
    try:
        return repr(data.decode("utf-8"))
    except UnicodeDecodeError:
        return repr(data)


def timestamp_to_text(ms: int | None) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC; the bare number when out of range.

    >>> timestamp_to_text(0)
    '1970-01-01T00:00:00.000Z'
    """
    if ms is None:
        return "null"
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record_to_json(record: Record) -> dict[str, object]:
    """One record as a JSON-ready dict (key, value and header values through bytes_to_json)."""
    return {
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": bytes_to_json(record.key),
        "value": bytes_to_json(record.value),
        "headers": [[name, bytes_to_json(value)] for name, value in record.headers],
    }


def record_to_text(record: Record) -> str:
    """One record as one line of text."""
    line = (
        f"partition={record.partition} offset={record.offset} "
        f"timestamp={timestamp_to_text(record.timestamp)} "
        f"key={bytes_to_text(record.key)} value={bytes_to_text(record.value)}"
    )
    if record.headers:
        shown = ", ".join(f"{name}={bytes_to_text(value)}" for name, value in record.headers)
        line += f" headers=[{shown}]"
    return line


def parse_config_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["name=value", ...]`` as a dict; the values stay strings for the log to validate.

    Raises :class:`click.BadParameter` for an entry without ``=``, an empty name, or a name
    given twice.

    >>> parse_config_pairs(["cleanup.policy=compact", "retention.ms=-1"])
    {'cleanup.policy': 'compact', 'retention.ms': '-1'}
    """
    config: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not name=value", param_hint="'--config'")
        if name in config:
            raise click.BadParameter(f"{name!r} is given twice", param_hint="'--config'")
        config[name] = value
    return config


def _last_offset(batch: Sequence[Record]) -> int:
    offset = batch[-1].offset
    if offset is None:
        raise LogError("the log returned a record without an offset")
    return offset


# -- the log group --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogTarget:
    """Where the ``log`` commands find their log."""

    path: str | None

    def open(self, *, create: bool = False) -> EmbeddedLog:
        """Open the log; a missing directory is an error unless ``create``."""
        path = require_log(self.path, kafka=False)
        if path.startswith("kafka://"):
            raise CommandError(f"{path}: the log commands work on an embedded log directory")
        check_target(path)  # host:port without kafka:// is refused, not made a directory
        if not create and not os.path.isdir(path):
            raise CommandError(f"no log at {path}: the directory does not exist")
        return EmbeddedLog(path, background_cleaner=False)


pass_target = click.make_pass_decorator(LogTarget)


@click.group("log")
@log_option(kafka=False)
@click.pass_context
def log_group(ctx: click.Context, path: str | None) -> None:
    """Inspect and maintain an embedded log."""
    ctx.obj = LogTarget(path)


_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")

_format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: one readable line per record; json: one JSON object per line.",
)


def _emit(record: Record, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(record_to_json(record), ensure_ascii=False))
    else:
        click.echo(record_to_text(record))


def _partitions(log: EmbeddedLog, topic: str, partition: int | None) -> list[int]:
    if partition is None:
        return list(range(log.partitions(topic)))
    log.end_offset(topic, partition)  # raises UnknownTopicError / UnknownPartitionError
    return [partition]


@log_group.command("topics")
@_json_option
@pass_target
def topics_command(target: LogTarget, as_json: bool) -> None:
    """List the topics, one per line."""
    with target.open() as log:
        names = log.topics()
    if as_json:
        click.echo(json.dumps(names))
    else:
        for name in names:
            click.echo(name)


@log_group.command("create")
@click.argument("topic")
@click.option("--partitions", type=int, default=1, show_default=True, help="Partition count.")
@click.option(
    "--config",
    "pairs",
    multiple=True,
    metavar="NAME=VALUE",
    help="A topic config entry with Kafka's name, e.g. cleanup.policy=compact. Repeatable.",
)
@pass_target
def create_command(target: LogTarget, topic: str, partitions: int, pairs: tuple[str, ...]) -> None:
    """Create TOPIC (and the log directory if it does not exist)."""
    config = parse_config_pairs(pairs)
    with target.open(create=True) as log:
        log.create_topic(topic, partitions, config)
    click.echo(f"created topic {topic} with {partitions} partition(s)")


@log_group.command("describe")
@click.argument("topic")
@_json_option
@pass_target
def describe_command(target: LogTarget, topic: str, as_json: bool) -> None:
    """Show TOPIC's partitions (offsets, record estimate, bytes of data) and its config."""
    with target.open() as log:
        config = log.topic_config(topic)
        rows: list[dict[str, int]] = []
        for p in range(log.partitions(topic)):
            start, end = log.start_offset(topic, p), log.end_offset(topic, p)
            rows.append(
                {
                    "partition": p,
                    "start_offset": start,
                    "end_offset": end,
                    "records": end - start,
                    "size_bytes": log.data_bytes(topic, p),
                }
            )
    if as_json:
        doc = {"topic": topic, "partitions": rows, "config": config}
        click.echo(json.dumps(doc, indent=2))
        return
    console = Console(highlight=False)
    parts = Table(title=f"topic {topic}: {len(rows)} partition(s)", title_justify="left")
    for heading in ("partition", "start offset", "end offset", "records (est.)", "bytes"):
        parts.add_column(heading, justify="right")
    for row in rows:
        parts.add_row(*(str(v) for v in row.values()))
    console.print(parts)
    settings = Table(title="config", title_justify="left")
    settings.add_column("name")
    settings.add_column("value")
    for name, value in sorted(config.items()):
        settings.add_row(name, value)
    console.print(settings)


@log_group.command("dump")
@click.argument("topic")
@click.option("--partition", type=int, default=None, help="Only this partition (default: all).")
@click.option(
    "--from",
    "from_offset",
    type=click.IntRange(min=0),
    default=None,
    help="First offset to print, in every partition dumped (default: the start of the log).",
)
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Print at most N.")
@_format_option
@pass_target
def dump_command(
    target: LogTarget,
    topic: str,
    partition: int | None,
    from_offset: int | None,
    limit: int | None,
    fmt: str,
) -> None:
    """Print TOPIC's records as they are when the dump starts, partition by partition."""
    with target.open() as log:
        remaining = limit
        for p in _partitions(log, topic, partition):
            offset = log.start_offset(topic, p) if from_offset is None else from_offset
            end = log.end_offset(topic, p)
            for record in _read_range(log, topic, p, offset, end, remaining):
                _emit(record, fmt)
                if remaining is not None:
                    remaining -= 1
            if remaining == 0:
                break


def _read_range(
    log: EmbeddedLog, topic: str, partition: int, offset: int, end: int, limit: int | None
) -> Iterator[Record]:
    """Records of ``offset .. end - 1``, at most ``limit`` of them."""
    count = 0
    while offset < end and (limit is None or count < limit):
        want = _READ_BATCH if limit is None else min(_READ_BATCH, limit - count)
        batch = log.read(topic, partition, offset, max_records=want)
        if not batch:
            return
        for record in batch:
            if record.offset is not None and record.offset >= end:
                return
            yield record
            count += 1
        offset = _last_offset(batch) + 1


@log_group.command("tail")
@click.argument("topic")
@click.option("--partition", type=int, default=None, help="Only this partition (default: all).")
@click.option(
    "--from-end/--from-beginning",
    default=True,
    help="Start after the last record (default) or at the start of the log.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Stop after SECONDS with nothing new (default: never).",
)
@click.option(
    "--max", "max_records", type=click.IntRange(min=1), default=None, help="Stop after N."
)
@_format_option
@pass_target
def tail_command(
    target: LogTarget,
    topic: str,
    partition: int | None,
    from_end: bool,
    timeout: float | None,
    max_records: int | None,
    fmt: str,
) -> None:
    """Print TOPIC's records as they arrive. Ctrl-C stops it (exit code 130)."""
    try:
        with target.open() as log:
            _follow(log, topic, partition, from_end, timeout, max_records, fmt)
    except KeyboardInterrupt:
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None


def _follow(
    log: EmbeddedLog,
    topic: str,
    partition: int | None,
    from_end: bool,
    timeout: float | None,
    max_records: int | None,
    fmt: str,
) -> None:
    parts = _partitions(log, topic, partition)
    where = log.end_offset if from_end else log.start_offset
    offsets = {p: where(topic, p) for p in parts}
    printed = 0

    def positions() -> dict[tuple[str, int], int]:
        return {(topic, p): offset for p, offset in offsets.items()}

    def done() -> bool:
        return max_records is not None and printed >= max_records

    def print_ready(ready: Sequence[tuple[str, int]]) -> bool:
        nonlocal printed
        arrived = False
        for _, p in sorted(ready):
            end = log.end_offset(topic, p)
            want = _READ_BATCH if max_records is None else min(_READ_BATCH, max_records - printed)
            batch = log.read(topic, p, offsets[p], max_records=want)
            if not batch:
                # Whatever lies below ``end`` was published before this read and is not
                # readable (removed by the cleaner): wait past it, not on it.
                offsets[p] = max(offsets[p], end)
                continue
            arrived = True
            for record in batch:
                _emit(record, fmt)
            printed += len(batch)
            offsets[p] = _last_offset(batch) + 1
            if done():
                break
        return arrived

    # What is there already first, then whatever arrives.
    if print_ready([(topic, p) for p in parts]) and done():
        return
    Follower(log, f"tail of {topic}").run(positions, print_ready, done, idle_timeout=timeout)


def _clean_result_json(partition: int, result: CleanResult) -> dict[str, int]:
    return {
        "partition": partition,
        "segments_in": result.segments_in,
        "segments_out": result.segments_out,
        "records_in": result.records_in,
        "records_out": result.records_out,
        "bytes_in": result.bytes_in,
        "bytes_out": result.bytes_out,
    }


@log_group.command("compact")
@click.argument("topic")
@click.option("--partition", type=int, default=None, help="Only this partition (default: all).")
@_json_option
@pass_target
def compact_command(target: LogTarget, topic: str, partition: int | None, as_json: bool) -> None:
    """Compact TOPIC now (it must have cleanup.policy=compact) and print what it did."""
    with target.open() as log:
        numbers = _partitions(log, topic, partition)
        results = log.compact(topic, partition)
    docs = [_clean_result_json(p, r) for p, r in zip(numbers, results, strict=True)]
    if as_json:
        click.echo(json.dumps(docs, indent=2))
        return
    for doc in docs:
        click.echo(
            f"partition {doc['partition']}: "
            f"segments {doc['segments_in']} -> {doc['segments_out']}, "
            f"records {doc['records_in']} -> {doc['records_out']}, "
            f"bytes {doc['bytes_in']} -> {doc['bytes_out']}"
        )


@log_group.command("check")
@pass_target
def check_command(target: LogTarget) -> None:
    """Verify every segment and index; exit code 1 when a problem is found."""
    with target.open() as log:
        problems = log.check()
        count = len(log.topics())
    if problems:
        for problem in problems:
            click.echo(str(problem))
        click.echo(f"{len(problems)} problem(s) found", err=True)
        raise click.exceptions.Exit(EXIT_PROBLEMS)
    click.echo(f"ok: {count} topics, no problems")
