"""Where a PostgreSQL server is, for the pipeline's jobs: :class:`PostgresConnection` says where
it listens and who logs in, as a psycopg connection string, a JDBC URL and JDBC properties;
:func:`postgres_from_env` names a server from ``$KAFKAKV_POSTGRES_URL``.

Starting a server is no business of the database: the throwaway server that the demo, the
tests and the benchmarks run is :class:`kafkakv.dev.postgres.EmbeddedPostgres`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

from kafkakv.errors import ConfigError, PipelineError

if TYPE_CHECKING:
    import psycopg
    from psycopg.rows import TupleRow

__all__ = ["POSTGRES_URL_ENV", "PostgresConnection", "postgres_from_env"]

POSTGRES_URL_ENV = "KAFKAKV_POSTGRES_URL"
"""The environment variable naming a server: ``postgresql://user:pass@host:port/db``."""

_INSTALL_HINT = "pip install 'kafkakv[spark]'"
_CONNECT_TIMEOUT_S = 10
_URL_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True)
class PostgresConnection:
    """Where a PostgreSQL server listens and who to log in as.

    Plain data: building one and reading its strings does no I/O, and it pickles, so Spark
    can ship it to executors; :meth:`connect` opens a connection. The password is left out
    of ``repr``. Raises :class:`~kafkakv.errors.ConfigError` for an empty host, database or
    user, or a port outside 1-65535.

    >>> c = PostgresConnection(port=15432)
    >>> c.jdbc_url
    'jdbc:postgresql://127.0.0.1:15432/kafkakv'
    >>> c.conninfo
    'host=127.0.0.1 port=15432 dbname=kafkakv user=kafkakv'
    >>> PostgresConnection.from_url("postgresql://me:s3cret@db.local/sales").password
    's3cret'
    """

    host: str = "127.0.0.1"
    port: int = 5432
    database: str = "kafkakv"
    user: str = "kafkakv"
    password: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        for name in ("host", "database", "user"):
            if not getattr(self, name):
                raise ConfigError(f"a PostgreSQL connection needs a {name}")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise ConfigError(f"a PostgreSQL port is an int, not {self.port!r}")
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"PostgreSQL port {self.port} is outside 1-65535")

    @classmethod
    def from_url(cls, url: str) -> PostgresConnection:
        """Parse ``postgresql://user:password@host:port/database`` (or ``postgres://``).

        The password and the port (default 5432) may be left out; ``%``-escapes are decoded.
        Raises :class:`~kafkakv.errors.ConfigError` for another scheme, a missing user, host
        or database, a bad port, query parameters or a fragment (the message hides the
        password).
        """
        shown = _hide_password(url)
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"not a PostgreSQL URL: {shown}: {exc}") from exc
        if parts.scheme not in _URL_SCHEMES:
            raise ConfigError(
                f"not a PostgreSQL URL: {shown}: expected postgresql://user:password@host:port/db"
            )
        database = unquote(parts.path.removeprefix("/"))
        missing = [
            name
            for name, value in (("user", parts.username), ("host", parts.hostname))
            if not value
        ]
        if not database or "/" in parts.path.removeprefix("/"):
            missing.append("database")
        if missing:
            raise ConfigError(f"PostgreSQL URL {shown} has no {' or '.join(missing)}")
        if parts.query or parts.fragment:
            raise ConfigError(f"PostgreSQL URL {shown}: query parameters are not supported")
        return cls(
            host=parts.hostname or "",
            port=5432 if port is None else port,
            database=database,
            user=unquote(parts.username or ""),
            password=unquote(parts.password or ""),
        )

    @property
    def address(self) -> str:
        """``host:port`` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def jdbc_url(self) -> str:
        """``jdbc:postgresql://host:port/database``, for Spark's ``DataFrame.write.jdbc``."""
        return f"jdbc:postgresql://{self.address}/{quote(self.database, safe='')}"

    @property
    def jdbc_properties(self) -> dict[str, str]:
        """``user``, ``password`` and ``driver`` (``org.postgresql.Driver``), for Spark's JDBC."""
        return {"user": self.user, "password": self.password, "driver": "org.postgresql.Driver"}

    @property
    def conninfo(self) -> str:
        """A libpq connection string for psycopg; the password only when one is set."""
        pairs = [
            ("host", self.host),
            ("port", str(self.port)),
            ("dbname", self.database),
            ("user", self.user),
        ]
        if self.password:
            pairs.append(("password", self.password))
        return " ".join(f"{key}={_conninfo_value(value)}" for key, value in pairs)

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[TupleRow]:
        """Open a psycopg connection (one TCP handshake and login; gives up after 10 s).

        The caller closes it (``with conn:`` commits or rolls back, then closes). Raises
        :class:`~kafkakv.errors.ConfigError` when psycopg is not installed and
        :class:`~kafkakv.errors.PipelineError` when the server cannot be reached or refuses
        the login; the message names ``host:port``.
        """
        try:
            import psycopg
        except ImportError as exc:
            raise ConfigError(f"connecting to PostgreSQL needs psycopg: {_INSTALL_HINT}") from exc
        try:
            return psycopg.connect(
                self.conninfo, autocommit=autocommit, connect_timeout=_CONNECT_TIMEOUT_S
            )
        except psycopg.OperationalError as exc:
            raise PipelineError(
                f"cannot connect to PostgreSQL at {self.address} (database {self.database!r}, "
                f"user {self.user!r}): {str(exc).strip()}"
            ) from exc


def postgres_from_env() -> PostgresConnection | None:
    """The server named by ``$KAFKAKV_POSTGRES_URL``, when set (and not blank).

    No I/O beyond reading the variable. Raises :class:`~kafkakv.errors.ConfigError` when it
    is not a PostgreSQL URL (see :meth:`PostgresConnection.from_url`).
    """
    url = os.environ.get(POSTGRES_URL_ENV, "").strip()
    return PostgresConnection.from_url(url) if url else None


def _conninfo_value(value: str) -> str:
    """``value`` as libpq reads it: quoted (``\\`` before ``'`` and ``\\``) when it must be."""
    if value and not set(value) & set(" \t\n\r'\\"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _hide_password(url: str) -> str:
    """``url`` with the password, if any, replaced by ``***``."""
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)
