"""Export a snapshot of a map or topic to files Spark and other tools read (Parquet by default).

The snapshot is the data source's read (see :mod:`kafkakv.pipeline.source`): one Spark task
per log partition, each holding every update that completed before the job started.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafkakv.errors import ConfigError
from kafkakv.pipeline.options import SourceOptions
from kafkakv.pipeline.session import spark_action

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SnapshotResult", "read_snapshot", "snapshot"]

FORMATS = ("parquet", "orc", "json", "delta")


@dataclass(frozen=True)
class SnapshotResult:
    """``rows``: the rows at ``path`` once written (with mode ``append``, earlier ones too)."""

    path: str
    format: str
    rows: int
    seconds: float


def read_snapshot(
    spark: SparkSession, source: SourceOptions, schema: str | None = None
) -> DataFrame:
    """A lazy DataFrame of ``source``'s snapshot (columns key, value, partition, offset, or
    ``schema``'s)."""
    reader = spark.read.format("kafkakv").options(**source.to_options())
    if schema is not None:
        reader = reader.schema(schema)
    return spark_action(reader.load, f"reading {source.what}", spark)  # type: ignore[no-any-return]


def snapshot(
    spark: SparkSession,
    source: SourceOptions,
    path: str | os.PathLike[str],
    *,
    file_format: str = "parquet",
    mode: str = "overwrite",
    schema: str | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> SnapshotResult:
    """Write ``source``'s snapshot to ``path`` and return how many rows ``path`` holds.

    ``file_format``: ``parquet``, ``orc``, ``json``, or ``delta`` (needs the delta-spark
    package configured on the session). ``mode``: Spark's save mode (``overwrite`` replaces an
    earlier snapshot at ``path``). Costs one read of every log partition and one write; the
    row count comes from the written files. Raises the data source's errors as
    :class:`~kafkakv.errors.PipelineError`.
    """
    if file_format not in FORMATS:
        raise ConfigError(f"snapshot format {file_format!r}: choose one of {', '.join(FORMATS)}")
    started = time.monotonic()
    target = os.fspath(path)
    progress(f"reading a snapshot of {source.what} from {source.target}")
    df = read_snapshot(spark, source, schema)
    spark_action(
        lambda: df.write.format(file_format).mode(mode).save(target),
        f"writing the snapshot of {source.what} to {target}",
        spark,
    )
    rows = spark_action(
        lambda: spark.read.format(file_format).load(target).count(),
        f"counting the rows of {target}",
        spark,
    )
    progress(f"wrote {rows} rows to {target} ({file_format})")
    return SnapshotResult(target, file_format, int(rows), time.monotonic() - started)
