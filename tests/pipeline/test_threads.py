"""kafkakv's Spark jobs from threads other than the one that started the session.

PySpark gives each Python thread its own JVM thread, which has no active Spark session until
something makes one active; Spark looks Python data sources up in the active session
(``DATA_SOURCE_NOT_FOUND`` without one). Schedulers and servers run jobs in threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pyspark.sql import functions as F

import kafkakv
from kafkakv.pipeline import (
    IngestJob,
    PostgresConnection,
    SourceOptions,
    TableMapping,
    TableSource,
    snapshot,
    spark_session,
)
from tests.pipeline_fixtures import unique_table

T = TypeVar("T")


def _in_a_thread(call: Callable[[], T]) -> T:
    """``call()``'s result, run in a new thread (its exception raised here)."""
    out: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


def test_ingest_and_snapshot_run_in_other_threads(
    spark: Any, postgres: PostgresConnection, tmp_path: Any
) -> None:
    table = unique_table("threads")
    with postgres.connect() as conn:
        conn.execute(
            f"CREATE TABLE {table} (id bigserial PRIMARY KEY, k text NOT NULL, "
            "updated_at timestamptz NOT NULL)"
        )
        conn.execute(
            f"INSERT INTO {table} (k, updated_at) SELECT 'k' || g, now() - interval '1 hour' "
            "+ g * interval '1 ms' FROM generate_series(1, 20) g"
        )
    target = SourceOptions(str(tmp_path / "log"), map="m")
    mapping = TableMapping(key="k")
    job = IngestJob(
        spark, TableSource(postgres, table), target, mapping, "updated_at", "id", partitions=2
    )
    assert _in_a_thread(job.run).rows == 20
    result = _in_a_thread(lambda: snapshot(spark, target, tmp_path / "out"))
    assert result.rows == 20


def test_the_data_source_writes_and_reads_in_a_thread_that_asked_for_the_session(
    spark: Any, tmp_path: Any
) -> None:
    target = str(tmp_path / "log")
    with kafkakv.connect(target) as db:
        db.map("m", partitions=2)

    def write_and_read() -> int:
        session = spark_session()  # the running session, made active in this thread
        df = session.range(3).select(  # (createDataFrame would make it active as well)
            F.col("id").cast("string").alias("key"), F.lit("1").alias("value")
        )
        df.write.format("kafkakv").options(target=target, map="m").mode("append").save()
        return int(session.read.format("kafkakv").options(target=target, map="m").load().count())

    assert _in_a_thread(write_and_read) == 3
