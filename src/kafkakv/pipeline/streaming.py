"""``spark.readStream.format("kafkakv")`` and ``df.writeStream.format("kafkakv")``: a map's
change feed (or a topic's records) as a Structured Streaming source, and micro-batches applied
to a map (or a topic) as a sink.

**Reading a map.** A stream's offsets are change-feed cursors
(:class:`~kafkakv.map.feed.Cursor`): for each partition of the map, the next ops offset, as
JSON (:func:`offset_of`). Spark stores them in its checkpoint, so a query restarted from it
goes on exactly after its last committed micro-batch. ``latestOffset`` is the current end of
the ops partitions; a micro-batch reads the changes between two cursors, one Spark task per
log partition that moved: the task replays that partition alone, from its last flush up to
the end offset the planner noted, as the change feed replays a cursor behind a replica
(:func:`~kafkakv.map.feed.replay_changes`, by a reference replica made from the log: no
replica is opened, and each op is applied once), and puts the stored bytes of the changes
after the start cursor into Arrow columns. Rows are ``key, old, new, partition, offset,
cursor``: ``cursor`` is the feed's cursor (its text, made from the offsets by
:func:`~kafkakv.map.feed.cursor_texts`) of the partition just after the change. Option
``startingOffsets`` (required to stream, since a data source's schema cannot tell a stream
from a batch read): ``earliest`` (the map's contents as changes with a null ``old``, then
every change), ``latest``, or a cursor (its text, or the JSON of an offset).

A **topic** streams its records (``key, value, partition, offset``, a tombstone's value null)
by the same offsets, the topic's own: ``earliest`` is its first records, and a task reads
its partition's records between the two offsets, with no replica.

The changes before a cursor are told by replaying the ops from the last flush
(:mod:`kafkakv.map.feed`). Where a flush has covered a micro-batch's start, the states between
are gone: the ops it covered come as their net effect (one row per key they may change, its
value after the flush, ``old`` and ``offset`` null), then the exact changes after it
(docs/pipeline.md, "Streaming"). That rare case, and ``earliest``'s snapshot, load the
partition's state at an offset the same way (:func:`~kafkakv.map.reference.partition_at`): no task
opens a replica.

**Writing.** Each task of a micro-batch keeps the last row of each key, sorts them by key and
appends them as puts (a null value: a remove) through the batch writer it is given (the data
source's, :class:`~kafkakv.pipeline.source.KafkaKVWriter`). The sink's commit notes the
micro-batch in :data:`LEDGER_MAP` before Spark notes it in the checkpoint, and tasks skip a
micro-batch noted there; one that Spark runs again before that reads the same offsets, so it
appends the same final value of each key again. Either way the map ends as if it ran once
(docs/pipeline.md, "Streaming").

>>> offset_of(Cursor({1: 98, 0: 120}))
{'offsets': {'0': 120, '1': 98}}
>>> cursor_of({'offsets': {'0': 120, '1': 98}, 'skips': {'1': 2}})
Cursor('0:120,1:98+2')
>>> cursor_of(SNAPSHOT) is None
True
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from kafkakv.codecs import codec_for
from kafkakv.db import Database
from kafkakv.errors import (
    ConfigError,
    CursorError,
    CursorExpiredError,
    DataLossError,
    DecodeError,
    OperationFailedError,
    UnknownMapError,
    UnknownTopicError,
)
from kafkakv.log.base import Log
from kafkakv.map.feed import Cursor, cursor_texts, replay_changes
from kafkakv.map.keyspace import prefix_of
from kafkakv.map.machine import ChangeRun, MapState
from kafkakv.map.ops import OpCode, decode_op, write_many_args
from kafkakv.map.reference import Plan, partition_at, planned, reference_planned
from kafkakv.pipeline.arrow import decode_column, spark_type
from kafkakv.pipeline.options import SourceOptions
from kafkakv.store.memory import DictStore

__all__ = [
    "LEDGER_MAP",
    "SNAPSHOT",
    "KafkaKVStreamReader",
    "KafkaKVStreamWriter",
    "StreamOptions",
    "StreamWritten",
    "change_schema",
    "cursor_of",
    "is_stream_read",
    "offset_of",
    "sink_options",
]

BATCH_ROWS = 65_536
"""Rows per Arrow batch a read task yields."""

SNAPSHOT: dict[str, Any] = {"snapshot": True}
"""The initial offset of ``startingOffsets=earliest``: the map's contents, not yet a cursor."""

