"""The ``kafkakv`` Spark data source on both logs: snapshots of maps and topics, writes as map
updates and as topic records."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, IntegerType, LongType, StringType, StructField, StructType

import kafkakv
from kafkakv.errors import EncodeError, RecordTooLargeError
from kafkakv.log import EmbeddedLog
from kafkakv.log.partitioner import partition_for
from kafkakv.map.dedup import numbering
from kafkakv.map.keyspace import FLUSH_POINT_KEY
from kafkakv.map.ops import OpCode, decode_op, encode_op
from kafkakv.map.reference import partition_at
from kafkakv.pipeline import SourceOptions, source
from kafkakv.pipeline.arrow import encode_column
from kafkakv.pipeline.source import KafkaKVDataSource
from kafkakv.pipeline.writer import KafkaKVWriter, Written, _MapRecords
from tests.records import offset_of


def _read(spark: Any, schema: str | None = None, **options: str) -> list[Any]:
    reader = spark.read.format("kafkakv").options(**options)
    if schema is not None:
        reader = reader.schema(schema)
    rows: list[Any] = reader.load().collect()
    return rows


def test_a_map_snapshot_holds_flushed_and_unflushed_updates(
    spark: Any, target: str, name: str
) -> None:
    with kafkakv.connect(target) as db:
        m = db.map(name, partitions=3, flush_period=50)
        for i in range(120):
            m[f"k{i}"] = {"i": i}
        m.flush()  # the data topic holds these
        for i in range(100, 130):
            m[f"k{i}"] = {"i": -i}  # ops after the flush, overwriting flushed keys too
        del m["k3"]
        expected = {k: v for k, v in m.items()}
        partitions = {k: m.partition_of(k) for k in expected}
    rows = _read(spark, target=target, map=name)
    got = {r["key"]: kafkakv.codecs.codec_for("json").decode(r["value"].encode()) for r in rows}
    assert got == expected
    assert len(rows) == len(expected) == 129
    assert {r["key"]: r["partition"] for r in rows} == partitions
    assert {r["partition"] for r in rows} == {0, 1, 2}


def test_decoded_json_columns_follow_the_given_schema(spark: Any, target: str, name: str) -> None:
    with kafkakv.connect(target) as db:
        m = db.map(name)
        m["a"] = {"terminalId": "a", "mcc": 5411, "extra": True}
        m["b"] = {"terminalId": "b"}
    rows = _read(spark, "key string, terminalId string, mcc int", target=target, map=name)
    assert sorted((r["key"], r["terminalId"], r["mcc"]) for r in rows) == [
        ("a", "a", 5411),
        ("b", "b", None),
    ]


def test_int_keys_and_a_shared_topic_set(spark: Any, tmp_path: Any) -> None:
    target = str(tmp_path / "log")
    with kafkakv.connect(target) as db:
        maps = db.maps("shared", ["left", "right"], partitions=2, key_codec="int")
        for i in range(10):
            maps["left"][i] = {"side": "left"}
        maps["right"][100] = {"side": "right"}
    left = _read(spark, target=target, map="left", topics="shared", key_codec="int")
    right = _read(spark, target=target, map="right", topics="shared", key_codec="int")
    assert sorted(r["key"] for r in left) == list(range(10))
    assert [r["key"] for r in right] == [100]


def test_a_topic_snapshot_keeps_the_latest_value_and_drops_tombstones(
    spark: Any, target: str, name: str
) -> None:
    with kafkakv.connect(target) as db:
        db.log.create_topic(name, 2, {"cleanup.policy": "compact"})
        offsets = {}
        for key, value in [(b"a", b'"1"'), (b"b", b'"2"'), (b"a", b'"3"'), (b"b", None)]:
            offsets[key] = db.log.append(name, partition_for(key, 2), [kafkakv.Record(key, value)])
    rows = _read(spark, target=target, topic=name)
    assert [(r["key"], r["value"]) for r in rows] == [("a", '"3"')]
    assert rows[0]["partition"] == partition_for(b"a", 2)
    assert rows[0]["offset"] == offsets[b"a"]  # the record that holds the value


def test_rows_written_to_a_map_reach_a_live_replica_in_its_partitions(
    spark: Any, target: str, name: str
) -> None:
    with kafkakv.connect(target) as db:
        live = db.map(name, partitions=3)
        live["gone"] = {"old": True}
        live["kept"] = {"old": True}
        arrived = threading.Event()
        seen: list[str] = []

        def listener(key: Any, old: Any, new: Any, mine: bool) -> None:
            seen.append(key)
            if len(seen) >= 501:
                arrived.set()

        live.add_listener(listener)
        df = spark.range(500).select(
            F.concat(F.lit("w"), F.col("id").cast("string")).alias("key"),
            F.to_json(F.struct(F.col("id").alias("n"))).alias("value"),
        )
        deletes = spark.createDataFrame([("gone", None)], "key string, value string")
        options = SourceOptions(target, map=name).to_options()
        df.union(deletes).write.format("kafkakv").options(**options).mode("append").save()
        assert arrived.wait(30), f"the live replica saw {len(seen)} of 501 updates"
        assert live["w42"] == {"n": 42}
        assert "gone" not in live
        assert live["kept"] == {"old": True}
        assert len(live) == 501
        # Another replica, bootstrapping from the log, agrees (same partitions, same state).
        with kafkakv.connect(target) as db2:
            other = db2.map(name)
            assert dict(other.items()) == dict(live.items())
            for key in ("w0", "w499", "kept"):
                assert other.partition_of(key) == live.partition_of(key)


def test_rows_written_to_a_topic_are_records_a_directory_reads(
    spark: Any, target: str, name: str
) -> None:
    with kafkakv.connect(target) as db:
        db.log.create_topic(name, 3, {"cleanup.policy": "compact"})
    df = spark.createDataFrame(
        [("t1", '{"acq": "A"}'), ("t2", '{"acq": "B"}'), ("t3", None)],
        "key string, value string",
    )
    df.write.format("kafkakv").options(target=target, topic=name).mode("append").save()
    with kafkakv.connect(target) as db:
        directory = db.directory(name)
        assert dict(directory.items()) == {"t1": {"acq": "A"}, "t2": {"acq": "B"}}
        p = partition_for(b"t3", 3)
        end = db.log.end_offset(name, p)
        records = db.log.read(name, p, 0)
        assert records[-1].key == b"t3"
        assert records[-1].value is None  # the null value went out as a tombstone
        assert end == offset_of(records[-1]) + 1


def test_reading_a_missing_map_fails_and_creates_nothing(spark: Any, tmp_path: Any) -> None:
    target = str(tmp_path / "log")
    with kafkakv.connect(target):
        pass
    with pytest.raises(PySparkException, match="UnknownTopicError"):
        _read(spark, target=target, map="nothing-here")
    with kafkakv.connect(target) as db:
        assert db.log.topics() == []


def test_bad_rows_fail_the_write_with_the_reason(spark: Any, tmp_path: Any) -> None:
    target = str(tmp_path / "log")
    with kafkakv.connect(target) as db:
        db.map("m")
    bad_json = spark.createDataFrame([("k", "{oops")], "key string, value string")
    with pytest.raises(PySparkException, match="does not decode"):
        bad_json.write.format("kafkakv").options(target=target, map="m").mode("append").save()
    null_key = spark.createDataFrame([(None, "1")], "key string, value string")
    with pytest.raises(PySparkException, match="a key cannot be null"):
        null_key.write.format("kafkakv").options(target=target, map="m").mode("append").save()
    ok = spark.createDataFrame([("k", "1")], "key string, value string")
    with pytest.raises(PySparkException, match="use mode\\('append'\\)"):
        ok.write.format("kafkakv").options(target=target, map="m").mode("overwrite").save()
    with kafkakv.connect(target) as db:
        assert db.log.end_offset("m_ops", 0) == 0  # nothing of the bad batches was appended


def test_what_ships_to_executors_is_only_settings(spark: Any, tmp_path: Any) -> None:
    # spark: parsing the schema needs a SparkContext, which under xdist this test's worker
    # has only if the test asks for one (it failed on a worker no Spark test had run on)
    source = KafkaKVDataSource({"target": str(tmp_path), "map": "m"})
    source._settings()  # checks the options, as Spark's first call does
    reader = source.reader(_schema(source))
    for thing in (source, reader):
        blob = pickle.dumps(thing)
        assert len(blob) < 4096
        assert b"EmbeddedLog" not in blob and b"Database" not in blob
    assert not (tmp_path / "m").exists()  # building them opened nothing


def _schema(source: KafkaKVDataSource) -> Any:
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(source.schema())


def test_maps_whose_values_are_not_json_read_as_binary(spark: Any, tmp_path: Any) -> None:
    target = str(tmp_path / "log")
    with kafkakv.connect(target) as db:
        db.map("raw", value_codec="bytes")["k"] = b"\x00\xff not json"
        db.map("packed", value_codec="msgpack")["k"] = {"a": [1, 2]}
    (raw,) = _read(spark, target=target, map="raw", value_codec="bytes")
    assert raw["value"] == bytearray(b"\x00\xff not json")
    (packed,) = _read(spark, target=target, map="packed", value_codec="msgpack")
    assert kafkakv.codecs.codec_for("msgpack").decode(bytes(packed["value"])) == {"a": [1, 2]}


def test_rows_become_ops_numbered_per_partition_and_a_reserved_key_fails_the_batch() -> None:
    """A write task's rows become puts and removes, each partition's numbered as a replica
    numbers its own updates; a row with the flush point's key fails its whole batch before
    anything of it is appended."""
    to_records = _MapRecords(SourceOptions("/tmp/unused", map="m"))
    keys = [f"k{i}".encode() for i in range(50)]
    values = [None if i % 5 == 0 else str(i).encode() for i in range(50)]
    out = to_records(keys, values, 2, 1 << 20)
    for p, records in out.items():
        ops = [decode_op(r.value) for r in records]
        assert [op.seq for op in ops] == list(numbering(p, 2)[: len(ops)])
        assert all(partition_for(r.key or b"", 2) == p for r in records)
    by_key = {r.key or b"": decode_op(r.value) for rs in out.values() for r in rs}
    assert sorted(by_key) == sorted(keys)
    assert by_key[b"k5"].code is OpCode.REMOVE and by_key[b"k6"].args == (b"6",)
    with pytest.raises(EncodeError, match="reserved"):
        to_records([b"a", FLUSH_POINT_KEY], [b"1", b"2"], 2, 1 << 20)


def test_a_row_over_the_record_limit_fails_its_batch_naming_its_exact_size() -> None:
    """Nothing of the batch is numbered (the next batch's seqs start where they were), and
    the size told is the record's: its key and its ops record."""
    to_records = _MapRecords(SourceOptions("/tmp/unused", map="m"))
    keys, values = [b"a", b"b", b"c"], [b"1", None, b"x" * 500]
    parts = [partition_for(k, 2) for k in keys]
    seq = numbering(parts[2], 2)[parts[:2].count(parts[2])]
    op = encode_op(OpCode.PUT, to_records.origin, seq, [b"x" * 500])
    with pytest.raises(RecordTooLargeError, match=f"a row of {1 + len(op)} bytes is over the 300"):
        to_records(keys, values, 2, 300)
    out = to_records(keys[:2], values[:2], 2, 300)
    firsts = {p: decode_op(rs[0].value).seq for p, rs in out.items()}
    assert firsts == {p: numbering(p, 2)[0] for p in set(parts[:2])}


@pytest.mark.parametrize(
    ("key_type", "value_type", "codec", "prefixed"),
    [
        (pa.string(), pa.string(), "json", False),
        (pa.large_string(), pa.binary(), "json", True),
        (pa.string(), pa.large_binary(), "bytes", False),
    ],
)
def test_a_batch_the_columns_way_makes_the_ops_the_rows_way_makes(
    key_type: Any, value_type: Any, codec: str, prefixed: bool
) -> None:
    """From a sliced batch (offsets not from 0), with nulls: the same records, numbered
    alike, partition by partition; and both ways leave the next batch's seqs alike."""
    opts = SourceOptions(
        "/tmp/unused",
        map="m",
        value_codec=codec,
        check_json=False,
        topics="shared" if prefixed else None,
    )
    by_columns, by_rows = _MapRecords(opts), _MapRecords(opts)
    by_rows.origin = by_columns.origin
    keys = [f"k{i}" * (i % 4) for i in range(300)]
    values = [None if i % 7 == 0 else f'{{"n": {i}}}' for i in range(300)]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(keys, key_type), pa.array(values, pa.string()).cast(value_type)],
        names=["key", "value"],
    ).slice(5, 250)
    for _ in range(2):
        columns = by_columns.columns(batch, 3, 1 << 20)
        assert columns is not None
        records = by_rows(
            encode_column(batch.column("key"), "str", "key"),
            encode_column(batch.column("value"), codec, "value", check=False),
            3,
            1 << 20,
        )
        assert sorted(columns) == sorted(records)
        for p, rows in records.items():
            assert columns[p].pairs() == [(r.key, r.value) for r in rows]
        assert by_columns.next_seqs == by_rows.next_seqs


