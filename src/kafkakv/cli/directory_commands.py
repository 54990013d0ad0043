"""``kafkakv directory ...``: load a topic as a directory, report readiness, dump or serve it.

``load`` reads the topic up to the end offsets it finds, prints how long that took and how
many keys, records and errors there were, and exits (``--dump`` prints every entry as a JSON
line). ``serve`` loads the same way, then serves the directory's Prometheus metrics on
127.0.0.1 and follows the topic until Ctrl-C or SIGTERM (``--watch`` prints each change).
Both only read: they never create a log, a topic or anything in one.

The target is ``-p/--path`` (or ``KAFKAKV_LOG``): an embedded log's directory or
``kafka://host:port,...``. ``--timeout`` bounds the whole load, connecting included: the Kafka
log's request timeout is ``--request-timeout`` (30 s by default) or ``--timeout``, whichever is
shorter, and the directory gets what is left of ``--timeout`` once connected. Exit codes: 0 success (records that failed to decode are reported,
not fatal); 2 a usage error or an error kafkakv raised (unknown topic, bad partition, a load
that timed out), shown as ``error: <message>``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import click

from kafkakv import Database, Directory, connect
from kafkakv.cli.errors import CommandError
from kafkakv.cli.map_commands import to_json_ready
from kafkakv.cli.options import (
    codec_options,
    log_option,
    request_timeout_option,
    require_log,
)
from kafkakv.metrics import serve

__all__ = ["directory_group", "parse_partitions", "ready_line"]

_WAIT_SLICE_S = 0.5
"""``serve`` wakes up this often to check for a signal and its deadline."""

_SHOWN_ERRORS = 10
"""Record errors printed after loading (all of them are counted)."""

_DEFAULT_REQUEST_TIMEOUT_S = 30.0
"""The Kafka log's timeout when ``--request-timeout`` is not given (KafkaLog's default)."""

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class _Target:
    """What the group's options say: the log, and how long a request to Kafka may take."""

    path: str | None
    request_timeout: float | None


def parse_partitions(text: str | None) -> list[int] | None:
    """``"0,2"`` → ``[0, 2]``; ``None`` → every partition.

    >>> parse_partitions("2, 0"), parse_partitions(None)
    ([2, 0], None)
    """
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a comma-separated list of partition numbers"
        ) from None


def ready_line(directory: Directory[Any, Any]) -> str:
    """What ``load`` and ``serve`` print once ready."""
    return (
        f"ready: {len(directory)} keys from {directory.records_applied} records in "
        f"{len(directory.partitions)} partitions of {directory.topic} in "
        f"{directory.ready_seconds or 0.0:.3f} s ({directory.error_count} errors)"
    )


def _json_line(doc: dict[str, object]) -> str:
    return json.dumps({k: to_json_ready(v) for k, v in doc.items()}, ensure_ascii=False)


@click.group("directory")
@log_option()
@request_timeout_option
@click.pass_context
def directory_group(ctx: click.Context, path: str | None, request_timeout: float | None) -> None:
    """Load a topic as a read-only directory: report, dump or serve it."""
    ctx.obj = _Target(path, request_timeout)


def _options(fn: _F) -> _F:
    for decorator in reversed(
        (
            codec_options(),
            click.option(
                "--partitions",
                default=None,
                metavar="P,P...",
                help="Hold only these partitions (default: all).",
            ),
            click.option(
                "--store",
                type=click.Choice(("dict", "sorted", "lmdb")),
                default="dict",
                show_default=True,
                help="Where entries live; lmdb keeps them on disk in --store-path, and a "
                "restart then reads only new records.",
            ),
            click.option(
                "--store-path",
                type=click.Path(file_okay=False),
                default=None,
                help="Directory of the lmdb store.",
            ),
            click.option(
                "--timeout",
                type=click.FloatRange(min=0, min_open=True),
                default=60.0,
                show_default=True,
                help="Seconds to wait for readiness, connecting included.",
            ),
        )
    ):
        fn = decorator(fn)
    return fn


