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

__all__ = ["Position", "TableSource", "quote_ident"]

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
        """The position of a row whose timestamp is ``micros`` microseconds after 1970-01-01
        00:00 by PostgreSQL's ``extract(epoch ...)`` (the instant of a ``timestamptz``, the
        wall-clock time of a ``timestamp`` or ``date`` read as if in UTC): its text is that
        wall-clock time in UTC with a ``+00:00`` offset, which a ``timestamptz`` takes as the
        instant and a ``timestamp`` as the wall-clock time (it ignores an offset). Exact
        whatever the zones of Spark and its JVM, which Spark's own timestamps pass through.

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


def _beyond(ts: str, ident: str, op: str, position: Position) -> str:
    """SQL comparing a row's ``(ts, ident)`` (quoted names) with ``position`` by ``op``, as
    PostgreSQL compares rows: the timestamp first, the id among equal timestamps (one
    condition, which an index on ``(ts, ident)`` serves)."""
    return f"(src.{ts}, src.{ident}) {op} ({_literal(position.timestamp)}, {_literal(position.id)})"


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

    def read_incremental(
        self,
        spark: SparkSession,
        ts: str,
        ident: str,
        after: Position | None,
        bound: str,
    ) -> tuple[DataFrame, Position] | None:
        """The rows after ``after`` and before ``bound``, and the last of them: None when
        there are none.

        One query finds the last ``(ts, ident)`` before ``bound`` (and the id range that
        splits the read over tasks); the DataFrame (lazy: Spark reads when an action runs)
        holds the rows up to that position and no further. So the position a run reaches is
        PostgreSQL's own, exact to the microsecond, and a row committed after the query with
        a later position waits for the next run instead of being read twice.
        """
        t, i = quote_ident(ts), quote_ident(ident)
        table = quote_ident(self.table)
        after_sql = "" if after is None else f" AND {_beyond(t, i, '>', after)}"
        window = f"FROM {table} src WHERE src.{t} < {_literal(bound)}::timestamptz{after_sql}"
        found, _ = self._run(
            f"SELECT (extract(epoch FROM last.{t}) * 1000000)::bigint, last.{i}, ids.low, "
            f"ids.high FROM (SELECT src.{t}, src.{i} {window} "
            f"ORDER BY src.{t} DESC, src.{i} DESC LIMIT 1) last, "
            f"(SELECT min(src.{i}) AS low, max(src.{i}) AS high {window}) ids"
        )
        if not found:
            return None
        micros, last_id, low, high = found[0]
        last = Position.at_micros(micros, last_id if isinstance(last_id, int) else str(last_id))
        sql = f"SELECT src.* FROM {table} src WHERE {_beyond(t, i, '<=', last)}{after_sql}"
        split = None
        if isinstance(low, int) and isinstance(high, int) and high - low >= _SPLIT_MIN_ROWS:
            split = (ident, low, high)
        return self._read(spark, f"({sql}) AS kafkakv_src", split), last

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
