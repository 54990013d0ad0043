"""Ingest a PostgreSQL table into a map or a directory topic with Spark, incrementally.

The *timestamp+incrementing* mode of a JDBC source connector: every run reads the rows
strictly after the last ``(timestamp, id)`` it saw, in that order, and only rows older than a
safety delay (a row whose transaction is still open may carry an earlier timestamp than rows
already committed; the delay gives it time to commit before the position passes it). Each row
becomes a key and a JSON value (:class:`~kafkakv.pipeline.mapping.TableMapping`); an inactive
row deletes its key.

The position is a value in the map ``kafkakv-ingest`` on the target log itself, keyed by the
job's name, written once the run's rows are appended: it is as durable as the data, and a run
that fails before then is repeated by the next one (puts and deletes are idempotent). A run
that finds no new row appends nothing.

Steps and their cost: two small queries on PostgreSQL, for the bound and then for the last
position before it (and the id range that splits the read over Spark tasks); one JDBC read of
the rows up to that position, written as they stream (counted on the way, with Spark's
``Observation``); and one append per log partition and Arrow batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafkakv.db import Database
from kafkakv.errors import ConfigError, TopicMismatchError
from kafkakv.map.replica import ReplicaMap
from kafkakv.map.topics import ensure_topics
from kafkakv.pipeline.jdbc import Position, TableSource
from kafkakv.pipeline.mapping import TableMapping
from kafkakv.pipeline.options import SourceOptions
from kafkakv.pipeline.session import spark_action

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["POSITIONS_MAP", "IngestJob", "IngestResult", "Position"]

POSITIONS_MAP = "kafkakv-ingest"
"""The map, on the target log, holding every ingest job's position."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class IngestResult:
    """What one run did. ``rows`` counts every row read (``deletes`` of them inactive)."""

    job: str
    rows: int
    deletes: int
    before: Position | None
    after: Position | None
    seconds: float


@dataclass
class IngestJob:
    """Incremental ingest of ``source`` into ``target`` (a map, or a plain topic that
    directories read).

    ``timestamp_column`` and ``id_column`` order the rows (the id breaks ties between equal
    timestamps; both should be indexed together). ``delay``: seconds a row must be old before
    it is read. ``partitions``: for the target's topics when they are created. ``name``: the
    job's position key (default ``<table> -> <target>``).
    """

    spark: SparkSession
    source: TableSource
    target: SourceOptions
    mapping: TableMapping
    timestamp_column: str
    id_column: str
    delay: float = 0.0
    partitions: int | None = None
    name: str | None = None
    progress: Progress = field(default=lambda _line: None)

    def __post_init__(self) -> None:
        if self.delay < 0:
            raise ConfigError(f"delay must be >= 0 seconds, not {self.delay!r}")
        if self.target.value_codec != "json":
            raise ConfigError(
                f"ingest writes JSON values; {self.target.what} has value codec "
                f"{self.target.value_codec!r}"
            )
        if self.target.key_codec not in ("str", "int"):
            raise ConfigError(f"ingest writes str or int keys, not {self.target.key_codec!r}")

    @property
    def job(self) -> str:
        return self.name or f"{self.source.table} -> {self.target.what}"

    def position(self) -> Position | None:
        """The stored position of this job (None before its first run)."""
        with self.target.connect() as db:
            return self._stored(self._positions(db))

    def _positions(self, db: Database) -> ReplicaMap[str, Any]:
        return db.map(POSITIONS_MAP, timeout=self.target.timeout)

    def _stored(self, positions: ReplicaMap[str, Any]) -> Position | None:
        stored = positions.get(self.job)
        return None if stored is None else Position.from_json(stored)

    def run(self) -> IngestResult:
        """Read the new rows and append them; return what was done.

        Raises :class:`~kafkakv.errors.PipelineError` when PostgreSQL cannot be reached or
        refuses a query, or Spark fails (a missing JDBC driver among others);
        :class:`~kafkakv.errors.ConfigError` for a missing table or column; and the log's
        errors for the target.
        """
        started = time.monotonic()
        source, mapping = self.source, self.mapping
        columns = source.columns()
        mapping.check(columns)
        for needed in (self.timestamp_column, self.id_column):
            if needed not in columns:
                raise ConfigError(f"table {source.table} has no column {needed!r}")
        with self.target.connect() as db:  # one connection: target, position, new position
            self._prepare_target(db)
            positions = self._positions(db)
            before = self._stored(positions)
            return self._run(started, positions, before)

    def _run(
        self, started: float, positions: ReplicaMap[str, Any], before: Position | None
    ) -> IngestResult:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        source, mapping = self.source, self.mapping
        bound = source.now_minus(self.delay)
        self.progress(
            f"looking for {source.table} rows after {before or 'the start'} and before {bound}"
        )
        found = source.read_incremental(
            self.spark, self.timestamp_column, self.id_column, before, bound
        )
        if found is None:
            self.progress("no new rows: nothing written")
            return IngestResult(self.job, 0, 0, before, before, time.monotonic() - started)
        df, last = found
        self.progress(f"reading {source.table} rows up to {last}, the last before {bound}")
        # One pass: the rows written and the deletes among them are counted on the way.
        observed = Observation(f"kafkakv-ingest-{id(self)}")
        key_type = "bigint" if self.target.key_codec == "int" else "string"
        inactive = (
            F.count_if(F.col(mapping.active_column) == F.lit(False))
            if mapping.active_column
            else F.lit(0)
        )
        watched = df.observe(
            observed,
            F.count(F.lit(1)).alias("rows"),
            inactive.alias("deletes"),
        )
        self.progress(f"writing the new rows of {source.table} to {self.target.what}")
        # The values are to_json's text, JSON by construction: the writer need not parse them.
        options = {**self.target.to_options(), "check_json": "false"}
        spark_action(
            lambda: (
                mapping.apply(watched, key_type)
                .select("key", "value")
                .write.format("kafkakv")
                .options(**options)
                .mode("append")
                .save()
            ),
            f"writing {source.table} to {self.target.what}",
            self.spark,
        )
        summary = observed.get
        rows, deletes = summary["rows"], summary["deletes"]
        if not rows:  # the rows went between the query and the read (deleted meanwhile)
            self.progress("no new rows: nothing written")
            return IngestResult(self.job, 0, 0, before, before, time.monotonic() - started)
        self.progress(f"wrote {rows} rows ({deletes} deletes)")
        positions[self.job] = last.to_json()
        self.progress(f"position now {last.timestamp} / {last.id}")
        return IngestResult(self.job, rows, deletes, before, last, time.monotonic() - started)

    def _prepare_target(self, db: Database) -> None:
        """Create the target's topics if missing (a map's three, or a compacted topic), or
        check that an existing topic is compacted."""
        target = self.target
        if target.map is not None:
            ensure_topics(db.log, target.map_topics, self.partitions)
            return
        topic = str(target.topic)
        if topic not in db.log.topics():
            db.log.create_topic(topic, self.partitions or 1, {"cleanup.policy": "compact"})
            self.progress(f"created compacted topic {topic!r}")
            return
        policy = db.log.topic_config(topic).get("cleanup.policy", "")
        if "compact" not in policy.split(","):
            raise TopicMismatchError(
                f"topic {topic!r} has cleanup.policy={policy}: a directory topic must be "
                "compacted, or deleted keys come back"
            )
