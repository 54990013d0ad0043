"""A PostgreSQL table as Spark reads it through JDBC, and the few queries the jobs ask first.

Spark's JDBC source does the bulk read (split over tasks by id range when the id is an
integer); psycopg asks the small questions before it (the table's columns, the database's
clock, the id range), so that a missing table or column is a clear error before any Spark job
starts, and a run with nothing new costs one query instead of a Spark job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from kafkakv.errors import ConfigError, PipelineError
from kafkakv.pipeline.postgres import PostgresConnection
from kafkakv.pipeline.session import spark_action

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["TS_MICROS", "Position", "TableSource", "quote_ident"]

TS_MICROS = "__kafkakv_us"
"""Extra column of an incremental read: the row's timestamp as PostgreSQL's microseconds since
1970-01-01 00:00 (the instant of a ``timestamptz``, the wall-clock time of a ``timestamp`` read
as if in UTC). A number orders the rows as PostgreSQL does and gives the position exactly,
whatever the zones of Spark's session and JVM (which Spark's own timestamps pass through),
and it costs less than text per row."""

_EPOCH = datetime(1970, 1, 1)

_SPLIT_MIN_ROWS = 50_000
"""Below this id span one JDBC task reads everything."""


@dataclass(frozen=True)
class Position:
    """The last ``(timestamp, id)`` ingested: the timestamp as text PostgreSQL parses back
    exactly (see :meth:`at_micros`), the id as a number or text."""

    timestamp: str
    id: int | str

    @classmethod
    def at_micros(cls, micros: int, id: int | str) -> Position:
        """The position of a row whose timestamp is :data:`TS_MICROS` ``micros``: its text is
        that wall-clock time in UTC with a ``+00:00`` offset, which a ``timestamptz`` takes as
        the instant and a ``timestamp`` as the wall-clock time (it ignores an offset).

        >>> Position.at_micros(1_774_751_400_123_456, 7).timestamp
        '2026-03-29 02:30:00.123456+00:00'
        """
        try:
            at = _EPOCH + timedelta(microseconds=micros)
        except OverflowError:
            raise PipelineError(
                f"an ingest timestamp {micros} µs from 1970 is outside years 1 to 9999"
            ) from None
        return cls(f"{at:%Y-%m-%d %H:%M:%S.%f}+00:00", id)

    def __str__(self) -> str:
        return f"({self.timestamp}, {self.id})"

    def to_json(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp, "id": self.id}

    @classmethod
    def from_json(cls, value: Any) -> Position:
        if not isinstance(value, dict) or not isinstance(value.get("timestamp"), str):
            raise PipelineError(f"a stored ingest position is damaged: {value!r}")
        return cls(value["timestamp"], value["id"])


def quote_ident(name: str) -> str:
    """A PostgreSQL identifier, quoted; ``schema.table`` quotes each part.

    >>> quote_ident('public.terminal_acquirer'), quote_ident('we"ird')
    ('"public"."terminal_acquirer"', '"we""ird"')
    """
    if not name or any(not part for part in name.split(".")):
        raise ConfigError(f"not a table or column name: {name!r}")
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def _literal(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"an ingest position id is an int or str, not {value!r}")
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class TableSource:
    """``table`` (optionally ``schema.table``) on the server ``connection`` names.
    ``fetch_size``: rows per JDBC round trip."""

    connection: PostgresConnection
    table: str
    fetch_size: int = 10_000

    def _run(
        self, sql: str, params: tuple[Any, ...] = ()
    ) -> tuple[list[tuple[Any, ...]], list[str]]:
        """One statement: its rows and column names. A missing table is a ConfigError; any
        other refusal (no privilege, a bad column) a PipelineError."""
        import psycopg

        with self.connection.connect() as conn, conn.cursor() as cur:
            try:
                cur.execute(sql.encode(), params)
            except psycopg.errors.UndefinedTable as exc:
                raise ConfigError(
                    f"table {self.table} does not exist in database "
                    f"{self.connection.database!r} on {self.connection.address}"
                ) from exc
            except psycopg.Error as exc:
                raise PipelineError(f"PostgreSQL refused a query on {self.table}: {exc}") from exc
            if cur.description is None:
                return [], []
            return list(cur.fetchall()), [d.name for d in cur.description]

    def columns(self) -> list[str]:
        """The table's column names, in order (one query)."""
        return self._run(f"SELECT * FROM {quote_ident(self.table)} LIMIT 0")[1]

    def now_minus(self, delay: float) -> str:
        """The database's clock minus ``delay`` seconds, as ``timestamptz`` text."""
        rows, _ = self._run("SELECT (now() - make_interval(secs => %s))::text", (delay,))
        return str(rows[0][0])

    def _incremental_sql(self, ts: str, ident: str, after: Position | None, bound: str) -> str:
        t, i = quote_ident(ts), quote_ident(ident)
        where = f"src.{t} < {_literal(bound)}::timestamptz"
        if after is not None:
            at = _literal(after.timestamp)
            where += f" AND (src.{t} > {at} OR (src.{t} = {at} AND src.{i} > {_literal(after.id)}))"
        micros = f"(extract(epoch FROM src.{t}) * 1000000)::bigint"
        return (
            f"SELECT src.*, {micros} AS {quote_ident(TS_MICROS)} "
            f"FROM {quote_ident(self.table)} src WHERE {where}"
        )

    def read_incremental(
        self,
        spark: SparkSession,
        ts: str,
        ident: str,
        after: Position | None,
        bound: str,
    ) -> DataFrame | None:
        """The rows after ``after`` and before ``bound`` (None when there are none: one
        query tells). Lazy: Spark reads when an action runs."""
        sql = self._incremental_sql(ts, ident, after, bound)
        rows, _ = self._run(
            f"SELECT min(q.{quote_ident(ident)}), max(q.{quote_ident(ident)}), "
            f"bool_or(true) FROM ({sql}) q"
        )
        low, high, any_row = rows[0]
        if not any_row:
            return None
        split = None
        if isinstance(low, int) and isinstance(high, int) and high - low >= _SPLIT_MIN_ROWS:
            split = (ident, low, high)
        return self._read(spark, f"({sql}) AS kafkakv_src", split)

    def read_all(self, spark: SparkSession) -> DataFrame:
        """Every row of the table (lazy)."""
        return self._read(spark, quote_ident(self.table), None)

    def _read(
        self, spark: SparkSession, dbtable: str, split: tuple[str, int, int] | None
    ) -> DataFrame:
        reader = spark.read.format("jdbc").option("url", self.connection.jdbc_url)
        for key, value in self.connection.jdbc_properties.items():
            reader = reader.option(key, value)
        reader = reader.option("dbtable", dbtable).option("fetchsize", str(self.fetch_size))
        if split is not None:
            column, low, high = split
            reader = (
                reader.option("partitionColumn", column)
                .option("lowerBound", str(low))
                .option("upperBound", str(high + 1))
                .option("numPartitions", str(spark.sparkContext.defaultParallelism))
            )
        # Spark asks the database for the columns here: a missing driver fails already.
        return spark_action(  # type: ignore[no-any-return]
            reader.load, f"reading {self.table} through JDBC", spark
        )
