"""Where a PostgreSQL server is: URLs, libpq and JDBC strings, and the error of a server that
cannot be reached. No server runs here (tests/dev/test_postgres.py starts one)."""

from __future__ import annotations

import socket

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from kafkakv.errors import ConfigError, PipelineError
from kafkakv.pipeline.postgres import POSTGRES_URL_ENV, PostgresConnection, postgres_from_env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql://app:s3cret@db.example.com:6543/sales",
            PostgresConnection("db.example.com", 6543, "sales", "app", "s3cret"),
        ),
        (
            "postgres://app@127.0.0.1/kafkakv",
            PostgresConnection("127.0.0.1", 5432, "kafkakv", "app"),
        ),
        (
            "postgresql://a%40b:p%2Fw%20d@[::1]:5433/my%20db",
            PostgresConnection("::1", 5433, "my db", "a@b", "p/w d"),
        ),
    ],
)
def test_from_url_parses(url: str, expected: PostgresConnection) -> None:
    assert PostgresConnection.from_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "mysql://app:pw@host:3306/db",
        "postgresql://app:pw@host:port/db",
        "postgresql://app:pw@host:99999/db",
        "postgresql://app:pw@host:5432",
        "postgresql://app:pw@host:5432/",
        "postgresql://app:pw@host:5432/db/extra",
        "postgresql://:pw@host:5432/db",
        "postgresql://app:pw@:5432/db",
        "postgresql://app:pw@host:5432/db?sslmode=require",
        "host=127.0.0.1 dbname=kafkakv",
        "",
    ],
)
def test_from_url_rejects(url: str) -> None:
    with pytest.raises(ConfigError) as raised:
        PostgresConnection.from_url(url)
    assert "pw@" not in str(raised.value)  # the password is hidden


def test_conninfo_quotes_what_libpq_must_see_quoted() -> None:
    plain = PostgresConnection(port=6000)
    assert plain.conninfo == "host=127.0.0.1 port=6000 dbname=kafkakv user=kafkakv"
    odd = PostgresConnection("::1", 5433, "my db", "o'brien", "p\\w d'")
    assert conninfo_to_dict(odd.conninfo) == {
        "host": "::1",
        "port": "5433",
        "dbname": "my db",
        "user": "o'brien",
        "password": "p\\w d'",
    }
    assert odd.jdbc_url == "jdbc:postgresql://[::1]:5433/my%20db"
    assert "p\\w" not in repr(odd)


def test_bad_fields_are_refused() -> None:
    with pytest.raises(ConfigError):
        PostgresConnection(port=0)
    with pytest.raises(ConfigError):
        PostgresConnection(database="")


def test_connecting_where_nothing_listens_raises_pipeline_error() -> None:
    port = _free_port()
    with pytest.raises(PipelineError, match=f"127.0.0.1:{port}") as raised:
        PostgresConnection(port=port).connect()
    assert isinstance(raised.value.__cause__, psycopg.OperationalError)


def test_postgres_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POSTGRES_URL_ENV, raising=False)
    assert postgres_from_env() is None
    monkeypatch.setenv(POSTGRES_URL_ENV, "  ")
    assert postgres_from_env() is None
    monkeypatch.setenv(POSTGRES_URL_ENV, "postgresql://etl:pw@pg.internal:5432/warehouse")
    assert postgres_from_env() == PostgresConnection("pg.internal", 5432, "warehouse", "etl", "pw")
    monkeypatch.setenv(POSTGRES_URL_ENV, "pg.internal:5432")
    with pytest.raises(ConfigError):
        postgres_from_env()
