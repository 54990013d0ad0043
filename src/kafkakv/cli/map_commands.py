"""``kafkakv map ...``: read, write and watch a replicated map from the shell.

Every command parses its arguments, opens the map through :func:`kafkakv.connect` and
:meth:`kafkakv.Database.map`, calls the :class:`~kafkakv.ReplicaMap` API and prints the answer.
Only ``put`` creates: the log directory and the map's topics (one partition) when missing, as
``db.map`` does; and ``restore`` (with the backup's partition count). ``get``, ``del``, ``dump``,
``watch`` and ``backup`` open the map with ``create=False``: on a map that does not exist they
print ``error: there is no map ...`` (exit code 2) and create nothing. Whatever the command,
existing topics are checked before anything is created.

KEY and VALUE arguments become objects of their codec: ``str`` keeps the text, ``bytes`` takes
its UTF-8 bytes, ``int`` reads an integer, ``json`` and ``msgpack`` read a JSON document
(``42``, ``"text"``, ``{"a": 1}``). Text that does not parse is an error (exit code 2). An
argument that starts with ``-`` (``-1``) goes after ``--``, as usual for click commands.

Values are printed as JSON when they can be, else as their Python ``repr`` (bytes, for
instance); ``dump`` and ``watch`` print one JSON object per line, with such values as the
string of their ``repr``.

A put or del refuses a KEY whose current value does not decode with ``--value-codec`` (the map
was written with another codec): nothing is written, and ``--force`` writes anyway. When the
value replaced or removed does not decode all the same, the update stands; its bytes are
printed on stderr after ``warning:`` (exit code 0), so nothing is lost.

Exit codes: 0 success; 1 ``get`` or ``del`` of an absent key; 2 a usage error or an error kafkakv
raised (``error: <message>``, never a traceback), a map that does not exist included: a
mistyped map name is an error, not an absent key.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

from kafkakv import Database, ReplicaMap, connect
from kafkakv.cli.errors import CommandError
from kafkakv.cli.options import (
    codec_options,
    log_option,
    request_timeout_option,
    require_log,
)
from kafkakv.codecs import JsonCodec
from kafkakv.db import check_target
from kafkakv.errors import DecodeError, ResultDecodeError
from kafkakv.map import Change, ChangeFeed
from kafkakv.map.backup import Progress, backup, restore

__all__ = ["map_group", "parse_arg", "to_json", "to_json_ready"]

EXIT_ABSENT = 1

_WAIT_SLICE_S = 0.5
"""``watch`` wakes up this often to check its deadline (and Ctrl-C)."""


# -- pure conversions ---------------------------------------------------------------------


def parse_arg(text: str, codec: str, what: str) -> Any:
    """The object that command-line ``text`` stands for under ``codec`` (see the module doc).

    Raises ``ValueError`` naming ``what`` when the text does not parse.

    >>> parse_arg("7", "int", "KEY"), parse_arg('{"a": [1]}', "json", "VALUE")
    (7, {'a': [1]})
    >>> parse_arg("7", "str", "KEY"), parse_arg("é", "bytes", "KEY")
    ('7', b'\\xc3\\xa9')
    """
    if codec == "str":
        return text
    if codec == "bytes":
        return text.encode("utf-8", errors="surrogateescape")
    if codec == "int":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{what} {text!r} is not an integer (the int codec)") from None
    try:
        return JsonCodec().decode(text.encode("utf-8", errors="surrogateescape"))
    except DecodeError as exc:
        raise ValueError(f"{what} {text!r} is not JSON (the {codec} codec): {exc}") from exc


def _parse(text: str, codec: str, what: str) -> Any:
    try:
        return parse_arg(text, codec, what)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc


def to_json(obj: object) -> str:
    """``obj`` as JSON text, or its ``repr`` when JSON cannot hold it.

    >>> print(to_json({"a": [1, "x"]}), to_json(b"\\x00"))
    {"a": [1, "x"]} b'\\x00'
    """
    try:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return repr(obj)


def to_json_ready(obj: object) -> object:
    """``obj`` when JSON can hold it, else the string of its ``repr`` (for JSON lines).

    >>> to_json_ready([1, 2]), to_json_ready(b"hi")
    ([1, 2], "b'hi'")
    """
    try:
        json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError):
        return repr(obj)
    return obj


def _line(doc: dict[str, object]) -> str:
    return json.dumps({k: to_json_ready(v) for k, v in doc.items()}, ensure_ascii=False)


# -- the map group ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MapTarget:
    """Where the ``map`` commands find their log."""

    path: str | None
    timeout: float | None = None
    """--request-timeout: for the Kafka log and the map's updates; None: their defaults."""

    @contextmanager
    def open(
        self, name: str, key_codec: str, value_codec: str, *, create: bool = False, **more: Any
    ) -> Iterator[ReplicaMap[Any, Any]]:
        """Connect, open map ``name`` and close both after.

        Only with ``create`` are a missing log directory and missing topics created; without
        it they are errors (:class:`~kafkakv.errors.UnknownMapError` for the topics)."""
        path = require_log(self.path)
        check_target(path)  # host:port without kafka:// is refused, not made a directory
        waits: dict[str, Any] = {} if self.timeout is None else {"timeout": self.timeout}
        options = {
            "key_codec": key_codec,
            "value_codec": value_codec,
            "create": create,
            **waits,
            **more,
        }
        if path.startswith("kafka://"):
            with connect(path, **waits) as db:
                yield db.map(name, **options)
            return
        if not create and not os.path.isdir(path):
            raise CommandError(f"no log at {path}: the directory does not exist")
        with connect(path, background_cleaner=False) as db:
            yield db.map(name, **options)


