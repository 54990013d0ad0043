"""Incremental ingest of a real PostgreSQL table with Spark into maps and directory topics,
then snapshots and reconciliation, on both logs."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pyarrow.parquet as pq
import pytest

import kafkakv
from kafkakv.errors import ConfigError, PipelineError, TopicMismatchError
from kafkakv.pipeline import (
    IngestJob,
    PostgresConnection,
    SourceOptions,
    TableMapping,
    TableSource,
    reconcile,
    snapshot,
)
from kafkakv.pipeline.ingest import POSITIONS_MAP
from tests.pipeline_fixtures import terminal_table

MAPPING = TableMapping(key="terminal_id", camel_case=True, active_column="is_active")


def _sql(postgres: PostgresConnection, *statements: str) -> None:
    with postgres.connect() as conn:
        for statement in statements:
            conn.execute(statement)


def _job(
    spark: Any, postgres: PostgresConnection, table: str, target: SourceOptions, **kw: Any
) -> IngestJob:
    return IngestJob(
        spark,
        TableSource(postgres, table),
        target,
        kw.pop("mapping", MAPPING),
        timestamp_column="updated_at",
        id_column="id",
        **kw,
    )


def _ops_ends(target: SourceOptions) -> list[int]:
    with target.connect() as db:
        ops = target.map_topics.ops
        return [db.log.end_offset(ops, p) for p in range(db.log.partitions(ops))]


def test_ingest_into_a_map_is_incremental_and_survives_restarts(
    spark: Any, postgres: PostgresConnection, target: str, name: str
) -> None:
    table = terminal_table(postgres, 30)
    opts = SourceOptions(target, map=name)
    first = _job(spark, postgres, table, opts, partitions=2).run()
    assert (first.rows, first.deletes, first.before) == (30, 0, None)
    assert first.after is not None and first.after.id == 30
    with kafkakv.connect(target) as db:
        m = db.map(name)
        assert len(m) == 30
        t7 = m["T7"]
        assert t7["terminalId"] == "T7" and t7["acquirerId"] == "A1" and t7["isActive"] is True
        assert t7["mcc"] == 5007 and t7["id"] == 7
        assert t7["updatedAt"].endswith("Z") and "T" in t7["updatedAt"]  # ISO-8601, UTC
    ends = _ops_ends(opts)

    again = _job(spark, postgres, table, opts).run()  # nothing changed: nothing written
    assert (again.rows, again.after) == (0, first.after)
    assert _ops_ends(opts) == ends

    _sql(
        postgres,
        f"UPDATE {table} SET acquirer_id = 'NEW', updated_at = now() - interval '1 s' WHERE terminal_id = 'T1'",
        f"UPDATE {table} SET is_active = false, updated_at = now() - interval '1 s' WHERE terminal_id = 'T2'",
        f"INSERT INTO {table} (terminal_id, acquirer_id, updated_at) VALUES ('T99', 'A9', now() - interval '1 s')",
    )
    restarted = _job(spark, postgres, table, opts)  # a new job object: position from the log
    assert restarted.position() == first.after
    third = restarted.run()
    assert (third.rows, third.deletes) == (3, 1)
    with kafkakv.connect(target) as db:
        m = db.map(name)
        assert m["T1"]["acquirerId"] == "NEW"
        assert "T2" not in m
        assert m["T99"]["acquirerId"] == "A9" and m["T99"]["mcc"] is None  # nulls kept
        assert len(m) == 30
        assert db.map(POSITIONS_MAP)[third.job]["id"] == third.after.id  # type: ignore[union-attr]

    report = reconcile(spark, TableSource(postgres, table), MAPPING, opts)
    assert report.matches, report
    assert (report.table_rows, report.target_rows) == (30, 30)


def test_ingest_into_a_directory_topic_then_reconcile_finds_every_kind_of_difference(
    spark: Any, postgres: PostgresConnection, target: str, name: str
) -> None:
    table = terminal_table(postgres, 12)
    opts = SourceOptions(target, topic=name)
    result = _job(spark, postgres, table, opts, partitions=3).run()
    assert result.rows == 12
    with kafkakv.connect(target) as db:
        assert db.log.topic_config(name)["cleanup.policy"] == "compact"
        directory = db.directory(name)
        assert len(directory) == 12 and directory["T3"]["acquirerId"] == "A0"
    source = TableSource(postgres, table)
    assert reconcile(spark, source, MAPPING, opts).matches

    # Change the table behind the directory's back: a new row, a changed row, a deactivated row.
    _sql(
        postgres,
        f"INSERT INTO {table} (terminal_id, acquirer_id, updated_at) VALUES ('T50', 'A5', now())",
        f"UPDATE {table} SET mcc = 1 WHERE terminal_id = 'T4'",
        f"UPDATE {table} SET is_active = false WHERE terminal_id = 'T5'",
    )
    report = reconcile(spark, source, MAPPING, opts, samples=5)
    assert not report.matches
    assert (report.missing, report.extra, report.different) == (1, 1, 1)
    assert report.samples == {"missing": ["T50"], "extra": ["T5"], "different": ["T4"]}
    assert "they differ (1 missing, 1 extra, 1 different)" in report.summary()


def test_rows_with_equal_timestamps_are_ordered_by_id(
    spark: Any, postgres: PostgresConnection, tmp_path: Any
) -> None:
    table = terminal_table(postgres, 0)
    _sql(
        postgres,
        f"INSERT INTO {table} (terminal_id, acquirer_id, updated_at) "
        f"SELECT 'T' || g, 'A', date_trunc('second', now()) - interval '1 minute' "
        f"FROM generate_series(1, 3) g",
    )
    opts = SourceOptions(str(tmp_path / "log"), map="m")
    assert _job(spark, postgres, table, opts).run().rows == 3
    # A row committed later with the same timestamp and a higher id is still picked up.
    _sql(
        postgres,
        f"INSERT INTO {table} (terminal_id, acquirer_id, updated_at) "
        f"VALUES ('T4', 'A', date_trunc('second', now()) - interval '1 minute')",
    )
    fourth = _job(spark, postgres, table, opts).run()
    assert fourth.rows == 1 and fourth.after is not None and fourth.after.id == 4


def test_a_read_stops_at_the_position_its_query_found(
    spark: Any, postgres: PostgresConnection
) -> None:
    """The rows a run reads end at the last position PostgreSQL gave before the read: a row
    committed between that query and Spark's read, later but before the bound, is left
    for the next run, which starts right after the position (read once, not twice)."""
    table = terminal_table(postgres, 3, age="2 hours")
    source = TableSource(postgres, table)
    bound = source.now_minus(0)
    found = source.read_incremental(spark, "updated_at", "id", None, bound)
    assert found is not None
    df, last = found
    _sql(
        postgres,
        f"INSERT INTO {table} (terminal_id, acquirer_id, updated_at) "
        "VALUES ('late', 'A', now() - interval '1 hour')",
    )
    assert sorted(r.terminal_id for r in df.collect()) == ["T1", "T2", "T3"]
    assert last.id == 3
    nxt = source.read_incremental(spark, "updated_at", "id", last, source.now_minus(0))
    assert nxt is not None
    assert [r.terminal_id for r in nxt[0].collect()] == ["late"]
    assert nxt[1].id == 4


@pytest.mark.parametrize(
    ("column_type", "step"),
    [("timestamp", "1 microsecond"), ("timestamptz", "1 microsecond"), ("date", "1 day")],
)
def test_the_position_is_exact_to_the_microsecond_whatever_spark_s_time_zone(
    spark: Any, postgres: PostgresConnection, tmp_path: Any, column_type: str, step: str
) -> None:
    """The position's text parses back into the column's type exactly: a row at the very
    same time with a higher id is read next, one a ``step`` earlier never, with
    Spark's session in a zone neither the JVM nor PostgreSQL is in (and a wall-clock time
    that zone's own clocks skipped)."""
    table = f"exact_{column_type}_{uuid.uuid4().hex[:8]}"
    at = "2026-03-29 02:30:00.123456"  # Europe/Berlin's clocks went from 02:00 to 03:00
    _sql(
        postgres,
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, k text, updated_at {column_type})",
        f"INSERT INTO {table} SELECT g, 'k' || g, '{at}' FROM generate_series(1, 3) g",
    )
    opts = SourceOptions(str(tmp_path / "log"), map="m")
    mapping = TableMapping(key="k")
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Europe/Berlin")
    try:
        first = _job(spark, postgres, table, opts, mapping=mapping).run()
        assert (first.rows, first.after.id if first.after else None) == (3, 3)
        _sql(
            postgres,
            f"INSERT INTO {table} VALUES (4, 'k4', '{at}'), "
            f"(5, 'k5', timestamp '{at}' - interval '{step}')",
        )
        second = _job(spark, postgres, table, opts, mapping=mapping).run()
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert (second.rows, second.after.id if second.after else None) == (1, 4), second
    with kafkakv.connect(opts.target) as db:
        assert sorted(db.map("m")) == ["k1", "k2", "k3", "k4"]