_STARTING = "startingoffsets"
_SPARK_SINK_OPTIONS = ("checkpointlocation", "path", "queryname")
"""Options of a writeStream that are Spark's, which it passes on to the sink as well."""
_COLUMNS = ("key", "old", "new", "partition", "offset", "cursor")
_TOPIC_COLUMNS = ("key", "value", "partition", "offset")
_READ_BYTES = 8 << 20


def is_stream_read(options: Mapping[str, str]) -> bool:
    """Whether Spark's options are a stream read's (they name ``startingOffsets``)."""
    return any(k.lower() == _STARTING for k in options)


def sink_options(options: Mapping[str, str], overwrite: bool) -> dict[str, str]:
    """A writeStream's options without Spark's own; raises
    :class:`~kafkakv.errors.ConfigError` for output mode ``complete`` (``overwrite``)."""
    if overwrite:
        raise ConfigError(
            "a kafkakv sink applies each micro-batch's rows as updates: use outputMode "
            "'append' or 'update', not 'complete'"
        )
    return {k: v for k, v in options.items() if k.lower() not in _SPARK_SINK_OPTIONS}


def change_schema(opts: SourceOptions) -> str:
    """The columns of a stream of a map's changes, or of a topic's records (types from the
    codecs)."""
    value = spark_type(opts.value_codec)
    if opts.map is None:
        return f"key {spark_type(opts.key_codec)}, value {value}, partition int, offset bigint"
    return (
        f"key {spark_type(opts.key_codec)}, old {value}, new {value}, partition int, "
        "offset bigint, cursor string"
    )


def offset_of(cursor: Cursor) -> dict[str, Any]:
    """The JSON-able offset Spark stores for ``cursor`` (partitions as strings, in order)."""
    out: dict[str, Any] = {"offsets": {str(p): cursor[p] for p in cursor}}
    skips = {str(p): cursor.skip(p) for p in cursor if cursor.skip(p)}
    if skips:
        out["skips"] = skips
    return out


def cursor_of(offset: Mapping[str, Any]) -> Cursor | None:
    """The cursor an offset stands for (None for :data:`SNAPSHOT`); raises
    :class:`~kafkakv.errors.CursorError` for anything else."""
    if offset.get("snapshot") is True and len(offset) == 1:
        return None
    try:
        offsets, skips = offset["offsets"], offset.get("skips", {})
        if set(offset) - {"offsets", "skips"}:
            raise ValueError(offset)
        return Cursor(
            {int(p): o for p, o in offsets.items()}, {int(p): k for p, k in skips.items()}
        )
    except (KeyError, ValueError, TypeError, AttributeError):
        raise CursorError(
            f"not a kafkakv stream offset: {offset!r} (expected "
            '{"offsets": {"0": 120, ...}} or {"snapshot": true})'
        ) from None


@dataclass(frozen=True)
class StreamOptions:
    """A stream read's settings: the data source's, and where the stream starts
    (``earliest``, ``latest`` or a :class:`~kafkakv.map.feed.Cursor`)."""

    source: SourceOptions
    starting: str | Cursor

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> StreamOptions:
        """Parse Spark's string options; raises :class:`~kafkakv.errors.ConfigError`."""
        lowered = {k.lower(): v for k, v in options.items()}
        text = lowered.pop(_STARTING, None)
        source = SourceOptions.from_options(lowered)
        if text is None:
            raise ConfigError(
                f"streaming {source.what} needs option startingOffsets: earliest, latest or a "
                "cursor"
            )
        starting: str | Cursor
        if text.strip().lower() in ("earliest", "latest"):
            starting = text.strip().lower()
        else:
            try:
                if text.lstrip().startswith("{"):
                    cursor = cursor_of(json.loads(text))
                    if cursor is None:
                        raise CursorError("a snapshot marker is not a starting cursor")
                    starting = cursor
                else:
                    starting = Cursor.parse(text.strip())
            except (CursorError, ValueError) as exc:
                raise ConfigError(
                    f"option startingOffsets={text!r}: earliest, latest, a cursor's text "
                    f'("0:120,1:98") or its JSON ({{"offsets": {{"0": 120, "1": 98}}}}); {exc}'
                ) from None
            if source.topic is not None and any(starting.skip(p) for p in starting):
                raise ConfigError(
                    f"option startingOffsets={text!r}: a topic's offsets name records, not "
                    "changes inside one (no '+k')"
                )
        return cls(source, starting)