pass_target = click.make_pass_decorator(MapTarget)


@click.group("map")
@log_option()
@request_timeout_option
@click.pass_context
def map_group(ctx: click.Context, path: str | None, request_timeout: float | None) -> None:
    """Read, write, watch, back up and restore a replicated map.

    Only put and restore create the map NAME (and the log directory) when missing; get, del,
    dump, watch and backup on a map that does not exist fail with exit code 2 and create
    nothing. KEY and VALUE are given as JSON under the json and msgpack codecs.
    """
    ctx.obj = MapTarget(path, request_timeout)


_force_option = click.option(
    "--force",
    is_flag=True,
    help="Write even when KEY's current value does not decode with --value-codec.",
)


def _check_current(m: ReplicaMap[Any, Any], name: str, key: object, codec: str) -> None:
    """Refuse, before anything is written, a key whose value does not decode with ``codec``:
    the map was likely written with another codec, and the update would mix two."""
    try:
        m.get(key)
    except DecodeError as exc:
        raise CommandError(
            f"the value of key {key!r} in map {name!r} does not decode with the {codec} "
            f"codec ({exc}); was the map written with another --value-codec? Nothing was "
            "written; --force writes anyway"
        ) from exc


def _show_undecoded(exc: ResultDecodeError) -> None:
    click.echo(f"warning: {exc}; its bytes: {exc.raw!r}", err=True)


def _absent(name: str, key: object) -> click.exceptions.Exit:
    click.echo(f"key {key!r} is not in map {name!r}", err=True)
    return click.exceptions.Exit(EXIT_ABSENT)


@map_group.command("get")
@click.argument("name")
@click.argument("key")
@codec_options()
@click.option(
    "--linearizable",
    is_flag=True,
    help="Sync first: see every update completed anywhere before the call.",
)
@click.option(
    "--meta",
    is_flag=True,
    help='Print {"value": ...} with the key\'s "version" and "ttl" (seconds left, null: none) '
    "when the map has versions or expiry.",
)
@pass_target
def get_command(
    target: MapTarget,
    name: str,
    key: str,
    key_codec: str,
    value_codec: str,
    linearizable: bool,
    meta: bool,
) -> None:
    """Print KEY's value as JSON; exit code 1 when absent.

    A map that does not exist is an error (exit code 2); nothing is created.
    """
    k = _parse(key, key_codec, "KEY")
    doc: dict[str, object] = {}
    with target.open(name, key_codec, value_codec) as m:
        if linearizable:
            m.sync()
        value = m.get(k)
        if meta and value is not None:
            options = m.creation_options
            if options["versions"]:
                found = m.get_versioned(k)
                doc["version"] = None if found is None else found[1]
            if options["expiry"]:
                doc["ttl"] = m.ttl(k) if k in m else None
    if value is None:
        raise _absent(name, k)
    click.echo(_line({"value": value, **doc}) if meta else to_json(value))


@map_group.command("put")
@click.argument("name")
@click.argument("key")
@click.argument("value")
@codec_options()
@click.option(
    "--if-absent",
    is_flag=True,
    help="Set only if KEY is absent; prints the value it already had (nothing: it was set).",
)
@click.option(
    "--ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="KEY expires after SECONDS (a map created with expiry; a new map is created so).",
)
@_force_option
@pass_target
def put_command(
    target: MapTarget,
    name: str,
    key: str,
    value: str,
    key_codec: str,
    value_codec: str,
    if_absent: bool,
    ttl: float | None,
    force: bool,
) -> None:
    """Set KEY to VALUE and print the previous value (nothing when there was none).

    Creates the log directory and the map when they do not exist (with expiry when --ttl
    is given). Existing topics are checked first: a refusal (wrong settings, another map's
    topic, a topic another program wrote: see kafkakv init-existing) creates nothing.
    """
    if ttl is not None and if_absent:
        raise CommandError("--ttl and --if-absent do not go together")
    k = _parse(key, key_codec, "KEY")
    v = _parse(value, value_codec, "VALUE")
    more = {} if ttl is None else {"expiry": True}
    with target.open(name, key_codec, value_codec, create=True, **more) as m:
        if not force:
            _check_current(m, name, k, value_codec)
        try:
            previous = m.put_if_absent(k, v) if if_absent else m.put(k, v, ttl=ttl)
        except ResultDecodeError as exc:
            _show_undecoded(exc)
            return
    if previous is not None:
        click.echo(to_json(previous))


