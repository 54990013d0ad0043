"""Pytest plugin: a local Spark session and a PostgreSQL server for the pipeline tests
(registered in conftest.py).

Both fixtures are session-scoped and start on first use, so a run without pipeline tests
starts neither:

- ``spark``: :func:`kafkakv.pipeline.spark_session` in ``local[2]`` mode with the PostgreSQL
  JDBC driver (:func:`kafkakv.pipeline.postgres_jdbc_jar`) and the ``kafkakv`` data source.
- ``spark_cluster``: a Spark standalone cluster (:class:`kafkakv.dev.spark.SparkCluster`: a
  master and two single-core workers on 127.0.0.1, killed with this process). Only one Spark
  context runs per process, beside ``spark``'s: tests drive the cluster from a child process.
- ``postgres``: the :class:`~kafkakv.pipeline.PostgresConnection` of a private server
  (:class:`kafkakv.dev.postgres.EmbeddedPostgres`), or of the system server
  ``$KAFKAKV_POSTGRES_URL`` names.

A part that cannot start FAILS the tests that use it, with the reason (never skips). Tests
that use ``spark`` get the ``spark`` marker (``-m "not spark"`` leaves them out).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from kafkakv.errors import KafkaKVError
from tests.parallel import release_after_last_use

if TYPE_CHECKING:
    from kafkakv.pipeline import PostgresConnection

__all__ = ["postgres", "spark", "spark_cluster", "terminal_table", "unique_table"]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from kafkakv.dev.spark import light_jvm_config
    from kafkakv.pipeline import spark_session
    from kafkakv.pipeline.jdbc_driver import postgres_jdbc_jar

    try:  # the JVM flags of short jobs (see LIGHT_JVM_OPTIONS)
        session = spark_session(
            app_name="kafkakv-tests", jars=[postgres_jdbc_jar()], config=light_jvm_config()
        )
    except KafkaKVError as exc:
        pytest.fail(f"the Spark session could not start: {exc}", pytrace=False)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    from kafkakv.dev.spark import SparkCluster

    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), die_with_parent=True)
    release_after_last_use(request, cluster.close)
    try:
        cluster.start()
    except KafkaKVError as exc:
        pytest.fail(f"the Spark cluster could not start: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    from kafkakv.dev.postgres import EmbeddedPostgres
    from kafkakv.pipeline import postgres_from_env

    configured = postgres_from_env()
    if configured is not None:
        yield configured
        return
    # Not under pytest's basetemp: run as root, the server runs as an unprivileged user that
    # must traverse to its data, and every pytest session that starts on the machine resets
    # /tmp/pytest-of-<user> to mode 700 (a server there dies at its next checkpoint).
    home = tempfile.mkdtemp(prefix="kafkakv-test-postgres-")
    server = EmbeddedPostgres(os.path.join(home, "data"), die_with_parent=True)
    try:
        connection = server.start()
    except KafkaKVError as exc:
        server.close()
        shutil.rmtree(home, ignore_errors=True)
        pytest.fail(f"PostgreSQL could not start: {exc}", pytrace=False)
    try:
        yield connection
    finally:
        server.close()
        shutil.rmtree(home, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the Spark session or cluster with ``spark``."""
    for item in items:
        if {"spark", "spark_cluster"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)


def unique_table(prefix: str = "t") -> str:
    """A table name unique to the test."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def terminal_table(postgres: PostgresConnection, rows: int, *, age: str = "1 hour") -> str:
    """A new terminal_acquirer table with ``rows`` rows (``terminal_id`` ``T1``... unique,
    ``id`` the same number, every row active), timestamps ``age`` ago and 1 ms apart; its
    name."""
    name = unique_table("terminal_acquirer")
    with postgres.connect() as conn:
        conn.execute(
            f"""CREATE TABLE {name} (
                id bigserial PRIMARY KEY,
                terminal_id text NOT NULL UNIQUE,
                acquirer_id text NOT NULL,
                mcc int,
                is_active boolean NOT NULL DEFAULT true,
                updated_at timestamptz NOT NULL)"""
        )
        conn.execute(
            f"""INSERT INTO {name} (terminal_id, acquirer_id, mcc, updated_at)
                SELECT 'T' || g, 'A' || (g % 3), 5000 + g,
                       now() - interval '{age}' + g * interval '1 ms'
                FROM generate_series(1, {rows}) g"""
        )
    return name