class ChangeRange(InputPartition):
    """One read task: the changes of log partition ``partition`` from ``start`` (None: the
    partition's contents at ``end`` first) up to ops offset ``end`` (for a topic: its
    records); for a map, also what the planner found of its topics and settings (``plan``:
    see :func:`~kafkakv.map.reference.planned`), so that no task reads them again."""

    def __init__(
        self,
        partition: int,
        start: tuple[int, int] | None,
        end: int,
        plan: Plan | None = None,
    ) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start  # (offset, changes of that record already taken)
        self.end = end
        self.plan = plan


class KafkaKVStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The changes of a map, or the records of a topic, micro-batch by micro-batch (see the
    module docstring). Holds only settings: every call opens its own connection to the log."""

    def __init__(self, opts: StreamOptions, schema: StructType) -> None:
        self.opts = opts
        self.fields = [(f.name, to_arrow_type(f.dataType)) for f in schema.fields]
        columns = _COLUMNS if opts.source.map is not None else _TOPIC_COLUMNS
        unknown = [name for name, _ in self.fields if name not in columns]
        if unknown:
            raise ConfigError(
                f"a stream of {opts.source.what} has columns {', '.join(columns)}; "
                f"not {unknown} (start a stream with option startingOffsets)"
            )
        self._until: Cursor | None = None  # trigger(availableNow=True): the end to reach
        self._plan: Plan | None = None  # a map's, found once (_planned)

    # -- planning (the driver) ---------------------------------------------------------------
    def _ends(self, start: bool = False) -> Cursor:
        """The end (or ``start``) of every partition of the map's ops topic or of the topic
        now (one metadata call per partition)."""
        source = self.opts.source
        with source.connect() as db:
            log = db.log
            existing = set(log.topics())
            if source.map is not None:
                topics = source.map_topics
                topic = topics.ops
                missing = [t for t in (topics.data, topic, topics.flush) if t not in existing]
            else:
                topic = str(source.topic)
                missing = [] if topic in existing else [topic]
            if missing:
                raise UnknownTopicError(
                    f"{source.what} does not exist on {source.target}: no {missing}"
                )
            offset = log.start_offset if start else log.end_offset
            return Cursor({p: offset(topic, p) for p in range(log.partitions(topic))})

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts (a restarted one starts from its checkpoint instead)."""
        starting = self.opts.starting
        if starting == "earliest":
            if self.opts.source.map is None:
                return offset_of(self._ends(start=True))  # every record the topic holds
            return SNAPSHOT
        ends = self._ends()
        if starting == "latest":
            return offset_of(ends)
        assert isinstance(starting, Cursor)
        _check_fits(starting, ends, self.opts.source)
        return offset_of(starting)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the ops partitions now (or when ``availableNow`` was prepared)."""
        ends = self._until or self._ends()
        begin = cursor_of(start)
        if begin is not None:
            _check_fits(begin, ends, self.opts.source)
            if all(begin[p] == ends[p] and not begin.skip(p) for p in ends):
                return start  # nothing new: Spark plans no micro-batch
        return offset_of(ends)

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._ends()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One task per partition with changes between the two offsets (or, from
        :data:`SNAPSHOT`, one per partition)."""
        stop = cursor_of(end)
        assert stop is not None
        begin = cursor_of(start)
        plan = self._planned()
        if begin is None:
            return [ChangeRange(p, None, stop[p], plan) for p in stop]
        return [
            ChangeRange(p, (begin[p], begin.skip(p)), stop[p], plan)
            for p in stop
            if (begin[p], begin.skip(p)) < (stop[p], 0)
        ]

    def _planned(self) -> Plan | None:
        """A map's topics and settings, checked on the first micro-batch (what they were
        created with does not change); None for a topic."""
        source = self.opts.source
        if source.map is not None and self._plan is None:
            with source.connect() as db:
                self._plan = planned(db.log, source.map_topics, source.timeout)
        return self._plan

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the log keeps the ops (until its retention or a flush)."""

    # -- reading (each task) -----------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ChangeRange)
        source = self.opts.source
        p, end = partition.partition, partition.end
        if source.map is None:
            assert partition.start is not None
            with source.connect() as db:
                records = _topic_rows(db.log, str(source.topic), p, partition.start[0], end)
                yield from self._batches(p, records)
            return
        assert partition.plan is not None  # the planner's for a map (see _planned)
        with source.connect() as db:
            if partition.start is None:
                state, at = _loaded(db.log, source, partition.plan, p, end)
                yield from self._batches(p, _snapshot_rows(state, p, at))
            else:
                yield from self._change_batches(db, p, partition.start, end, partition.plan)

    def _change_batches(
        self,
        db: Database,
        p: int,
        start: tuple[int, int],
        end: int,
        plan: Plan,
    ) -> Iterator[pa.RecordBatch]:
        """The changes of partition ``p`` from ``start`` (offset, skip) up to ops offset
        ``end``: one replay of the ops from the last flush by a reference replica made from
        the log (no replica opened), its raw changes put in Arrow columns with the cursors'
        text made from their offsets. Where a flush has covered the position, the ops it
        covered come as their net effect (:func:`_net_rows`); the changes after it are
        replayed so again."""
        source, log = self.opts.source, db.log
        offset, skip = start
        while True:
            try:
                yield from self._replayed(log, p, offset, skip, end, plan)
                return
            except CursorExpiredError as exc:  # raised before any change: nothing was told
                rows, covered = _net_rows(log, plan, p, offset, end, exc, source)
                yield from self._batches(p, iter(rows))
                if covered >= end:
                    return  # the next micro-batch starts behind the flush too: it goes on
                offset, skip = covered, 0

    def _replayed(
        self,
        log: Log,
        p: int,
        offset: int,
        skip: int,
        end: int,
        plan: Plan,
    ) -> Iterator[pa.RecordBatch]:
        """The changes :func:`~kafkakv.map.feed.replay_changes` tells from ``offset``, less
        the first ``skip`` of its record, as Arrow batches of about :data:`BATCH_ROWS` rows.
        Raises CursorExpiredError before any batch when a flush covered ``offset``, the
        stall that stops the partition, and DataLossError when the log ends before ``end``."""
        source = self.opts.source
        ref = reference_planned(log, source.map_topics, [p], _reference_state(source), plan)
        try:
            replayed = replay_changes(ref, p, offset, end)
            pending: tuple[list[Any], ...] = ([], [], [], [])  # the columns of a ChangeRun
            first = True  # of the chunks: the record at `offset` starts it, if it has changes
            while True:
                try:
                    run = next(replayed)
                except StopIteration as stop:
                    reached: int = stop.value
                    break
                if first and skip:  # the cursor's skip: changes of that record behind it
                    offsets = run.offsets
                    lead = next((i for i, o in enumerate(offsets) if o != offset), len(offsets))
                    taken = min(skip, lead)
                    run = ChangeRun(
                        offsets[taken:], run.keys[taken:], run.olds[taken:], run.news[taken:]
                    )
                    if lead <= skip:
                        skip = 0  # the cursors of later records count from their start
                first = False
                for column, told in zip(pending, run, strict=True):
                    column.extend(told)
                if len(pending[0]) >= BATCH_ROWS:
                    yield self._change_batch(p, ChangeRun(*pending), skip)
                    pending, skip = ([], [], [], []), 0
        finally:
            ref.close()
        if reached < end:
            raise DataLossError(
                f"{source.what} partition {p}: the replica reached ops offset {reached}, "
                f"short of {end} noted when the micro-batch was planned"
            )
        if pending[0]:
            yield self._change_batch(p, ChangeRun(*pending), skip)

    def _change_batch(self, p: int, changes: ChangeRun, skip: int) -> pa.RecordBatch:
        """The rows of ``changes`` (whole records but the first, whose first ``skip`` changes
        were taken before), each column built only if the schema asks for it (the offsets
        once, for their column and the cursors')."""
        numbers = functools.cache(lambda: pa.array(changes.offsets, pa.int64()))

        def column(i: int) -> Sequence[Any]:
            return changes[_RUN_OF_ROW[i]]

        def cursors() -> pa.Array[Any]:
            return _cursor_column(p, numbers(), changes.offsets, skip)

        return self._batch(p, len(changes.offsets), column, cursors, numbers)

    def _batches(self, p: int, rows: Iterator[_Row]) -> Iterator[pa.RecordBatch]:
        while True:
            chunk = list(itertools.islice(rows, BATCH_ROWS))
            if not chunk:
                return
            yield self._batch(p, len(chunk), functools.partial(_field, chunk))

    def _batch(
        self,
        p: int,
        n: int,
        values: Callable[[int], Sequence[Any]],
        cursors: Callable[[], pa.Array[Any]] | None = None,
        offsets: Callable[[], pa.Array[Any]] | None = None,
    ) -> pa.RecordBatch:
        """A batch of ``n`` rows of partition ``p``: ``values(i)`` gives field ``i`` of
        :data:`_Row` for every row (``cursors()`` and ``offsets()``, where given, the
        cursor's and the offset's as Arrow columns), asked only for the fields of the
        schema."""
        source = self.opts.source
        where = f"{source.what} partition {p}"
        arrays = []
        for name, arrow_type in self.fields:
            if name == "key":
                column = _decode(values(0), source.key_codec, f"{where}: key")
            elif name == "old":
                column = _decode(values(1), source.value_codec, f"{where}: old value")
            elif name in ("new", "value"):
                column = _decode(values(2), source.value_codec, f"{where}: {name} value")
            elif name == "partition":
                column = pa.repeat(pa.scalar(p, pa.int32()), n)
            elif name == "offset":
                column = offsets() if offsets else pa.array(values(_OFFSET), pa.int64())
            else:
                column = cursors() if cursors else pa.array(values(_CURSOR), pa.string())
            if column.type != arrow_type:
                try:
                    column = column.cast(arrow_type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ConfigError(
                        f"column {name!r} of {source.what} is {column.type}, which does not "
                        f"convert to the schema's {arrow_type}"
                    ) from exc
            arrays.append(column)
        return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in self.fields])