@map_group.command("del")
@click.argument("name")
@click.argument("key")
@codec_options()
@_force_option
@pass_target
def del_command(
    target: MapTarget, name: str, key: str, key_codec: str, value_codec: str, force: bool
) -> None:
    """Remove KEY and print the value it had; exit code 1 when absent.

    A map that does not exist is an error (exit code 2); nothing is created.
    """
    k = _parse(key, key_codec, "KEY")
    with target.open(name, key_codec, value_codec) as m:
        if not force:
            _check_current(m, name, k, value_codec)
        try:
            previous = m.remove(k)
        except ResultDecodeError as exc:
            _show_undecoded(exc)
            return
    if previous is None:
        raise _absent(name, k)
    click.echo(to_json(previous))


def _key_order(pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    try:
        return sorted(pairs, key=lambda pair: pair[0])
    except TypeError:  # keys that do not compare (mixed JSON types): the store's order
        return pairs


@map_group.command("dump")
@click.argument("name")
@codec_options()
@click.option("--count", is_flag=True, help="Print only the number of keys.")
@pass_target
def dump_command(
    target: MapTarget, name: str, key_codec: str, value_codec: str, count: bool
) -> None:
    """Print every key and value, one {"key": ..., "value": ...} JSON object per line, in key
    order when the keys compare.

    Syncs first, so the dump holds every update completed before the command started. A map
    that does not exist is an error (exit code 2); nothing is created.
    """
    with target.open(name, key_codec, value_codec) as m:
        m.sync()
        if count:
            click.echo(str(len(m)))
            return
        pairs = list(m.items())
        skipped = m.unreadable()
    for k, v in _key_order(pairs):
        click.echo(_line({"key": k, "value": v}))
    for error in skipped:
        click.echo(
            f"left out: key {error.key!r} (partition {error.partition}, offset {error.offset} "
            f"of {error.topic or 'the log'}): {error.error}",
            err=True,
        )


@map_group.command("watch")
@click.argument("name")
@codec_options()
@click.option(
    "--since",
    "since",
    metavar="CURSOR",
    default=None,
    help='Start after this cursor (from an earlier line\'s "cursor"); default: from now.',
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Stop after N changes.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Stop after SECONDS (default: never).",
)
@click.option(
    "--json/--text",
    "as_json",
    default=True,
    help="One JSON object per line (the default), or 'CURSOR KEY: OLD -> NEW' text.",
)
@pass_target
def watch_command(
    target: MapTarget,
    name: str,
    key_codec: str,
    value_codec: str,
    since: str | None,
    limit: int | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Print each change of the map, in log order per partition, one
    {"key", "old", "new", "cursor"} JSON object per line (old/new null when absent).

    Store the cursor of the last line handled and pass it to --since to go on exactly after
    it, even in another process. A cursor a flush has covered since is an error (exit code
    2): start again from "dump". Runs until Ctrl-C, --limit or --timeout (exit code 0 for
    each), then prints "cursor: CURSOR" on stderr. A map that does not exist is an error
    (exit code 2); nothing is created.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    printed = 0
    with target.open(name, key_codec, value_codec) as m, m.changes(since=since) as feed:
        try:
            while limit is None or printed < limit:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                # In slices, so that Ctrl-C is seen promptly on every platform.
                feed_wait = _WAIT_SLICE_S if left is None else min(left, _WAIT_SLICE_S)
                change = _next_change(feed, feed_wait)
                if change is None:
                    continue
                if as_json:
                    doc = {"key": change.key, "old": change.old, "new": change.new}
                    click.echo(_line({**doc, "cursor": str(change.cursor)}))
                else:
                    old, new = to_json(change.old), to_json(change.new)
                    click.echo(f"{change.cursor} {to_json(change.key)}: {old} -> {new}")
                printed += 1
        except KeyboardInterrupt:
            pass
        click.echo(f"cursor: {feed.cursor}", err=True)


def _next_change(feed: ChangeFeed[Any, Any], wait: float) -> Change[Any, Any] | None:
    """The feed's next change within ``wait`` seconds, or None."""
    feed.timeout = wait
    return next(feed, None)


# -- backup and restore (kafkakv.map.backup) ----------------------------------------------

_STAGES = {
    "write": "writing the backup",
    "verify": "checking the backup",
    "restore": "restoring",
    "remove": "removing keys not in the backup",
}


@contextmanager
def _progress_bar() -> Iterator[Progress | None]:
    """A progress callback drawing a bar on stderr when stderr is a terminal, else None (no
    output: logs and pipes get the summary line only)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    with RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def report(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(_STAGES.get(stage, stage), total=total)
            bar.update(tasks[stage], completed=done)

        yield report


@contextmanager
def _database(target: MapTarget, *, create: bool) -> Iterator[Database]:
    """A database on the group's log; a missing log directory is created only with
    ``create`` (as ``put`` does), else an error."""
    path = require_log(target.path)
    check_target(path)
    if path.startswith("kafka://"):
        with connect(path, **_waits(target)) as db:
            yield db
        return
    if not create and not os.path.isdir(path):
        raise CommandError(f"no log at {path}: the directory does not exist")
    with connect(path, background_cleaner=False) as db:
        yield db


def _waits(target: MapTarget) -> dict[str, Any]:
    return {} if target.timeout is None else {"timeout": target.timeout}


@map_group.command("backup")
@click.argument("name")
@click.argument("file", type=click.Path(dir_okay=False))
@codec_options()
@pass_target
def backup_command(
    target: MapTarget,
    name: str,
    file: str,
    key_codec: str,
    value_codec: str,
) -> None:
    """Write a backup of map NAME, with its cursor, to FILE.

    FILE (replaced if it exists) gets every key and value as stored, and the cursor of the
    moment they were read at. Syncs first, so the backup holds every update completed
    before the command started; the pairs are copied with applying paused, then written to
    a temporary file renamed to FILE. The bytes are copied as they are: --key-codec and
    --value-codec only name the codecs in the backup's header. The format (JSON lines,
    base64 pairs, a checksum) is described in docs/maps.md. A map that does not exist is an
    error (exit code 2); nothing is created.
    """
    options = _waits(target)
    with (
        _database(target, create=False) as db,
        db.map(name, key_codec=key_codec, value_codec=value_codec, create=False, **options) as m,
    ):
        m.sync()
        with _progress_bar() as progress:
            header = backup(m, file, progress=progress)
    click.echo(
        f"backed up {header.pairs:,} pairs of map {name!r} at cursor {header.cursor} to {file}"
    )


@map_group.command("restore")
@click.argument("name")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--replace",
    is_flag=True,
    help="Replace the map's contents: put the backup's pairs, remove every other key.",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="Partitions of the map when the restore creates it (an existing map must have as "
    "many)  [default: the backup's; for an existing map, its own].",
)
@click.option(
    "--hash-tags/--no-hash-tags",
    default=None,
    help="Keys place by their {hash tag}, as db.map(hash_tags=...): a new map is created so, "
    "an existing one must have been  [default: as the backed-up map].",
)
@click.option(
    "--versions/--no-versions",
    default=None,
    help="Keys carry versions, as db.map(versions=...); likewise  [default: as the backed-up map].",
)
@click.option(
    "--expiry/--no-expiry",
    default=None,
    help="Keys may expire, as db.map(expiry=...); likewise  [default: as the backed-up map].",
)
@pass_target
def restore_command(
    target: MapTarget,
    name: str,
    file: str,
    replace: bool,
    partitions: int | None,
    hash_tags: bool | None,
    versions: bool | None,
    expiry: bool | None,
) -> None:
    """Put the pairs of backup FILE into map NAME, byte for byte.

    The whole file is checked first: a missing, foreign, truncated or damaged file is an
    error (exit code 2) and nothing is written. A missing map is created (with the backup's
    partition count unless --partitions, and the backed-up map's hash tags and versions
    unless told otherwise); an existing one may have another partition count, each key
    going to the partition its bytes choose. A map that holds keys is refused unless
    --replace. Open the restored map with the codecs the summary names.
    """
    with _database(target, create=True) as db, _progress_bar() as progress:
        report = restore(
            db,
            name,
            file,
            replace=replace,
            partitions=partitions,
            hash_tags=hash_tags,
            versions=versions,
            expiry=expiry,
            progress=progress,
            **_waits(target),
        )
    header = report.header
    removed = f", {report.removed:,} removed" if replace else ""
    click.echo(
        f"restored {report.put:,} pairs into map {name!r} ({report.overwritten:,} overwritten"
        f"{removed}) from a backup of map {header.map!r} at cursor {header.cursor}; "
        f"its codecs: --key-codec {header.key_codec} --value-codec {header.value_codec}"
    )