def test_the_safety_delay_holds_back_recent_rows(
    spark: Any, postgres: PostgresConnection, tmp_path: Any
) -> None:
    table = terminal_table(postgres, 5, age="2 hours")
    _sql(
        postgres,
        f"INSERT INTO {table} (terminal_id, acquirer_id, updated_at) VALUES ('new', 'A', now())",
    )
    opts = SourceOptions(str(tmp_path / "log"), map="m")
    held = _job(spark, postgres, table, opts, delay=600).run()
    assert held.rows == 5  # the row of a moment ago waits for the delay
    with kafkakv.connect(opts.target) as db:
        assert "new" not in db.map("m")
    assert _job(spark, postgres, table, opts, delay=0).run().rows == 1


def test_int_keys_and_chosen_columns(
    spark: Any, postgres: PostgresConnection, tmp_path: Any
) -> None:
    table = terminal_table(postgres, 4)
    mapping = TableMapping(
        key="id", columns=("terminal_id", "updated_at"), timestamp_format="yyyy-MM-dd"
    )
    opts = SourceOptions(str(tmp_path / "log"), map="by_id", key_codec="int")
    assert _job(spark, postgres, table, opts, mapping=mapping).run().rows == 4
    with kafkakv.connect(opts.target) as db:
        m = db.map("by_id", key_codec="int")
        assert sorted(m) == [1, 2, 3, 4]
        assert set(m[2]) == {"terminal_id", "updated_at"}
        assert len(m[2]["updated_at"]) == 10  # the date alone