#: One row as a task gathers it: key, old, new (stored bytes), ops offset, cursor text.
_Row = tuple[bytes, bytes | None, bytes | None, int | None, str]
_OFFSET, _CURSOR = 3, 4  # the cursor's field in a _Row: told from the offsets, not a ChangeRun's
#: For each other field of a _Row, the column of a ChangeRun (offsets, keys, olds, news).
_RUN_OF_ROW = (1, 2, 3, 0)


def _reference_state(source: SourceOptions) -> MapState:
    """The map as a reference replica of a task holds it: an empty store, and the map's own
    codecs, with which it decides the ops as every replica does (a registered function gets
    decoded values; a compare is by decoded value). The rows are the stored bytes."""
    keys, values = codec_for(source.key_codec), codec_for(source.value_codec)
    return MapState(source.map or "", source.record_prefix, keys, values, DictStore())


def _field(rows: list[_Row], i: int) -> list[Any]:
    return [r[i] for r in rows]  # a comprehension per column: zip(*rows) is slower


def _cursor_column(
    p: int, numbers: pa.Array[Any], offsets: Sequence[int], skip: int
) -> pa.Array[Any]:
    """:func:`~kafkakv.map.feed.cursor_texts` of ``offsets`` (``numbers``: as an Arrow
    column) as an Arrow column; where each record has one change (no offset twice), made by
    Arrow's kernels: ``"p:" + (offset + 1)``."""
    if len(numbers) > 1 and pc.any(pc.equal(numbers[1:], numbers[:-1])).as_py():
        return pa.array(cursor_texts(p, offsets, skip), pa.string())
    following = pc.cast(pc.add(numbers, 1), pa.string())
    joined: pa.Array[Any] = pc.binary_join_element_wise(  # type: ignore[call-overload]
        f"{p}:",
        following,
        "",  # (the stubs take no scalar for a string argument)
    )
    return joined


