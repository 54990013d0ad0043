"""A local Spark session set up for kafkakv's jobs.

:func:`spark_session` starts (or returns the running) Spark session in local mode with what
every kafkakv job needs: Python workers on this interpreter (so they import kafkakv and
pyarrow from the same environment), the driver bound to 127.0.0.1, no web UI, UTC as the
session time zone (timestamps in JSON values do not depend on the machine), few shuffle
partitions (a 2-core machine), the PostgreSQL JDBC driver on the class path when given, and
the ``kafkakv`` data source registered. Starting a JVM costs a few seconds: start one session
and reuse it.

**Threads.** PySpark gives each Python thread its own JVM thread, and Spark's writer looks a
Python data source up in the *active* session of that JVM thread, which a new thread does not
have (``[DATA_SOURCE_NOT_FOUND] Failed to find the data source: kafkakv``). :func:`activate`
makes a session the active one of the calling thread; every kafkakv job runs its Spark work
through :func:`spark_action`, which does that first, and :func:`spark_session` does it for the
thread that calls it. Code of your own that writes with ``df.write.format("kafkakv")`` in a
thread calls one of these in that thread first.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafkakv.errors import ConfigError, PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["activate", "spark_action", "spark_session"]

_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Sessions the kafkakv data source is registered on."""


def spark_session(
    *,
    master: str = "local[2]",
    app_name: str = "kafkakv",
    jars: Iterable[str | os.PathLike[str]] = (),
    config: Mapping[str, str] | None = None,
    log_level: str = "WARN",
) -> SparkSession:
    """Start a Spark session for kafkakv's jobs (or return the running one, registering the
    data source on it), active in the calling thread (see :func:`activate`).

    ``jars``: jar files for the driver and executors (the JDBC driver:
    :func:`kafkakv.pipeline.jdbc_driver.postgres_jdbc_jar`). ``config``: more Spark settings,
    which win over these defaults. Raises :class:`~kafkakv.errors.ConfigError` when PySpark is not
    installed or a jar is missing.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ConfigError("the Spark pipeline needs PySpark: pip install 'kafkakv[spark]'") from exc
    from kafkakv.pipeline.source import KafkaKVDataSource

    paths = [Path(j) for j in jars]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ConfigError(f"jar files not found: {', '.join(missing)}")
    # The JVM starts Python workers with $PYSPARK_PYTHON: make it this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {
        "spark.pyspark.python": sys.executable,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.memory": "2g",
    }
    if paths:
        settings["spark.jars"] = ",".join(str(p.resolve()) for p in paths)
    settings.update(config or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    if spark not in _REGISTERED:  # registering again makes Spark warn about a replacement
        spark.dataSource.register(KafkaKVDataSource)
        _REGISTERED.add(spark)
    return activate(spark)


def activate(spark: SparkSession) -> SparkSession:
    """Make ``spark`` the active session of the calling thread and return it: Spark finds the
    ``kafkakv`` data source (registered on the session) from this thread. One call to the
    JVM; the thread keeps it until another session is made active there.
    """
    from pyspark.sql import SparkSession

    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a stopped session has none; Spark raises on its use anyway
    SparkSession._get_j_spark_session_class(jvm).setActiveSession(spark._jsparkSession)
    return spark


def spark_action(call: Callable[[], Any], doing: str, spark: SparkSession | None = None) -> Any:
    """Run a Spark action; its JVM or Python-worker failure becomes a PipelineError.

    ``spark``: the session the action runs on, made active in the calling thread first
    (:func:`activate`), so the action finds the ``kafkakv`` data source from any thread.
    """
    if spark is not None:
        activate(spark)
    try:
        return call()
    except Exception as exc:
        if isinstance(exc, PipelineError):
            raise
        module = type(exc).__module__
        if module.startswith(("pyspark", "py4j")):
            raise PipelineError(f"Spark failed {doing}: {_explain(exc)}") from exc
        raise


def _explain(exc: BaseException) -> str:
    text = str(exc).strip()
    if "ClassNotFoundException" in text and "postgresql" in text.lower():
        return (
            "the PostgreSQL JDBC driver is not on Spark's class path: start the session with "
            "spark_session(jars=[postgres_jdbc_jar()])"
        )
    lines = text.splitlines()
    ours = [line for line in lines if "kafkakv.errors." in line]
    if ours:  # a kafkakv error raised in a Python worker: its own message says it best
        return ours[-1].strip()[:500]
    for line in lines:
        if "Error:" in line or "Exception:" in line:
            return line.strip()[:500]
    return text.splitlines()[0][:500] if text else type(exc).__name__
