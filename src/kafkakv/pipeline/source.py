"""``spark.read.format("kafkakv")`` and ``df.write.format("kafkakv")``: maps and topics as
Spark tables, through PySpark's Python Data Source API.

Reading gives one Spark partition per log partition, each yielding Arrow record batches:

- a **map**: the planner checks the map's topics and settings once and notes every
  partition's ops end offset; the task loads its partition as it stood at that offset with a
  reference replica (:func:`~kafkakv.map.reference.partition_at`: the data topic, then the ops
  after the last flush, up to the offset and no further, with no replica's threads), and copies
  its store's encoded keys and values into Arrow. The snapshot holds every update that
  completed before the read was planned, and no later one unless a flush since covered it.
  ``offset`` is the ops offset the snapshot reflects (the same for all the partition's rows).
- a **topic**: the task reads its partition from the start up to the end offset noted by the
  planner and keeps the latest value of each key (a tombstone removes it); ``offset`` is the
  offset of the record that holds the value.

Columns are ``key``, ``value``, ``partition`` and ``offset`` (types from the codecs: see
:mod:`kafkakv.pipeline.arrow`). Give a schema with other columns as well (``json`` values only)
and each one is the member of that name of the value's JSON object.

Writing (mode ``append``) takes ``key`` and ``value`` columns. Into a **map**, each row becomes
one update on its ops topic, a put (a null value: a remove), in the partition the map uses for
that key, so live replicas apply it like any other update; nothing waits for the updates to be
applied. Into a **topic**, each row becomes one record (a null value: a tombstone) in the
partition Kafka's Java producer would pick. Rows of one Spark task keep their order within a
log partition; rows of different tasks interleave. A task that fails may have appended part of
its rows (puts and removes are idempotent, so running the job again repairs it). Spark's retry
of a task appends all its rows again, from a new origin: replicas apply both copies, and the
second leaves each key as the first would have (docs/pipeline.md, "What a retried task
repeats").

Streams (``readStream``, ``writeStream``; option ``startingOffsets`` makes a read a stream of
changes) are :mod:`kafkakv.pipeline.streaming`'s, which these methods delegate to.

The data source pickles only :class:`~kafkakv.pipeline.options.SourceOptions` (strings); every
task opens its own connection to the log and closes it before it ends.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import StructType

from kafkakv.codecs import codec_for
from kafkakv.errors import (
    ConfigError,
)
from kafkakv.map.flushed import flushed_columns
from kafkakv.map.machine import MapState
from kafkakv.map.reference import Plan, partition_at, planned
from kafkakv.pipeline.arrow import (
    columns_arrays,
    decode_column,
    json_columns,
    spark_type,
)
from kafkakv.pipeline.options import SourceOptions
from kafkakv.pipeline.streaming import (
    KafkaKVStreamReader,
    KafkaKVStreamWriter,
    StreamOptions,
    change_schema,
    is_stream_read,
    sink_options,
)
from kafkakv.pipeline.writer import KafkaKVWriter
from kafkakv.store.memory import DictStore

__all__ = ["KafkaKVDataSource"]

BATCH_ROWS = 65_536
"""Rows per Arrow batch a read task yields."""

_READ_BYTES = 8 << 20
_BUILTIN = ("key", "value", "partition", "offset")


class KafkaKVDataSource(DataSource):
    """The ``kafkakv`` format. Options: see :class:`~kafkakv.pipeline.options.SourceOptions`."""

    @classmethod
    def name(cls) -> str:
        return "kafkakv"

    def _settings(self) -> SourceOptions:
        return SourceOptions.from_options(self.options)

    def schema(self) -> str:
        if is_stream_read(self.options):  # readStream: kafkakv.pipeline.streaming
            return change_schema(StreamOptions.from_options(self.options).source)
        opts = self._settings()
        return (
            f"key {spark_type(opts.key_codec)}, value {spark_type(opts.value_codec)}, "
            "partition int, offset bigint"
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaKVReader(self._settings(), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise ConfigError(
                "the kafkakv data source appends (a map merges the rows as updates): "
                "use mode('append')"
            )
        missing = [c for c in ("key", "value") if c not in schema.fieldNames()]
        if missing:
            raise ConfigError(f"writing to kafkakv needs columns key and value; missing {missing}")
        return KafkaKVWriter(self._settings())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaKVStreamReader(StreamOptions.from_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        sink = KafkaKVDataSource(sink_options(self.options, overwrite))
        return KafkaKVStreamWriter.open(sink.writer(schema, overwrite=False), sink._settings())


class LogPartition(InputPartition):
    """One read task: a log partition and the end offset noted when the read was planned;
    for a map, also what the planner found of its topics and settings (``plan``: see
    :func:`~kafkakv.map.reference.planned`), so that no task reads them again."""

    def __init__(self, partition: int, end: int, plan: Plan | None) -> None:
        super().__init__((partition, end))
        self.partition = partition
        self.end = end
        self.plan = plan


class KafkaKVReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.fields = [(f.name, to_arrow_type(f.dataType)) for f in schema.fields]
        extra = [name for name, _ in self.fields if name not in _BUILTIN]
        if extra and opts.value_codec != "json":
            raise ConfigError(
                f"columns {extra} are read from JSON values; {opts.what} has value codec "
                f"{opts.value_codec!r}"
            )

    def partitions(self) -> Sequence[InputPartition]:
        """Note every partition's end offset (one metadata call per partition), after the
        map's topics and settings are checked (once, here: see :class:`LogPartition`)."""
        opts = self.opts
        with opts.connect() as db:
            topic = opts.followed_topic(db.log)
            plan = None
            if opts.map is not None:
                plan = planned(db.log, opts.map_topics, opts.timeout)
            count = db.log.partitions(topic)
            return [LogPartition(p, db.log.end_offset(topic, p), plan) for p in range(count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogPartition)
        if self.opts.map is not None:
            yield from self._read_map(partition)
        else:
            yield from self._read_topic(partition)

    def _read_map(self, part: LogPartition) -> Iterator[pa.RecordBatch]:
        """The map's partition as it stood at the end offset the planner noted: a reference
        replica (no threads, nothing applied past that offset) loads it, and its store's
        keys and values go into Arrow in slices of :data:`BATCH_ROWS` rows."""
        opts, p, store = self.opts, part.partition, DictStore()
        assert opts.map is not None
        keys_codec, values_codec = codec_for(opts.key_codec), codec_for(opts.value_codec)
        state = MapState(opts.map, opts.record_prefix, keys_codec, values_codec, store)
        assert part.plan is not None
        with opts.connect() as db:
            flushed = flushed_columns(  # into Arrow's pool: a worker reuses its pages
                db.log,
                opts.map_topics,
                part.plan,
                p,
                part.end,
                opts.record_prefix,
                pa.allocate_buffer,
            )
            if flushed is None:
                keys, values, at = partition_at(
                    db.log, opts.map_topics, part.plan, state, p, part.end
                )
        if flushed is not None:  # the data topic alone: its columns, no store, no dict
            key_column, value_column = columns_arrays(flushed.columns)
            for start in range(0, len(key_column), BATCH_ROWS):  # slices: no copy
                yield self._batch(
                    p,
                    key_column.slice(start, BATCH_ROWS),
                    value_column.slice(start, BATCH_ROWS),
                    flushed.reflected,
                )
            return
        for start in range(0, len(keys), BATCH_ROWS):  # list slices: references, no bytes
            end = start + BATCH_ROWS
            yield self._batch(p, keys[start:end], values[start:end], at)

    def _read_topic(self, part: LogPartition) -> Iterator[pa.RecordBatch]:
        opts = self.opts
        latest: dict[bytes, tuple[bytes, int]] = {}
        with opts.connect() as db:
            log, topic, p = db.log, str(opts.topic), part.partition
            offset = log.start_offset(topic, p)
            while offset < part.end:
                batch = log.read_batch(topic, p, offset, max_records=50_000, max_bytes=_READ_BYTES)
                for record in batch.records:
                    if record.offset is None or record.offset >= part.end:
                        break
                    if record.key is None:
                        continue  # not a key-value record: nothing to keep
                    if record.value is None:
                        latest.pop(record.key, None)
                    else:
                        latest[record.key] = (record.value, record.offset)
                if batch.next_offset <= offset:
                    break  # nothing more is readable below the end offset
                offset = batch.next_offset
        items = iter(latest.items())
        while True:
            chunk = list(itertools.islice(items, BATCH_ROWS))
            if not chunk:
                return
            keys = [k for k, _ in chunk]
            values = [v for _, (v, _o) in chunk]
            offsets = [o for _, (_v, o) in chunk]
            yield self._batch(p, keys, values, offsets)

    def _batch(
        self,
        p: int,
        keys: Sequence[bytes] | pa.Array[Any],
        values: Sequence[bytes] | pa.Array[Any],
        offsets: Sequence[int] | int,
    ) -> pa.RecordBatch:
        """The rows of ``keys`` and ``values`` (bytes, or Arrow binary columns) as the schema
        asks; ``offsets``: each row's, or one for them all (a map read at one position)."""
        opts = self.opts
        where = f"{opts.what} partition {p}"
        n = len(keys)
        extra = [(name, t) for name, t in self.fields if name not in _BUILTIN]
        decoded = {}
        if extra:  # only then are values parsed as JSON (a bytes map's values are not JSON)
            texts = (
                cast("list[bytes]", values.to_pylist()) if isinstance(values, pa.Array) else values
            )
            decoded = dict(
                zip([n for n, _ in extra], json_columns(texts, extra, where), strict=True)
            )
        arrays = []
        for name, arrow_type in self.fields:
            if name == "key":
                column = decode_column(keys, opts.key_codec, f"{where}: key")
            elif name == "value":
                column = decode_column(values, opts.value_codec, f"{where}: value")
            elif name == "partition":
                column = pa.repeat(pa.scalar(p, pa.int32()), n)
            elif name == "offset":
                column = (
                    pa.repeat(pa.scalar(offsets, pa.int64()), n)
                    if isinstance(offsets, int)
                    else pa.array(offsets, pa.int64())
                )
            else:
                column = decoded[name]
            if column.type != arrow_type:
                try:
                    column = column.cast(arrow_type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ConfigError(
                        f"column {name!r} of {opts.what} is {column.type}, which does not "
                        f"convert to the schema's {arrow_type}"
                    ) from exc
            arrays.append(column)
        return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in self.fields])