def _check_fits(cursor: Cursor, ends: Cursor, source: SourceOptions) -> None:
    """Raise CursorError unless ``cursor`` names the map's partitions, within the log."""
    if set(cursor) != set(ends):
        raise CursorError(
            f"cursor {cursor} names partitions {sorted(cursor)}; {source.what} has {sorted(ends)}"
        )
    past = [p for p in ends if cursor[p] > ends[p]]
    if past:
        raise CursorError(
            f"cursor {cursor} points past the end of {source.what}'s ops ({ends}): a cursor "
            "of another map or log?"
        )


def _topic_rows(log: Log, topic: str, p: int, start: int, end: int) -> Iterator[_Row]:
    """The keyed records of ``topic[p]`` at offsets ``start`` up to ``end`` (a tombstone's
    value is None), as rows with ``new`` the record's value."""
    offset = start
    while offset < end:
        batch = log.read_batch(topic, p, offset, max_records=50_000, max_bytes=_READ_BYTES)
        for record in batch.records:
            if record.offset is None or record.offset >= end:
                return
            if record.key is not None:  # not a key-value record: nothing to stream
                yield record.key, None, record.value, record.offset, f"{p}:{record.offset + 1}"
        if batch.next_offset <= offset:
            return  # nothing more is readable below the end offset
        offset = batch.next_offset


