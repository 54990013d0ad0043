"""How rows of a relational table become keys and JSON values, as Spark column expressions.

A row's key is one unique column, as a string (or a ``bigint`` for maps with ``int`` keys); its
value is the JSON object of the chosen columns, with names kept or turned from snake_case to
camelCase, timestamps and dates as text in one format, and nulls kept as ``null``. A row whose
*active column* is false deletes its key instead (a null value). Everything runs in Spark's
JVM (``date_format``, ``to_json``): no Python per row.

>>> camel("terminal_id"), camel("is_active"), camel("already"), camel("_x_y")
('terminalId', 'isActive', 'already', '_xY')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafkakv.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["TableMapping", "camel"]

DOC = "doc"
"""The mapped frame's struct column: the value before it is written as JSON text."""


def camel(name: str) -> str:
    """``snake_case`` to ``camelCase`` (leading underscores kept)."""
    stripped = name.lstrip("_")
    head, *rest = stripped.split("_")
    return name[: len(name) - len(stripped)] + head + "".join(p[:1].upper() + p[1:] for p in rest)


@dataclass(frozen=True)
class TableMapping:
    """``key``: the unique column whose value is the key. ``columns``: those in the value
    (default: all, in table order). ``camel_case``: rename snake_case columns. ``timestamp_format``
    and ``date_format``: Spark datetime patterns for timestamp and date columns (in the
    session's time zone, UTC with :func:`~kafkakv.pipeline.spark_session`). ``active_column``: a
    boolean column; rows where it is false delete their key (null counts as active).
    """

    key: str
    columns: tuple[str, ...] | None = None
    camel_case: bool = False
    timestamp_format: str = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"
    date_format: str = "yyyy-MM-dd"
    active_column: str | None = None

    def required_columns(self) -> list[str]:
        """Every table column the mapping reads."""
        wanted = [self.key, *(self.columns or ())]
        if self.active_column:
            wanted.append(self.active_column)
        return list(dict.fromkeys(wanted))

    def check(self, table_columns: Sequence[str]) -> None:
        """Raise :class:`~kafkakv.errors.ConfigError` naming the columns the table lacks."""
        missing = [c for c in self.required_columns() if c not in table_columns]
        if missing:
            raise ConfigError(
                f"the table has no column {', '.join(missing)} (it has {', '.join(table_columns)})"
            )

    def apply(self, df: DataFrame, key_type: str = "string") -> DataFrame:
        """``df`` as columns ``key``, :data:`DOC` (the value as a struct, null for an inactive
        row) and ``value`` (its JSON text)."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import DateType, TimestampNTZType, TimestampType

        self.check(df.columns)
        types = {f.name: f.dataType for f in df.schema.fields}
        fields: list[Column] = []
        for name in self.columns or [c for c in df.columns if not c.startswith("__kafkakv")]:
            column = F.col(name)
            if isinstance(types[name], TimestampType | TimestampNTZType):
                column = F.date_format(column, self.timestamp_format)
            elif isinstance(types[name], DateType):
                column = F.date_format(column, self.date_format)
            fields.append(column.alias(camel(name) if self.camel_case else name))
        doc = F.struct(*fields)
        if self.active_column:
            doc = F.when(F.col(self.active_column) == F.lit(False), F.lit(None)).otherwise(doc)
        return df.select(
            F.col(self.key).cast(key_type).alias("key"),
            doc.alias(DOC),
        ).withColumn("value", F.to_json(F.col(DOC), {"ignoreNullFields": "false"}))

    def __post_init__(self) -> None:
        if not self.key:
            raise ConfigError("a table mapping needs a key column")
        if self.columns is not None and not self.columns:
            raise ConfigError("columns, when given, must name at least one column")
