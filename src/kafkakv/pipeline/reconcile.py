"""Compare a table with the map or directory topic fed from it: keys missing, extra, different.

The table side is every active row, mapped as ingest maps it
(:class:`~kafkakv.pipeline.mapping.TableMapping`); the target side is the data source's
snapshot. Values are compared as JSON objects of the table's columns, not as text: the
target's JSON is parsed with the schema of the mapped row, so member order, number spelling
or members the table lacks do not count as differences. One full outer join in Spark does
the comparison; the report holds counts and a few keys of each kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kafkakv.pipeline.jdbc import TableSource
from kafkakv.pipeline.mapping import DOC, TableMapping
from kafkakv.pipeline.options import SourceOptions
from kafkakv.pipeline.session import spark_action
from kafkakv.pipeline.snapshot import read_snapshot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ReconcileReport", "reconcile"]

KINDS = ("missing", "extra", "different")


@dataclass(frozen=True)
class ReconcileReport:
    """``missing``: keys of the table the target lacks; ``extra``: keys of the target the table
    lacks (or holds inactive); ``different``: keys on both sides whose values differ.
    ``samples`` holds up to the asked number of keys of each kind, sorted."""

    table_rows: int
    target_rows: int
    missing: int
    extra: int
    different: int
    samples: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def matches(self) -> bool:
        return not (self.missing or self.extra or self.different)

    def summary(self) -> str:
        verdict = "match" if self.matches else "differ"
        return (
            f"{self.table_rows} active rows, {self.target_rows} keys: they {verdict} "
            f"({self.missing} missing, {self.extra} extra, {self.different} different)"
        )


def reconcile(
    spark: SparkSession,
    source: TableSource,
    mapping: TableMapping,
    target: SourceOptions,
    *,
    samples: int = 10,
    progress: Callable[[str], None] = lambda _line: None,
) -> ReconcileReport:
    """Compare ``source`` (mapped by ``mapping``) with ``target``; see the module docstring.

    Costs one JDBC read of the table, one snapshot read of the target and a join. Raises
    :class:`~kafkakv.errors.ConfigError` for a missing table or column,
    :class:`~kafkakv.errors.UnknownTopicError` for a missing target and
    :class:`~kafkakv.errors.PipelineError` when Spark fails.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    started = time.monotonic()
    mapping.check(source.columns())
    key_type = "bigint" if target.key_codec == "int" else "string"
    table = mapping.apply(source.read_all(spark), key_type).where(F.col(DOC).isNotNull())
    doc_type = table.schema[DOC].dataType
    assert isinstance(doc_type, StructType)
    theirs = read_snapshot(spark, target).select(
        F.col("key").alias("t_key"), F.from_json(F.col("value"), doc_type).alias("t_doc")
    )
    progress(f"comparing {source.table} with {target.what}")
    joined = table.join(theirs, table["key"] == theirs["t_key"], "full_outer").select(
        F.coalesce(F.col("key"), F.col("t_key")).cast("string").alias("k"),
        F.when(F.col("t_key").isNull(), "missing")
        .when(F.col("key").isNull(), "extra")
        .when(~F.col(DOC).eqNullSafe(F.col("t_doc")), "different")
        .alias("kind"),
        F.col("key").isNotNull().alias("in_table"),
        F.col("t_key").isNotNull().alias("in_target"),
    )
    joined = joined.persist()
    try:
        counts = spark_action(
            lambda: joined.agg(
                F.count_if("in_table").alias("table_rows"),
                F.count_if("in_target").alias("target_rows"),
                *(F.count_if(F.col("kind") == kind).alias(kind) for kind in KINDS),
            ).first(),
            f"comparing {source.table} with {target.what}",
            spark,
        )
        found: dict[str, list[str]] = {}
        for kind in KINDS:
            if samples and counts[kind]:
                rows = joined.where(F.col("kind") == kind).orderBy("k").limit(samples).collect()
                found[kind] = [row["k"] for row in rows]
    finally:
        joined.unpersist()
    report = ReconcileReport(
        table_rows=counts["table_rows"],
        target_rows=counts["target_rows"],
        missing=counts["missing"],
        extra=counts["extra"],
        different=counts["different"],
        samples=found,
        seconds=time.monotonic() - started,
    )
    progress(report.summary())
    return report
