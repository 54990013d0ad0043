"""Structured Streaming in and out of maps (the format's streamReader and streamWriter): a
query restarted from its checkpoint goes on exactly after its last micro-batch (on both logs),
every startingOffsets, a topic's records, a micro-batch that Spark runs again, a query killed
with SIGKILL mid-batch, and options that are refused. One Spark session for all (the
``spark`` fixture); queries run with ``trigger(availableNow=True)``, so each ends by itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

import kafkakv
from kafkakv import functions
from kafkakv.errors import (
    ConfigError,
    CursorError,
    DataLossError,
    PartitionStalledError,
    UnknownTopicError,
)
from kafkakv.log.partitioner import partition_for
from kafkakv.pipeline.source import KafkaKVDataSource
from kafkakv.pipeline.streaming import (
    LEDGER_MAP,
    SNAPSHOT,
    KafkaKVStreamReader,
    StreamOptions,
    cursor_of,
    offset_of,
)
from tests.waiting import wait_for


def _changes(spark: Any, target: str, name: str, starting: str, kind: str = "map") -> Any:
    return (
        spark.readStream.format("kafkakv")
        .options(target=target, startingOffsets=starting, **{kind: name})
        .load()
    )


def _doubled(spark: Any, target: str, source: str, sink: str, checkpoint: Path) -> None:
    """Run the query A -> (value * 2, key 'skip' left out) -> B over what A holds now."""
    rows = _changes(spark, target, source, "earliest")
    out = rows.where(F.col("key") != "skip").select(
        "key", (F.col("new").cast("int") * 2).cast("string").alias("value")
    )
    query = (
        out.writeStream.format("kafkakv")
        .options(target=target, map=sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None


def _contents(target: str, name: str) -> dict[str, Any]:
    with kafkakv.connect(target) as db:
        return dict(db.map(name).items())


def _expected(a: dict[str, Any]) -> dict[str, Any]:
    return {k: v * 2 for k, v in a.items() if k != "skip"}


def test_a_map_to_map_stream_restarts_from_its_checkpoint(
    spark: Any, target: str, name: str, tmp_path: Path
) -> None:
    checkpoint, a_name, b_name = tmp_path / "checkpoint", f"{name}-a", f"{name}-b"
    with kafkakv.connect(target) as db:
        a = db.map(a_name, partitions=2)
        db.map(b_name, partitions=3).close()
        a.update({f"k{i}": i for i in range(8)})
        a["skip"] = 100
        del a["k1"]
        first = dict(a.items())
        ends = [db.log.end_offset(f"{a_name}_ops", p) for p in range(2)]
    _doubled(spark, target, a_name, b_name, checkpoint)
    assert _contents(target, b_name) == _expected(first)
    with kafkakv.connect(target) as db:  # reading appends nothing (no barrier records)
        assert [db.log.end_offset(f"{a_name}_ops", p) for p in range(2)] == ends
    with kafkakv.connect(target) as db:
        a = db.map(a_name)
        a["k2"] = 20  # one key changed twice in one micro-batch: the last value wins
        a["k2"] = 21
        a["k9"] = 9
        del a["k3"]
        a["skip"] = 101
        second = dict(a.items())
    _doubled(spark, target, a_name, b_name, checkpoint)  # the restart: the changes since
    assert _contents(target, b_name) == _expected(second)
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert commits == [0, 1]


def _collect(df: Any, checkpoint: Path) -> list[Any]:
    """Run a query over what its source holds now; the rows of its micro-batches."""
    rows: list[Any] = []
    query = (
        df.writeStream.foreachBatch(lambda batch, _id: rows.extend(batch.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return rows


def _seen(rows: list[Any]) -> list[tuple[str, str | None, str | None]]:
    return sorted((r["key"], r["old"], r["new"]) for r in rows)


def test_starting_offsets_earliest_latest_and_a_cursor(spark: Any, tmp_path: Path) -> None:
    target = str(tmp_path / "log")
    with kafkakv.connect(target) as db:
        m = db.map("m", partitions=2)
        m["x"] = 1
        m["y"] = 2
        m.flush()  # earliest starts from the contents, not from changes the flush covered
        m["x"] = 3
        cursor = m.cursor()
        m["z"] = 4
        del m["y"]
    earliest = _changes(spark, target, "m", "earliest")
    rows = _collect(earliest, tmp_path / "e")
    assert _seen(rows) == [("x", None, "3"), ("z", None, "4")]  # the contents, as changes
    assert [r["offset"] for r in rows] == [None, None]
    since = _collect(_changes(spark, target, "m", str(cursor)), tmp_path / "c")
    assert _seen(since) == [("y", "2", None), ("z", None, "4")]
    for r in since:  # the feed's cursor of the row's partition, just after the change
        assert r["cursor"] == f"{r['partition']}:{r['offset'] + 1}"
    as_json = {"target": target, "map": "m", "startingOffsets": json.dumps(offset_of(cursor))}
    assert StreamOptions.from_options(as_json).starting == cursor  # the same start
    latest = _changes(spark, target, "m", "latest")
    assert _collect(latest, tmp_path / "l") == []  # nothing after the start
    with kafkakv.connect(target) as db:
        m = db.map("m")
        m["w"] = 5
        m["x"] = 6
    assert _seen(_collect(latest, tmp_path / "l")) == [("w", None, "5"), ("x", "3", "6")]
    assert _seen(_collect(earliest, tmp_path / "e")) == [("w", None, "5"), ("x", "3", "6")]


def test_a_topic_streams_its_records_by_offset(spark: Any, tmp_path: Path) -> None:
    target = str(tmp_path / "log")
    offsets = {}
    with kafkakv.connect(target) as db:
        db.log.create_topic("t", 2, {"cleanup.policy": "compact"})
        first = [(b"a", b'"1"'), (b"b", b'"2"'), (b"a", b'"3"'), (b"b", None), (b"c", b'"4"')]
        for key, value in first:
            offsets[key] = db.log.append("t", partition_for(key, 2), [kafkakv.Record(key, value)])
        ends = [db.log.end_offset("t", p) for p in range(2)]
    earliest = _changes(spark, target, "t", "earliest", kind="topic")
    rows = _collect(earliest, tmp_path / "e")
    assert rows[0].asDict().keys() == {"key", "value", "partition", "offset"}
    assert sorted((r["key"], r["offset"], r["value"]) for r in rows) == sorted(
        (k.decode(), o, None if v is None else v.decode())
        for (k, v), o in zip(first, _appended(first), strict=True)
    )
    with kafkakv.connect(target) as db:
        d = db.log.append("t", partition_for(b"d", 2), [kafkakv.Record(b"d", b'"5"')])
    again = _collect(earliest, tmp_path / "e")  # from the checkpoint: only the new record
    assert [(r["key"], r["value"], r["offset"]) for r in again] == [("d", '"5"', d)]
    c = partition_for(b"c", 2)  # from record c on in its partition, from the end in the other
    since = ",".join(f"{p}:{offsets[b'c'] if p == c else ends[p]}" for p in range(2))
    got = _collect(_changes(spark, target, "t", since, kind="topic"), tmp_path / "c")
    assert sorted(r["key"] for r in got) == ["c", "d"]


def _appended(records: list[tuple[bytes, bytes | None]]) -> list[int]:
    """The offset each record took, appended in order to a new 2-partition topic."""
    next_offset = [0, 0]
    out = []
    for key, _value in records:
        p = partition_for(key, 2)
        out.append(next_offset[p])
        next_offset[p] += 1
    return out


def test_a_map_sharing_its_topics_streams_only_its_own_changes(tmp_path: Path) -> None:
    target = str(tmp_path / "log")  # the reader driven as Spark drives it, without Spark
    with kafkakv.connect(target) as db:
        maps = db.maps("shared", ["left", "right"], partitions=2, key_codec="int")
        for i in range(4):
            maps["left"][i] = {"i": i}
        maps["right"][100] = {"side": "right"}
        del maps["left"][2]
    schema = StructType(
        [
            StructField("key", LongType()),
            StructField("old", StringType()),
            StructField("new", StringType()),
        ]
    )
    options = {"target": target, "map": "left", "topics": "shared", "key_codec": "int"}
    reader = KafkaKVStreamReader(
        StreamOptions.from_options({**options, "startingOffsets": "0:0,1:0"}), schema
    )
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    rows = [
        row
        for partition in reader.partitions(start, end)
        for batch in reader.read(partition)
        for row in batch.to_pylist()
    ]
    assert sorted(((r["key"], r["old"], r["new"]) for r in rows), key=str) == [
        (0, None, '{"i":0}'),
        (1, None, '{"i":1}'),
        (2, '{"i":2}', None),
        (2, None, '{"i":2}'),
        (3, None, '{"i":3}'),
    ]
    assert reader.latestOffset(end, ReadAllAvailable()) is end  # nothing new: no micro-batch


def _read_all(reader: KafkaKVStreamReader) -> list[dict[str, Any]]:
    """Every row of the micro-batch from the reader's start to the end of the log, read as
    Spark reads it (no Spark: the planner's and the tasks' calls in one process)."""
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    return [
        row
        for partition in reader.partitions(start, end)
        for batch in reader.read(partition)
        for row in batch.to_pylist()
    ]


@functions.register("test_streaming.exclaim")
def _exclaim(key: str, old: str | None) -> str:
    return f"{old}!"


def test_a_stream_tells_the_rows_and_cursors_the_feed_tells_from_every_cursor(
    tmp_path: Path,
) -> None:
    target = str(tmp_path / "log")  # batches, removes and transactions: records of several
    with kafkakv.connect(target) as db:  # changes, read from cursors inside them too
        m = db.map("m", partitions=2, value_codec="str", hash_tags=True)
        m.put_all({f"{{t}}:{i}": str(i) for i in range(4)} | {f"k{i}": str(i) for i in range(6)})
        m["k0"] = "changed"
        del m["{t}:0"]
        assert m.transaction(expect={"{t}:1": "1"}, put={"{t}:1": "a", "{t}:9": "b"})
        assert m.remove_all(["k1", "k2", "k3", "absent"]) == 3
        m.put_all({"{t}:2": "2", "{t}:3": "c"})  # one change of two: a put of the same value
        m["k4"] = "last"
        m.compute("k5", "test_streaming.exclaim")  # decided with the map's codec: str
        for i in range(40):  # a put each, last: from a cursor among them, a bulk batch
            m[f"b{i}"] = str(i)
        with m.changes(since=kafkakv.Cursor(dict.fromkeys(range(2), 0)), timeout=0) as feed:
            changes = list(feed)
    assert len(changes) > len({(c.partition, c.offset) for c in changes})  # records of several
    schema = StructType(
        [
            StructField("key", StringType()),
            StructField("old", StringType()),
            StructField("new", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("cursor", StringType()),
        ]
    )
    starts = [kafkakv.Cursor(dict.fromkeys(range(2), 0)), *(c.cursor for c in changes)]
    for since in starts:
        told = []  # by a feed of each partition alone (a row's cursor is its partition's)
        with kafkakv.connect(target) as db:
            for p in range(2):
                m = db.map("m", value_codec="str", shard=[p])
                own = kafkakv.Cursor({p: since[p]}, {p: since.skip(p)})
                with m.changes(since=own, timeout=0) as feed:
                    told += [(c.key, c.old, c.new, p, c.offset, str(c.cursor)) for c in feed]
        text = {"target": target, "map": "m", "value_codec": "str", "startingOffsets": str(since)}
        rows = _read_all(KafkaKVStreamReader(StreamOptions.from_options(text), schema))
        assert [tuple(r.values()) for r in rows] == told, since
    assert any(skip for since in starts for skip in map(since.skip, since))  # inside a record


def test_a_task_fails_with_the_stall_or_the_loss_that_stops_its_changes(
    tmp_path: Path,
) -> None:
    target = str(tmp_path / "log")
    name = "test_streaming.set"
    functions.register(name)(lambda key, old, value: value)
    try:
        with kafkakv.connect(target) as db:
            m = db.map("m", value_codec="str")
            m["a"] = "1"
            m.compute("a", name, "2")
            m["b"] = "3"
            stalled_at = m.cursor()[0] - 2
            n = db.map("n", value_codec="str")
            n["a"] = "1"
            end = n.cursor()[0]
    finally:
        functions.unregister(name)  # a task in a process that lacks the function
    schema = StructType([StructField("key", StringType()), StructField("new", StringType())])
    options = {"target": target, "map": "m", "value_codec": "str", "startingOffsets": "0:0"}
    reader = KafkaKVStreamReader(StreamOptions.from_options(options), schema)
    with pytest.raises(PartitionStalledError) as stalled:
        _read_all(reader)
    assert (stalled.value.partition, stalled.value.offset) == (0, stalled_at)
    assert stalled.value.function == name
    # A micro-batch planned past the end of the log (one it lost since): no rows, an error.
    reader = KafkaKVStreamReader(StreamOptions.from_options({**options, "map": "n"}), schema)
    start, beyond = (offset_of(kafkakv.Cursor({0: o})) for o in (0, end + 5))
    (task,) = reader.partitions(start, beyond)
    with pytest.raises(DataLossError, match=f"reached ops offset {end}, short of {end + 5}"):
        list(reader.read(task))


def test_a_snapshot_micro_batch_holds_the_contents_at_its_end_offset(tmp_path: Path) -> None:
    target = str(tmp_path / "log")
    fields = [StructField(name, StringType()) for name in ("key", "new", "cursor")]
    options = {"target": target, "map": "m", "startingOffsets": "earliest"}
    reader = KafkaKVStreamReader(StreamOptions.from_options(options), StructType(fields))

    def snapshot(end: int) -> list[tuple[str, str, str]]:
        (task,) = reader.partitions(SNAPSHOT, offset_of(kafkakv.Cursor({0: end})))
        rows = [row for batch in reader.read(task) for row in batch.to_pylist()]
        return sorted((r["key"], r["new"], r["cursor"]) for r in rows)

    with kafkakv.connect(target) as db:
        m = db.map("m")
        m.update({"a": 1, "b": 2})
        end = m.cursor()[0]
        m.update({"a": 10, "c": 3})  # after the planner noted the end: not in the snapshot
        del m["b"]
        assert snapshot(end) == [("a", "1", f"0:{end}"), ("b", "2", f"0:{end}")]
        m.flush()  # the state at `end` is gone: the snapshot is the one after the flush
        m.sync()
        after = m.flushed_offsets()[0] + 1
        assert after > end and snapshot(end) == [
            ("a", "10", f"0:{after}"),
            ("c", "3", f"0:{after}"),
        ]


def test_changes_a_flush_overtook_come_as_their_net_effect(spark: Any, tmp_path: Path) -> None:
    target, checkpoint = str(tmp_path / "log"), tmp_path / "checkpoint"
    with kafkakv.connect(target) as db:
        a = db.map("a", partitions=2)
        db.map("b", partitions=2).close()
        a.update({f"k{i}": i for i in range(6)})
        ends = [db.log.end_offset("a_ops", p) for p in range(2)]
    _doubled(spark, target, "a", "b", checkpoint)  # micro-batch 0 ends at `ends`
    with kafkakv.connect(target) as db:
        a = db.map("a")
        a["k0"] = 10
        del a["k1"]
        a.put_all({"k2": 20, "k6": 6})  # a batch: its keys are in its op
        a["k6"] = 60
        a.flush()  # the states between `ends` and here are gone
        a.sync()  # (its FLUSHED marks applied here too)
        assert any(f >= e for f, e in zip(a.flushed_offsets().values(), ends, strict=True))
        a["k3"] = 30  # after the flush: told exactly
        expected = _expected(dict(a.items()))
    rows = _collect(
        _changes(spark, target, "a", json.dumps(offset_of(_cursor(ends)))), tmp_path / "c"
    )
    net = sorted((r["key"], r["new"]) for r in rows if r["offset"] is None)
    assert net == [("k0", "10"), ("k1", None), ("k2", "20"), ("k6", "60")]
    assert all(r["old"] is None for r in rows if r["offset"] is None)
    assert [(r["key"], r["old"], r["new"]) for r in rows if r["offset"] is not None] == [
        ("k3", "3", "30")
    ]
    _doubled(spark, target, "a", "b", checkpoint)  # the query goes on past the flush
    assert _contents(target, "b") == expected


def _cursor(ends: list[int]) -> kafkakv.Cursor:
    return kafkakv.Cursor(dict(enumerate(ends)))


def test_a_micro_batch_run_again_leaves_the_map_as_if_it_ran_once(
    spark: Any, tmp_path: Path
) -> None:
    target, checkpoint = str(tmp_path / "log"), tmp_path / "checkpoint"
    with kafkakv.connect(target) as db:
        a = db.map("a")
        db.map("b").close()  # a sink map must exist (its partitions are the writer's)
        a.update({"k1": 1, "k2": 2, "k3": 3})
        a["k1"] = 10
        del a["k2"]
        expected = _expected(dict(a.items()))
    _doubled(spark, target, "a", "b", checkpoint)
    assert _contents(target, "b") == expected
    query = json.loads((checkpoint / "metadata").read_text())["id"]
    assert _ledger(target) == {query: 0}  # the sink noted the micro-batch it committed
    ops = _ops_end(target, "b")

    _uncommit(checkpoint, 0)  # as if the query died after the sink's commit, before Spark's
    _doubled(spark, target, "a", "b", checkpoint)
    assert (checkpoint / "commits" / "0").exists()  # Spark ran micro-batch 0 again...
    assert _ops_end(target, "b") == ops  # ... and the sink skipped it: the ledger had it
    assert _contents(target, "b") == expected

    _uncommit(checkpoint, 0)  # as if the query died after its tasks wrote, before any commit
    with kafkakv.connect(target) as db:
        db.map(LEDGER_MAP, value_codec="int").remove_all([query])
    _doubled(spark, target, "a", "b", checkpoint)
    assert _ops_end(target, "b") > ops  # appended again: the same final value of each key
    assert _contents(target, "b") == expected
    assert _ledger(target) == {query: 0}


def _uncommit(checkpoint: Path, batch: int) -> None:
    for name in (str(batch), f".{batch}.crc"):
        (checkpoint / "commits" / name).unlink()


def _ledger(target: str) -> dict[str, int]:
    with kafkakv.connect(target) as db:
        return dict(db.map(LEDGER_MAP, value_codec="int").items())


def _ops_end(target: str, name: str) -> int:
    with kafkakv.connect(target) as db:
        return db.log.end_offset(f"{name}_ops", 0)


def test_bad_options_are_refused_with_a_typed_error(spark: Any, tmp_path: Path) -> None:
    target = str(tmp_path / "log")
    with kafkakv.connect(target) as db:
        db.map("m", partitions=2)["a"] = 1
    with pytest.raises(ConfigError, match="needs option startingOffsets"):
        StreamOptions.from_options({"target": target, "map": "m"})
    with pytest.raises(ConfigError, match="startingOffsets='soon'"):
        StreamOptions.from_options({"target": target, "map": "m", "startingOffsets": "soon"})
    with pytest.raises(ConfigError, match="no '\\+k'"):
        StreamOptions.from_options({"target": target, "topic": "t", "startingOffsets": "0:1+1"})
    with pytest.raises(CursorError, match="not a kafkakv stream offset"):
        cursor_of({"offsets": 3})
    assert cursor_of(SNAPSHOT) is None
    with pytest.raises(PySparkException, match=r"ConfigError.*startingOffsets"):
        _changes(spark, target, "m", "soon")
    user_schema = StructType([StructField(c, StringType()) for c in ("key", "new")])
    with pytest.raises(ConfigError, match="needs option startingOffsets"):
        KafkaKVDataSource({"target": target, "map": "m"}).streamReader(user_schema)
    for starting, error, why in (
        ("0:0", CursorError, "names partitions"),
        ("0:9,1:0", CursorError, "past the end"),
        ("latest", UnknownTopicError, "does not exist"),
    ):
        name = "absent" if error is UnknownTopicError else "m"
        options = {"target": target, "map": name, "startingOffsets": starting}
        with pytest.raises(error, match=why):  # when the query starts
            KafkaKVDataSource(options).streamReader(user_schema).initialOffset()
    with pytest.raises(ConfigError, match="outputMode"):
        KafkaKVDataSource({"target": target, "map": "m"}).streamWriter(user_schema, True)


_CHILD = textwrap.dedent(
    """
    import sys
    from pyspark.sql import functions as F
    from kafkakv.dev.spark import light_jvm_config
    from kafkakv.pipeline import spark_session

    target, checkpoint, scratch = sys.argv[1], sys.argv[2], sys.argv[3]
    spark = spark_session(  # its scratch space in the test's directory: nothing outlives it
        app_name="kafkakv-stream-kill-test",
        config={"spark.local.dir": scratch, **light_jvm_config()},
    )
    rows = spark.readStream.format("kafkakv").options(
        target=target, map="a", startingOffsets="earliest"
    ).load()
    out = rows.where(F.col("key") != "skip").select(
        "key", (F.col("new").cast("int") * 2).cast("string").alias("value")
    )
    query = out.writeStream.format("kafkakv").options(target=target, map="b").option(
        "checkpointLocation", checkpoint
    ).start()  # micro-batch after micro-batch, until it is killed
    query.awaitTermination()
    """
)


@pytest.mark.slow
def test_a_query_killed_mid_stream_goes_on_from_its_checkpoint(spark: Any, tmp_path: Path) -> None:
    target, checkpoint = str(tmp_path / "log"), tmp_path / "checkpoint"
    with kafkakv.connect(target) as db:
        a = db.map("a", partitions=2, flush_period=50)  # flushes overtake the stream too
        db.map("b", partitions=2).close()
        a.update({f"k{i}": i for i in range(10)})
        with (tmp_path / "child.log").open("w") as log:
            child = subprocess.Popen(
                [sys.executable, "-c", _CHILD, target, str(checkpoint), str(tmp_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its JVM and Python workers die with it
            )
        changed = 0

        def alive() -> bool:
            assert child.poll() is None, f"the query's process ended: see {tmp_path}/child.log"
            return True

        def change_and_look() -> bool:
            """One more change of A per look, until the query, past its first two
            micro-batches, has planned one that it has not committed yet."""
            nonlocal changed
            alive()
            a[f"k{changed % 12}"] = changed
            changed += 1
            done, planned = (_batches(checkpoint / d) for d in ("commits", "offsets"))
            return done >= 2 and planned > done

        try:
            working = _Working(child.pid)  # a new JVM: minutes on a loaded machine, at work
            while not (alive() and _batches(checkpoint / "commits")):
                working.check("micro-batch 0")
                time.sleep(0.2)
            wait_for(change_and_look, 120, "a micro-batch under way", interval=0.02)
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        a["skip"] = 1
        del a["k3"]
        a["k4"] = -4
        expected = _expected(dict(a.items()))
    _doubled(spark, target, "a", "b", checkpoint)  # the restart, from the checkpoint
    assert _contents(target, "b") == expected


class _Working:
    """Whether the processes of session ``sid`` (a child started with a session of its own,
    its JVM and Python workers with it) are at work: :meth:`check` fails once they have used
    no CPU for ``idle`` seconds. A wait on a query's first micro-batch ends on the event, however
    long a starved machine takes to start a JVM, and a stuck query still fails, within
    ``idle`` seconds of its last tick (a fixed 120 s failed a query that was only slow, beside
    `stress-ng`)."""

    def __init__(self, sid: int, idle: float = 30.0) -> None:
        self.sid, self.idle = sid, idle
        self.ticks, self.since = self._ticks(), time.monotonic()

    def _ticks(self) -> int:
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if int(fields[3]) == self.sid:  # session id (field 6 of stat)
                total += int(fields[11]) + int(fields[12])  # utime + stime
        return total

    def check(self, what: str) -> None:
        ticks, now = self._ticks(), time.monotonic()
        if ticks != self.ticks:
            self.ticks, self.since = ticks, now
        elif now - self.since > self.idle:
            raise AssertionError(f"waiting for {what}: the query used no CPU for {self.idle} s")


def _batches(log: Path) -> int:
    """How many micro-batches a checkpoint's offsets or commits log holds."""
    return sum(p.name.isdigit() for p in log.iterdir()) if log.is_dir() else 0