def test_the_columns_way_declines_what_the_rows_way_must_name_and_numbers_nothing() -> None:
    """A null key, a reserved key, a row over the limit, a codec that checks or re-encodes
    each value: None, with the seqs as they were (the rows' way then raises, naming it)."""
    opts = SourceOptions("/tmp/unused", map="m", check_json=False)
    to_records = _MapRecords(opts)

    def batch(keys: list[Any], values: list[Any]) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array(keys), pa.array(values)], names=["key", "value"]
        )

    assert to_records.columns(batch(["a"], ["1"]), 2, 100) is not None
    seqs = list(to_records.next_seqs)
    for declined, limit in (
        (batch(["a", None], ["1", "2"]), 100),
        (batch(["a", FLUSH_POINT_KEY.decode()], ["1", "2"]), 100),
        (batch(["a", "b"], ["1", "x" * 200]), 100),
    ):
        assert to_records.columns(declined, 2, limit) is None
        assert to_records.next_seqs == seqs
    checked = _MapRecords(SourceOptions("/tmp/unused", map="m"))  # JSON values parsed
    assert checked.columns(batch(["a"], ["1"]), 2, 100) is None
    packed = _MapRecords(SourceOptions("/tmp/unused", map="m", value_codec="msgpack"))
    assert packed.columns(batch(["a"], [b"\x01"]), 2, 100) is None