def _net_rows(
    log: Log,
    plan: Plan,
    p: int,
    start: int,
    end: int,
    expired: CursorExpiredError,
    source: SourceOptions,
) -> tuple[list[_Row], int]:
    """For each key the ops from ``start`` (up to the flush ``expired`` names, and at most up
    to ``end``) may have changed, one row: its value after the flush (or a later one that
    overtakes this call too; None: absent), with ``old`` and ``offset`` unknown (None); and
    the ops offset the rows reflect."""
    state, covered = _loaded(log, source, plan, p, expired.flushed + 1)
    topic = source.map_topics.ops
    touched = _touched(log, topic, p, start, min(covered, end), source.record_prefix)
    cursor = str(Cursor({p: covered}))
    return [(key, None, state.get(key), None, cursor) for key in sorted(touched)], covered


def _loaded(
    log: Log, source: SourceOptions, plan: Plan, p: int, at: int
) -> tuple[dict[bytes, bytes], int]:
    """The map's partition ``p`` as it stood at ops offset ``at``, or just after a flush
    written since that passed it, with the stored bytes as keys and values; and the ops
    offset it reflects (:func:`~kafkakv.map.reference.partition_at`: no replica opened).
    Raises DataLossError when the ops end before ``at``."""
    state = _reference_state(source)
    keys, values, reflected = partition_at(log, source.map_topics, plan, state, p, at)
    return dict(zip(keys, values, strict=True)), reflected


def _touched(log: Log, topic: str, p: int, start: int, stop: int, prefix: bytes) -> set[bytes]:
    """The keys of the map whose record keys start with ``prefix`` that the ops records of
    ``topic[p]`` at ``[start, stop)`` may change: a record's own key, and the keys a batch
    (``WRITE_MANY``, ``WRITE_MANY_TTL``, ``PUT_FOR`` of several keys) or ``TRANSACT``
    writes (see :mod:`kafkakv.map.ops`)."""
    keys: set[bytes] = set()
    offset = start
    while offset < stop:
        batch = log.read_batch(topic, p, offset, max_records=50_000, max_bytes=_READ_BYTES)
        for record in batch.records:
            if record.offset is None or record.offset >= stop:
                return keys
            key = record.key
            if key is None or not key.startswith(prefix) or (prefix and prefix_of(key) != prefix):
                continue  # a control record, or another map's (shared topics)
            keys.add(key[len(prefix) :])
            keys.update(_batch_keys(record.value))
        if batch.next_offset <= offset:
            break
        offset = batch.next_offset
    return keys


def _batch_keys(value: bytes | None) -> list[bytes]:
    """The keys a batch or transaction op writes besides its record's key (none for other
    ops, and for one that does not decode: every replica fails it alike)."""
    try:
        op = decode_op(value)
        if op.code in (OpCode.WRITE_MANY, OpCode.TRANSACT):
            return write_many_args(op.args[-2:])[0]
        if op.code is OpCode.WRITE_MANY_TTL or (op.code is OpCode.PUT_FOR and len(op.args) == 3):
            return write_many_args(op.args[:2])[0]
    except (DecodeError, OperationFailedError):
        pass
    return []