def test_snapshot_to_parquet_holds_the_map(
    spark: Any, target: str, name: str, tmp_path: Any
) -> None:
    with kafkakv.connect(target) as db:
        m = db.map(name, partitions=2, flush_period=64)
        for i in range(200):
            m[f"k{i}"] = {"i": i}
        del m["k0"]
    result = snapshot(spark, SourceOptions(target, map=name), tmp_path / "out")
    assert result.rows == 199
    table = pq.read_table(tmp_path / "out")
    assert table.num_rows == 199
    got = dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))
    assert got["k5"] == '{"i":5}' and "k0" not in got


def test_a_snapshot_of_a_missing_map_is_a_clear_error(spark: Any, tmp_path: Any) -> None:
    target = str(tmp_path / "log")
    with pytest.raises(PipelineError, match="map 'ghost' does not exist"):
        snapshot(spark, SourceOptions(target, map="ghost"), tmp_path / "out")
    assert not list(tmp_path.glob("out/*.parquet"))  # no file was written


def test_clear_errors_for_a_missing_table_column_or_server(
    spark: Any, postgres: PostgresConnection, tmp_path: Any
) -> None:
    opts = SourceOptions(str(tmp_path / "log"), map="m")
    with pytest.raises(ConfigError, match="does not exist"):
        _job(spark, postgres, "no_such_table", opts).run()
    table = terminal_table(postgres, 1)
    with pytest.raises(ConfigError, match="no column 'changed_at'"):
        IngestJob(spark, TableSource(postgres, table), opts, MAPPING, "changed_at", "id").run()
    with pytest.raises(ConfigError, match="no column nope"):
        _job(spark, postgres, table, opts, mapping=TableMapping(key="nope")).run()
    with kafkakv.connect(opts.target) as db:
        assert db.log.topics() == []  # nothing was created for a job that could not start
    nowhere = PostgresConnection(port=1)
    with pytest.raises(PipelineError, match=re.escape("127.0.0.1:1")):
        _job(spark, nowhere, table, opts).run()


def test_a_directory_topic_that_is_not_compacted_is_refused(
    spark: Any, postgres: PostgresConnection, tmp_path: Any
) -> None:
    target = str(tmp_path / "log")
    with kafkakv.connect(target) as db:
        db.log.create_topic("plain", 1, {"cleanup.policy": "delete"})
    table = terminal_table(postgres, 1)
    with pytest.raises(TopicMismatchError, match="must be compacted"):
        _job(spark, postgres, table, SourceOptions(target, topic="plain")).run()


def test_a_missing_jdbc_driver_is_a_clear_pipeline_error(
    postgres: PostgresConnection, tmp_path: Any
) -> None:
    """A Spark session of its own (another JVM, light: see LIGHT_JVM_OPTIONS) started
    without the driver jar."""
    table = terminal_table(postgres, 1)
    script = textwrap.dedent(
        f"""
        from kafkakv.dev.spark import light_jvm_config
        from kafkakv.errors import PipelineError
        from kafkakv.pipeline import *
        spark = spark_session(app_name="no-driver", config=light_jvm_config())
        conn = PostgresConnection.from_url({_url(postgres)!r})
        job = IngestJob(spark, TableSource(conn, {table!r}),
                        SourceOptions({str(tmp_path / "log")!r}, map="m"),
                        TableMapping(key="terminal_id"), "updated_at", "id")
        try:
            job.run()
        except PipelineError as exc:
            print("PIPELINE-ERROR", exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert "PIPELINE-ERROR" in done.stdout, done.stderr[-3000:]
    assert "JDBC driver is not on Spark's class path" in done.stdout


def _url(conn: PostgresConnection) -> str:
    password = f":{conn.password}" if conn.password else ""
    return f"postgresql://{conn.user}{password}@{conn.host}:{conn.port}/{conn.database}"
