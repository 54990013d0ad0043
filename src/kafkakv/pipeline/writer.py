"""The data source's batch writer: each Arrow batch of a write task's rows appended to a map as
updates (a put per value, a remove per null) or to a topic as records.

Two ways from a batch to the log, with one result:

- **Columns** (a map, on a log that frames rows itself: :meth:`Log.frames_columns
  <kafkakv.log.base.Log.frames_columns>`, the embedded log): where the codecs take the
  columns' bytes as they are (``str`` keys, ``str``/``bytes`` values, or JSON values Spark's
  ``to_json`` wrote), the key and value buffers go to :func:`~kafkakv.map.bulk.update_columns`,
  which hashes, numbers and encodes the ops of the whole batch in C into two columns per
  partition, and :meth:`Log.send_columns <kafkakv.log.base.Log.send_columns>` frames those:
  no Python object per row.
- **Rows**: everything else (Kafka, other codecs, a directory topic): the batch's values
  encoded into a list per column, then records per partition
  (:func:`~kafkakv.map.bulk.update_records` for a map) sent with :meth:`Log.send
  <kafkakv.log.base.Log.send>`. A batch the columns' way declines (a null or reserved key, a
  row over the record limit) takes this way too, which then names the row and its fault.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from kafkakv.errors import RecordTooLargeError
from kafkakv.gcpause import gc_paused
from kafkakv.log.base import Log, Record, new_tuple
from kafkakv.log.columns import Columns
from kafkakv.map.bulk import update_columns, update_records
from kafkakv.map.dedup import numbering
from kafkakv.map.keyspace import RESERVED_KEYS, check_update_key
from kafkakv.map.ops import OpCode, encode_fields
from kafkakv.pipeline.arrow import binary_buffers, encode_column
from kafkakv.pipeline.options import SourceOptions
from kafkakv.pipeline.partitions import partitions_for

__all__ = ["KafkaKVWriter", "Written"]

_RESERVED = frozenset(RESERVED_KEYS)


@dataclass
class Written(WriterCommitMessage):
    """What one write task appended."""

    rows: int
    removes: int


class KafkaKVWriter(DataSourceArrowWriter):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:  # type: ignore[override]
        opts = self.opts
        rows = removes = 0
        with opts.connect() as db:
            log = db.log
            topic = opts.followed_topic(log)
            count = log.partitions(topic)
            limit = log.record_room(topic)  # what one record may hold
            to_records = _MapRecords(opts) if opts.map is not None else _TopicRecords(opts)
            by_columns = to_records if isinstance(to_records, _MapRecords) else None
            if not log.frames_columns():
                by_columns = None
            for batch in iterator:
                if by_columns and _send_columns(log, topic, by_columns, batch, count, limit):
                    rows += batch.num_rows
                    removes += batch.column("value").null_count
                    continue
                # A batch's records are thousands of short-lived tuples: no collections
                # while they live (see kafkakv.gcpause), and their references dropped inside.
                with gc_paused():
                    keys = encode_column(batch.column("key"), opts.key_codec, "key")
                    values = encode_column(
                        batch.column("value"), opts.value_codec, "value", check=opts.check_json
                    )
                    by_partition = to_records(keys, values, count, limit)
                    for p in by_partition:
                        log.send(topic, p, by_partition[p])
                    rows += len(keys)
                    removes += values.count(None)
                    del keys, values, by_partition
        return Written(rows, removes)


class _TopicRecords:
    """Rows to plain records, by the partition Kafka's producer would pick."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def __call__(
        self, keys: list[bytes], values: list[bytes | None], count: int, limit: int
    ) -> dict[int, list[Record]]:
        out: dict[int, list[Record]] = {}
        for key, value, p in zip(keys, values, partitions_for(keys, count), strict=True):
            if len(key) + (0 if value is None else len(value)) > limit:
                _too_large(len(key) + len(value or b""), limit, self.opts)
            out.setdefault(p, []).append(new_tuple(Record, (key, value, (), None, None, None)))
        return out


def _send_columns(
    log: Log, topic: str, to_records: _MapRecords, batch: pa.RecordBatch, count: int, limit: int
) -> bool:
    """Send ``batch``'s ops the columns' way; False (nothing sent) where it declines."""
    by_partition = to_records.columns(batch, count, limit)
    if by_partition is None:
        return False
    for p in sorted(by_partition):
        log.send_columns(topic, p, by_partition[p])
    return True


class _MapRecords:
    """Rows to ops records: a put per value, a remove per null, from one origin whose
    sequence numbers no replica waits for (numbered per partition as a replica numbers its
    updates: see kafkakv.map.dedup)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.prefix = opts.record_prefix
        self.origin = os.urandom(8)
        self.next_seqs: list[int] = []  # per partition: the seq its next update gets
        # The keys whose record key (the prefix, then the key) is reserved.
        reserved = [r[len(self.prefix) :] for r in _RESERVED if r.startswith(self.prefix)]
        self.reserved = pa.array(reserved, pa.large_binary()) if reserved else None

    def columns(self, batch: pa.RecordBatch, count: int, limit: int) -> dict[int, Columns] | None:
        """The ops of ``batch`` by partition, from its columns' buffers (see the module doc);
        None, having numbered nothing, where the rows' way must take it."""
        opts = self.opts
        key_column, value_column = batch.column("key"), batch.column("value")
        keys = binary_buffers(key_column, opts.key_codec, "key")
        values = binary_buffers(value_column, opts.value_codec, "value", check=opts.check_json)
        if keys is None or values is None or keys.valid is not None:
            return None
        if (
            self.reserved is not None
            and pc.any(
                pc.is_in(key_column.cast(pa.large_binary()), value_set=self.reserved)
            ).as_py()
        ):
            return None
        self._number(count)
        out, bad = update_columns(
            keys.offsets,
            keys.data,
            values.offsets,
            values.data,
            values.valid,
            self.prefix,
            self.origin,
            self.next_seqs,
            numbering(0, count).step,
            limit,
        )
        return None if bad >= 0 else out

    def _number(self, count: int) -> None:
        if len(self.next_seqs) != count:
            self.next_seqs = [numbering(p, count)[0] for p in range(count)]

    def __call__(
        self, keys: list[bytes], values: list[bytes | None], count: int, limit: int
    ) -> dict[int, list[Record]]:
        prefix = self.prefix
        record_keys = [prefix + k for k in keys] if prefix else keys
        if not _RESERVED.isdisjoint(record_keys):
            for record_key in record_keys:
                check_update_key(record_key)  # raises for the reserved one
        self._number(count)
        stride = numbering(0, count).step
        partitions = partitions_for(record_keys, count)
        out, bad = update_records(
            record_keys, values, partitions, self.origin, self.next_seqs, stride, limit
        )
        if bad >= 0:  # nothing was numbered: the seq row ``bad`` had, for its exact size
            p, value = partitions[bad], values[bad]
            seq = self.next_seqs[p] + stride * partitions[:bad].count(p)
            fields = (int(OpCode.REMOVE), self.origin, seq)
            op = encode_fields(fields if value is None else (int(OpCode.PUT), *fields[1:], value))
            _too_large(len(record_keys[bad]) + len(op), limit, self.opts)
        return out


def _too_large(size: int, limit: int, opts: SourceOptions) -> NoReturn:
    raise RecordTooLargeError(
        f"a row of {size} bytes is over the {limit} bytes a record of {opts.what} may hold "
        "(its max.message.bytes less the log's framing); nothing of its batch was appended"
    )