def _snapshot_rows(state: dict[bytes, bytes], p: int, at: int) -> Iterator[_Row]:
    """The partition's contents ``state`` (see :func:`_loaded`), which reflect ops offset
    ``at``, as changes from nothing. When a flush has passed the planned end offset, they are
    the contents after that flush; the next micro-batch, which starts behind the flush, then
    gives the net effect of the ops between (:func:`_net_rows`)."""
    cursor = str(Cursor({p: at}))
    for key, value in state.items():
        yield key, None, value, None, cursor


def _decode(values: Sequence[bytes | None], codec: str, what: str) -> pa.Array[Any]:
    if codec == "int":
        decode = codec_for("int").decode
        return pa.array([None if v is None else decode(v) for v in values], pa.int64())
    return decode_column(values, codec, what)  # type: ignore[arg-type]  # nulls stay nulls


class BatchAppender(Protocol):
    """What the stream writer needs of the data source's batch writer: append the rows of
    one task to the map."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage: ...


LEDGER_MAP = "kafkakv-streams"
"""The map, on the sink's log, holding the last micro-batch each streaming query committed
there: query id -> batch id (``int`` values)."""

#: The local properties Spark gives every task of a micro-batch.
_QUERY_ID, _BATCH_ID = "sql.streaming.queryId", "streaming.sql.batchId"


@dataclass
class StreamWritten(WriterCommitMessage):
    """What one task of a micro-batch did: ``written`` is the appender's message, None when
    the micro-batch was committed before (``query``: its query's id, when Spark said)."""

    query: str | None
    batch: int | None
    written: WriterCommitMessage | None


class KafkaKVStreamWriter(DataSourceStreamArrowWriter):
    """Applies each micro-batch to a map: per task, the last row of each key, sorted by key,
    appended by ``appender``; a micro-batch that :data:`LEDGER_MAP` said its query had
    committed when the writer was made (Spark makes one for each micro-batch, on the driver)
    is skipped (see the module docstring). ``committed``: that ledger, query id -> last
    committed batch id."""

    def __init__(
        self, appender: BatchAppender, opts: SourceOptions, committed: Mapping[str, int]
    ) -> None:
        self.appender = appender
        self.opts = opts
        self.committed = dict(committed)

    @classmethod
    def open(cls, appender: BatchAppender, opts: SourceOptions) -> KafkaKVStreamWriter:
        """The writer, with the ledger as it is now (on the driver, before the micro-batch's
        tasks run). Costs opening the ledger map (the bootstrap of one small partition), if
        there is one."""
        with opts.connect() as db:
            try:
                ledger = db.map(LEDGER_MAP, value_codec="int", timeout=opts.timeout, create=False)
            except UnknownMapError:
                return cls(appender, opts, {})
            return cls(appender, opts, dict(ledger.items()))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamWritten:  # type: ignore[override]
        query, batch = _micro_batch()
        if query is not None and batch is not None and batch <= self.committed.get(query, -1):
            return StreamWritten(query, batch, None)  # Spark runs it again: it was done
        return StreamWritten(query, batch, self._append(iterator))

    def _append(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        batches = [b for b in iterator if b.num_rows]
        if not batches:
            return self.appender.write(iter(()))
        table = pa.Table.from_batches(batches)
        keys = table.column("key")
        if keys.null_count:  # the appender names the row
            return self.appender.write(iter(table.to_batches()))
        last: dict[Any, int] = {k: row for row, k in enumerate(keys.to_pylist())}
        rows = [last[k] for k in sorted(last)]
        return self.appender.write(iter(table.take(pa.array(rows, pa.int64())).to_batches()))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Note in :data:`LEDGER_MAP` that the query committed micro-batch ``batchId`` (one
        put, waited for), before Spark notes it in the checkpoint."""
        queries = {m.query for m in messages if isinstance(m, StreamWritten) and m.query}
        if not queries:
            return
        with self.opts.connect() as db:
            ledger = db.map(LEDGER_MAP, value_codec="int", timeout=self.opts.timeout)
            ledger.put_all(dict.fromkeys(sorted(queries), batchId))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what a failed task appended is appended again, with the same
        final values, when Spark runs the micro-batch again."""


def _micro_batch() -> tuple[str | None, int | None]:
    """The query id and micro-batch id of the running task (None when Spark does not say)."""
    context = TaskContext.get()
    if context is None:
        return None, None
    query, batch = context.getLocalProperty(_QUERY_ID), context.getLocalProperty(_BATCH_ID)
    return query, None if batch is None else int(batch)