def test_a_write_task_on_the_embedded_log_sends_columns_not_records(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KafkaKVWriter.write in this process: the embedded log takes each batch as columns (a
    send of records would fail the test), and a batch the columns way declines still fails
    as the rows way says."""
    target = str(tmp_path / "log")
    with kafkakv.connect(target) as db:
        db.map("m", partitions=2)

    def no_records(*args: Any, **kw: Any) -> None:
        raise AssertionError("a batch went the rows' way")

    monkeypatch.setattr(EmbeddedLog, "send", no_records)
    writer = KafkaKVWriter(SourceOptions(target, map="m", check_json=False))
    batches = [
        pa.RecordBatch.from_arrays(
            [
                pa.array([f"k{i}" for i in range(j, j + 100)]),
                pa.array([f"{i}" for i in range(j, j + 100)]),
            ],
            names=["key", "value"],
        )
        for j in (0, 50)
    ]
    assert writer.write(iter(batches)) == Written(200, 0)
    with kafkakv.connect(target) as db:
        m = db.map("m")
        assert len(m) == 150 and m["k120"] == 120
    null_key = pa.RecordBatch.from_arrays(
        [pa.array([None], pa.string()), pa.array(["1"])], names=["key", "value"]
    )
    monkeypatch.undo()
    with pytest.raises(EncodeError, match="a key cannot be null"):
        writer.write(iter([null_key]))


def test_a_flushed_partition_is_read_from_its_columns_and_the_rest_by_a_replica(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read task, in this process: a partition whose last flush covers the planned offset
    comes from the data topic's columns (kafkakv.map.flushed), with no reference replica; one
    with ops after the flush from the replica (partition_at). Both give the map's rows."""
    target = str(tmp_path / "log")
    with kafkakv.connect(target) as db:
        m = db.map("m", partitions=2)
        m.update({f"k{i}": {"n": i} for i in range(200)})
        m.flush()
        m["late"] = {"n": -1}
        late = m._engine.keyspace.partition_of(b"late")
    replicas: list[int] = []

    def counted(*args: Any) -> Any:
        replicas.append(args[4])
        return partition_at(*args)

    monkeypatch.setattr(source, "partition_at", counted)
    data_source = KafkaKVDataSource({"target": target, "map": "m"})
    assert data_source.schema() == "key string, value string, partition int, offset bigint"
    fields: list[tuple[str, DataType]] = [("key", StringType()), ("value", StringType())]
    fields += [("partition", IntegerType()), ("offset", LongType())]
    reader = data_source.reader(StructType([StructField(n, t) for n, t in fields]))
    rows: dict[Any, Any] = {}
    for part in reader.partitions():
        for batch in reader.read(part):
            assert isinstance(batch, pa.RecordBatch)
            keys, values = batch.column("key").to_pylist(), batch.column("value").to_pylist()
            rows.update(zip(keys, values, strict=True))
    assert replicas == [late]
    assert rows == {**{f"k{i}": f'{{"n":{i}}}' for i in range(200)}, "late": '{"n":-1}'}