@contextmanager
def _database(target: _Target, timeout: float) -> Iterator[Database]:
    """The database on ``target``; a Kafka log waits for its brokers at most ``timeout`` (or
    ``--request-timeout``, if shorter) per request, its connect included."""
    path = require_log(target.path)
    if path.startswith("kafka://"):
        requests = target.request_timeout or _DEFAULT_REQUEST_TIMEOUT_S
        with connect(path, timeout=min(requests, timeout)) as db:
            yield db
        return
    if not os.path.isdir(path):
        raise CommandError(f"no log at {path}: the directory does not exist")
    with connect(path, background_cleaner=False) as db:
        yield db


def _open(
    db: Database, topic: str, options: dict[str, Any], deadline: float
) -> Directory[Any, Any]:
    """Load ``topic``, ready by ``deadline`` (what connecting left of ``--timeout``)."""
    directory = db.directory(
        topic,
        key_codec=options["key_codec"],
        value_codec=options["value_codec"],
        partitions=parse_partitions(options["partitions"]),
        store=options["store"],
        store_path=options["store_path"],
        timeout=max(0.0, deadline - time.monotonic()),
    )
    click.echo(ready_line(directory), err=True)
    for error in directory.errors()[:_SHOWN_ERRORS]:
        click.echo(f"record error: {error}", err=True)
    if directory.error_count > _SHOWN_ERRORS:
        click.echo(f"... and {directory.error_count - _SHOWN_ERRORS} more", err=True)
    return directory


@directory_group.command("load")
@click.argument("topic")
@_options
@click.option("--dump", is_flag=True, help='Print every entry as a {"key", "value"} JSON line.')
@click.pass_obj
def load_command(target: _Target, /, topic: str, dump: bool, **options: Any) -> None:
    """Load TOPIC up to its end and report readiness (on stderr): keys, records, errors and
    seconds. With --dump, print the entries on stdout, one JSON object per line."""
    deadline = time.monotonic() + options["timeout"]
    with _database(target, options["timeout"]) as db:
        directory = _open(db, topic, options, deadline)
        if dump:
            for key, value in directory.items():
                click.echo(_json_line({"key": key, "value": value}))


@directory_group.command("serve")
@click.argument("topic")
@_options
@click.option("--port", type=click.IntRange(0, 65535), default=9464, show_default=True)
@click.option(
    "--addr",
    default="127.0.0.1",
    show_default=True,
    help="Address to serve metrics on (0.0.0.0 exposes them to the network).",
)
@click.option("--watch", is_flag=True, help='Print each change as a {"key", "old", "new"} line.')
@click.option(
    "--duration",
    type=click.FloatRange(min=0),
    default=None,
    help="Stop after SECONDS (default: at Ctrl-C or SIGTERM).",
)
@click.pass_obj
def serve_command(
    target: _Target,
    /,
    topic: str,
    port: int,
    addr: str,
    watch: bool,
    duration: float | None,
    **options: Any,
) -> None:
    """Load TOPIC, serve its metrics at http://ADDR:PORT/metrics and follow it until Ctrl-C or
    SIGTERM (exit code 0). Port 0 picks a free port; the line "metrics: URL" says which."""
    stop = threading.Event()
    changes: queue.SimpleQueue[dict[str, object]] = queue.SimpleQueue()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    deadline = time.monotonic() + options["timeout"]
    try:
        with _database(target, options["timeout"]) as db:
            directory = _open(db, topic, options, deadline)
            if watch:
                directory.add_listener(
                    lambda key, old, new: changes.put({"key": key, "old": old, "new": new})
                )
            with serve(port, addr) as server:
                click.echo(f"metrics: {server.url}", err=True)
                deadline = None if duration is None else time.monotonic() + duration
                while not stop.is_set():
                    if deadline is not None and time.monotonic() >= deadline:
                        break
                    try:
                        change = changes.get(timeout=_WAIT_SLICE_S)
                    except queue.Empty:
                        continue
                    click.echo(_json_line(change))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
